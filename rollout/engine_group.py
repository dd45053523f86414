"""EngineGroup: the inference engines that serve one role, hosted by cluster.Group."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from cluster.group import Group, MemberOptions
from marl.types import Completion, Message
from rollout.engine import Sampling


def _engine_class(backend: str) -> type:
    # Imported on selection so that a backend's heavy dependencies load only where it is used.
    if backend == "hf":
        from rollout.hf_engine import HFEngine

        return HFEngine
    raise ValueError(f"rollout.backend: unknown engine backend {backend!r}")


class EngineGroup:
    """`replicas` engines (0 = one in-process) serving `role` with the weights of `policy_id`."""

    def __init__(self, role: str, policy_id: str, model_path: str, rollout: Any, dtype: str, run_name: str):
        self.role, self.policy_id = role, policy_id
        self.max_batch_size = rollout.max_batch_size
        self.timeout = rollout.call_timeout_s
        threads = rollout.torch_threads
        self.group = Group(
            _engine_class(rollout.backend), rollout.engines_per_role, name=f"{run_name}:engine:{role}",
            args=(model_path, dtype, threads, policy_id),
            options=MemberOptions(num_cpus=rollout.engine_num_cpus, env={"OMP_NUM_THREADS": str(threads)}),
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
