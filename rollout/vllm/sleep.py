"""vLLM's own sleep mode for the colocated layout (rollout.layout=colocated; the contract: rollout/sleep.py):
`LLM(enable_sleep_mode=True)`, then `LLM.sleep(level)` frees the engine's GPU memory (level 1: weights to
pinned host memory, KV cache dropped; level 2: both dropped) and `LLM.wake_up(tags)` brings back "weights"
and "kv_cache" separately, weights first so that a sync can load into them. CUDA only
(`current_platform.is_sleep_mode_available()`): the config refuses the layout for vLLM engines on CPU
(jobs/config/gpu_layout.py) and `check_available` says so again where an engine starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rollout.sleep import WAKE_TAGS, EngineAsleep, check_sleep_args


def sleep_kwargs(enabled: bool) -> dict[str, Any]:
    """The LLM constructor's sleep-mode argument (none when the layout is separate)."""
    return {"enable_sleep_mode": True} if enabled else {}


def check_available(current_platform: Any) -> None:
    """RuntimeError unless vLLM's platform (`vllm.platforms.current_platform`, passed in by the engine: only
    rollout/vllm/engine.py imports vllm) has a sleep mode (CUDA, ROCm, XPU in vLLM 0.32)."""
    if not current_platform.is_sleep_mode_available():
        raise RuntimeError(
            "rollout.layout=colocated: vLLM's sleep mode is not available on this platform "
            f"({type(current_platform).__name__}); colocated vLLM engines need CUDA"
        )


def _free_bytes() -> int:
    """Free device memory (every process's allocations count, so it sees what the engine core released)."""
    return int(torch.cuda.mem_get_info()[0]) if torch.cuda.is_available() else 0


class VllmSleep:
    """An LLM's sleep and wake calls, counted, with the device memory each freed or took back."""

    def __init__(self, llm: Any):
        self.llm = llm
        self.level = 0
        self.asleep_tags: set[str] = set()
        self.sleeps = 0
        self.wakes = 0

    def sleep(self, level: int) -> dict[str, float]:
        check_sleep_args(level)
        before = _free_bytes()
        self.llm.sleep(level=level)
        self.level, self.asleep_tags = level, set(WAKE_TAGS)
        self.sleeps += 1
        return {"freed_bytes": float(_free_bytes() - before), "sleeps": float(self.sleeps)}

    def wake_up(self, tags: Sequence[str] = WAKE_TAGS) -> dict[str, float]:
        check_sleep_args(tags=tags)
        wanted = [t for t in tags if t in self.asleep_tags]
        before = _free_bytes()
        if wanted:
            self.llm.wake_up(tags=wanted)
        self.asleep_tags -= set(wanted)
        if "kv_cache" in wanted:
            self.llm.reset_prefix_cache()  # the KV cache's contents were dropped with its memory
        if not self.asleep_tags and self.level:
            self.level = 0
            self.wakes += 1
        return {"restored_bytes": float(before - _free_bytes()), "wakes": float(self.wakes)}

    def check_awake(self, what: str) -> None:
        if self.asleep_tags:
            raise EngineAsleep(f"engine: {what} while asleep ({sorted(self.asleep_tags)} released); "
                               "wake_up first")
