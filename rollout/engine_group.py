"""EngineGroup: the inference engines that serve one role, hosted by cluster.Group."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from typing import Any

from cluster.group import Group, MemberOptions
from marl.types import Completion, Message
from rollout.engine import Sampling


def _engine_kwargs(rollout: Any) -> dict[str, Any]:
    if rollout.backend != "vllm":
        return {}
    return {"kv_cache_gb": rollout.kv_cache_gb, "gpu_memory_utilization": rollout.gpu_memory_utilization,
            "max_model_len": rollout.max_model_len}


def _engine_env(rollout: Any, slot: int) -> dict[str, str]:
    """Environment of engine actor `slot`: vLLM reads its settings at import, before any method runs."""
    if rollout.backend != "vllm":
        return {}
    from rollout.vllm_engine import cpu_bind, default_cache_root, engine_env

    return engine_env(cpu_bind(slot, rollout.torch_threads, os.cpu_count() or 1), default_cache_root())


def _engine_class(backend: str) -> type:
    # Imported on selection so that a backend's heavy dependencies load only where it is used.
    if backend == "hf":
        from rollout.hf_engine import HFEngine

        return HFEngine
    if backend == "vllm":
        from rollout.vllm_engine import VLLMEngine

        return VLLMEngine
    raise ValueError(f"rollout.backend: unknown engine backend {backend!r}")


class EngineGroup:
    """`replicas` engines (0 = one in-process) serving `role` with the weights of `policy_id`."""

    def __init__(self, role: str, policy_id: str, model_path: str, rollout: Any, dtype: str, run_name: str,
                 first_slot: int = 0):
        """`first_slot`: this group's first engine's index among all engines of the run (CPU core binding)."""
        self.role, self.policy_id = role, policy_id
        self.max_batch_size = rollout.max_batch_size
        self.timeout = rollout.call_timeout_s
        threads = rollout.torch_threads
        n = rollout.engines_per_role
        self.group = Group(
            _engine_class(rollout.backend), n, name=f"{run_name}:engine:{role}",
            args=(model_path, dtype, threads, policy_id),
            options=MemberOptions(num_cpus=rollout.engine_num_cpus, env={"OMP_NUM_THREADS": str(threads)}),
            per_member_kwargs=[_engine_kwargs(rollout)] * max(n, 1),
            per_member_env=[_engine_env(rollout, first_slot + i) for i in range(n)] or None,
        )

    async def generate(self, requests: list[list[Message]], sampling: Sampling) -> list[Completion]:
        """Split `requests` into chunks of at most max_batch_size, spread round-robin over the replicas."""
        size = self.max_batch_size
        chunks = [requests[i:i + size] for i in range(0, len(requests), size)]
        calls = [
            self.group.acall(k % self.group.size, "generate", chunk,
                             dataclasses.replace(sampling, seed=sampling.seed + k), timeout=self.timeout)
            for k, chunk in enumerate(chunks)
        ]
        results = await asyncio.gather(*calls)
        return [c for chunk in results for c in chunk]

    def versions(self) -> list[int]:
        return self.group.call("weight_version", timeout=self.timeout)

    def shutdown(self) -> None:
        self.group.shutdown()
