"""EngineGroup: the inference engines that serve some roles, hosted by cluster.Group.

A group serves what its entry of the engine map (marl/engine_map.py) says: one role, all roles of one policy
(rollout.engine_scope=policy), or every policy at once as LoRA adapters on one base model
(rollout.lora_serving=multi: requests of a role go to its policy's adapter).
A member that dies or misses its deadline is replaced (same name and slot), caught up to the current
weights through the `resync` callable the group was built with, and the chunk it held is retried on it exactly
once. Members satisfy rollout.engine.EngineMember; the group names their methods through it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping
from typing import Any

from cluster.group import Group, GroupError, MemberOptions
from cluster.placement import GroupPlacement
from cluster.threads import thread_env, threads_for
from marl.engine_map import EngineGroupSpec
from marl.types import Completion, Message
from rollout.engine import EngineMember, Sampling

# Catches member `index` of a group up to the weights its policies' engines serve (after a replacement).
Resync = Callable[["EngineGroup", int], None]


def _engine_kwargs(rollout: Any, adapters: int, lora_rank: int, weight_channel: bool,
                   chat_template_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    # Every backend renders prompts with the same template variables: the HF engine's ids are vLLM's ids.
    chat = {"chat_template_kwargs": dict(chat_template_kwargs)} if chat_template_kwargs else {}
    if rollout.backend != "vllm":
        return chat
    return {**chat, "kv_cache_gb": rollout.kv_cache_gb, "gpu_memory_utilization": rollout.gpu_memory_utilization,
            "max_model_len": rollout.max_model_len, "max_loras": adapters, "max_lora_rank": lora_rank,
            "weight_channel": weight_channel, "sync_path": rollout.vllm_sync_path}


def _engine_env(rollout: Any, slot: int) -> dict[str, str]:
    """Environment of engine actor `slot`: vLLM reads its settings at import, before any method runs."""
    if rollout.backend != "vllm":
        return {}
    from rollout.vllm_support import cpu_bind, default_cache_root, engine_env

    threads = threads_for(rollout.engine_num_cpus, rollout.torch_threads)
    return engine_env(cpu_bind(slot, threads, os.cpu_count() or 1), default_cache_root())


def _engine_class(backend: str) -> type[EngineMember]:
    # Imported on selection so that a backend's heavy dependencies load only where it is used.
    if backend == "hf":
        from rollout.hf_engine import HFEngine

        return HFEngine
    if backend == "vllm":
        from rollout.vllm_engine import VLLMEngine

        return VLLMEngine
    raise ValueError(f"rollout.backend: unknown engine backend {backend!r}")


class EngineGroup:
    """`rollout.engines_per_role` engines (0 = one in-process) serving the roles of `spec` (marl.engine_map):
    one policy's weights, or every policy's LoRA adapter on one base model (multi-LoRA)."""

    def __init__(self, spec: EngineGroupSpec, model_path: str, rollout: Any, dtype: str, first_slot: int = 0,
                 placement: GroupPlacement | None = None, lora_rank: int = 0, weight_channel: bool = False,
                 engine_cls: type[EngineMember] | None = None, chat_template_kwargs: Mapping[str, Any] | None = None,
                 resync: Resync | None = None):
        """`first_slot`: this group's first engine's index among all engines of the run (CPU core binding);
        `lora_rank`: adapters' rank (multi-LoRA); `weight_channel`: engines receive weights over NCCL;
        `engine_cls`: instead of the backend's; `chat_template_kwargs`: extra chat template variables
        (model.chat_template_kwargs); `resync`: catches a replaced member up to the current weights (none: a
        replacement serves the model folder's)."""
        self.spec, self.policy_of = spec, dict(spec.policy_of)
        self.multi_lora, self.policy_id = spec.multi_lora, spec.policy or ""
        self.max_batch_size, self.timeout = rollout.max_batch_size, rollout.call_timeout_s
        self.replace_dead = rollout.replace_dead_engines
        self.resync = resync
        self.replacements = 0  # engines replaced, all members together
        self._replacements: dict[int, int] = {}  # member -> its replacements so far (one per failure)
        self._locks: dict[int, asyncio.Lock] = {}
        n = rollout.engines_per_role
        # vLLM drops torch to one thread unless told: engines get their count explicitly (an in-process one, the
        # caller's cores).
        threads = threads_for(rollout.engine_num_cpus, rollout.torch_threads) if n else rollout.torch_threads or (
            os.cpu_count() or 1)
        kwargs = _engine_kwargs(rollout, len(spec.policies) if self.multi_lora else 0, lora_rank, weight_channel,
                                chat_template_kwargs or {})
        self.group: Group[EngineMember] = Group(
            engine_cls or _engine_class(rollout.backend), n, name=spec.name,
            args=(model_path, dtype, threads, self.policy_id),
            options=MemberOptions(num_cpus=rollout.engine_num_cpus, env=thread_env(threads)),
            per_member_kwargs=[kwargs] * max(n, 1),
            per_member_env=[_engine_env(rollout, first_slot + i) for i in range(n)] or None, placement=placement,
        )

    @property
    def policies(self) -> list[str]:
        return self.spec.policies

    async def generate(self, requests: list[list[Message]], sampling: Sampling,
                       role: str | None = None) -> list[Completion]:
        """Split `requests` into chunks of at most max_batch_size, spread round-robin over the replicas.
        `role`: whose requests these are (routes to the role's adapter under multi-LoRA)."""
        if self.multi_lora and role not in self.policy_of:
            raise KeyError(f"{self.group.name} serves roles {sorted(self.policy_of)}, not {role!r}")
        adapter = (self.policy_of[role],) if self.multi_lora else ()
        size = self.max_batch_size
        chunks = [requests[i:i + size] for i in range(0, len(requests), size)]
        calls = [self._generate_chunk(k % self.group.size, role, (chunk, sampling.derive("chunk", k), *adapter))
                 for k, chunk in enumerate(chunks)]
        results = await asyncio.gather(*calls)
        return [c for chunk in results for c in chunk]

    async def _generate_chunk(self, index: int, role: str | None, args: tuple) -> list[Completion]:
        replaced = self._replacements.get(index, 0)
        try:
            return (await self.group.submit_to([index], EngineMember.generate, *args).aresult(self.timeout))[0]
        except GroupError as e:
            if not (self.replace_dead and _replaceable(self.group, e)):
                raise _for_role(e, role) from e
            failure = e
        await self._replace(index, replaced, failure)
        try:  # exactly once more, on the replacement; a second failure is the step's
            return (await self.group.submit_to([index], EngineMember.generate, *args).aresult(self.timeout))[0]
        except GroupError as e:
            raise _for_role(e, role, retried=True) from e

    async def _replace(self, index: int, replaced: int, failure: GroupError) -> None:
        """One replacement per failure: chunks of the same member that failed with it (when it had been
        replaced `replaced` times) wait for it."""
        async with self._locks.setdefault(index, asyncio.Lock()):
            if self._replacements.get(index, 0) != replaced:
                return  # another chunk already replaced this member
            await asyncio.to_thread(self._replace_now, index)
            self._replacements[index] = replaced + 1

    def _replace_now(self, index: int) -> None:
        self.group.replace(index, self.timeout)
        self.replacements += 1
        if self.resync is not None:
            self.resync(self, index)

    def versions(self) -> list[int]:
        return self.group.submit(EngineMember.weight_version).result(self.timeout)

    def shutdown(self) -> None:
        self.group.shutdown()


def _replaceable(group: Group, error: GroupError) -> bool:
    """Dead (the actor is gone) or hung (missed its deadline); an engine's own exception is not retried."""
    if group.local:
        return False
    return error.member_lost


def _for_role(error: GroupError, role: str | None, retried: bool = False) -> GroupError:
    note = (f" (serving role {role!r})" if role else "") + (" after replacing the engine" if retried else "")
    out = type(error)(f"{error}{note}")
    out.member_lost = error.member_lost
    return out
