"""Engine sleep mode for the colocated layout (rollout.layout=colocated), where an engine gives its memory to
the learner on the same GPU during the update and takes it back after. Shaped after vLLM's
`LLM.sleep(level)` / `wake_up(tags)` (vLLM's own on CUDA: rollout/vllm/sleep.py):

- level 1: weights move to host memory, the KV cache is dropped; waking "weights" brings the same weights
  back;
- level 2: weights and KV cache are dropped; waking "weights" gives storage whose contents must be re-sent;
- tags: "weights", "kv_cache" (the two parts a wake may bring back separately: weights first, so the sync can
  load into them, then the KV cache).

`WeightStash` does this for real on a torch module (the hf engine): every parameter's storage is released
while asleep (a level-1 copy is kept on the host) and rebuilt on wake. The hf engine holds no KV cache
between calls (transformers' generate builds one per call), so its "kv_cache" tag has nothing to release.
Calls are counted.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

SLEEP_LEVELS = (1, 2)
WAKE_TAGS = ("weights", "kv_cache")


class EngineAsleep(RuntimeError):
    """A call that needs the engine's weights or KV cache while they are released."""


def check_sleep_args(level: int | None = None, tags: Sequence[str] = ()) -> None:
    """ValueError on a level or tag vLLM's sleep mode does not have."""
    if level is not None and level not in SLEEP_LEVELS:
        raise ValueError(f"engine sleep: level must be one of {SLEEP_LEVELS}; got {level}")
    unknown = [t for t in tags if t not in WAKE_TAGS]
    if unknown:
        raise ValueError(f"engine wake_up: tags must be among {WAKE_TAGS}; got {unknown}")


class WeightStash:
    """A module's parameters released while its engine sleeps and rebuilt on wake (counted)."""

    def __init__(self, module: torch.nn.Module):
        self.module = module
        self.level = 0  # 0: awake
        self.asleep_tags: set[str] = set()
        self.sleeps = 0
        self.wakes = 0
        self._host: dict[str, torch.Tensor] = {}  # level 1: the weights' host copies
        self._shapes: dict[str, tuple[torch.Size, torch.dtype, torch.device]] = {}

    def sleep(self, level: int) -> dict[str, float]:
        """Release every parameter's storage (level 1: after a host copy);
        returns {"freed_bytes", "sleeps"}."""
        check_sleep_args(level)
        if self.level:
            raise EngineAsleep(f"engine sleep: already asleep at level {self.level}")
        freed = 0
        for name, p in self.module.named_parameters():
            self._shapes[name] = (p.shape, p.dtype, p.device)
            if level == 1:
                self._host[name] = p.data.to("cpu", copy=True)
            freed += p.numel() * p.element_size()
            # A zero-element tensor in place of the data: the old storage is freed when nothing else holds it.
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        self.level, self.asleep_tags = level, set(WAKE_TAGS)
        self.sleeps += 1
        return {"freed_bytes": float(freed), "sleeps": float(self.sleeps)}

    def wake_up(self, tags: Sequence[str] = WAKE_TAGS) -> dict[str, float]:
        """Rebuild what `tags` name; returns {"restored_bytes", "wakes"}. Waking what is awake is a no-op."""
        check_sleep_args(tags=tags)
        restored = 0
        if "weights" in tags and "weights" in self.asleep_tags:
            params = dict(self.module.named_parameters())
            for name, (shape, dtype, device) in self._shapes.items():
                fresh = torch.empty(shape, dtype=dtype, device=device)
                if name in self._host:  # level 1: the same weights; level 2: storage only, to be re-sent
                    fresh.copy_(self._host.pop(name))
                params[name].data = fresh
                restored += fresh.numel() * fresh.element_size()
            self._shapes.clear()
        self.asleep_tags -= set(tags)
        if not self.asleep_tags and self.level:
            self.level = 0
            self.wakes += 1
        return {"restored_bytes": float(restored), "wakes": float(self.wakes)}

    def check_awake(self, what: str) -> None:
        if self.asleep_tags:
            raise EngineAsleep(f"engine: {what} while asleep ({sorted(self.asleep_tags)} released); "
                               "wake_up first")
