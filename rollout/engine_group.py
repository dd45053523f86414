"""EngineGroup: the inference engines that serve some roles, hosted by cluster.Group.

A group serves what its entry of the engine map (marl/engine_map.py) says: one role, all roles of one policy
(rollout.engine_scope=policy), or every policy at once as LoRA adapters on one base model
(rollout.lora_serving=multi: requests of a role go to its policy's adapter).
Two ways in: `generate` (lockstep: a role's batch in chunks of max_batch_size, round-robin over the replicas)
and `complete` (streaming: one request, on the replica with the fewest calls in flight, at most max_batch_size
each). Either way calls are deadlined by progress (rollout.stall): a member that dies, or holds calls while
generating no token for rollout.stall_timeout_s, is replaced (same name and slot), caught up to the current
weights through the `resync` callable the group was built with, and every call it held is retried on it
exactly once. Members satisfy rollout.engine.EngineMember; the group names their methods through it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from cluster.group import Group, GroupError, MemberOptions
from cluster.placement import GroupPlacement
from cluster.threads import thread_env, threads_for
from marl.engine_map import EngineGroupSpec
from marl.types import Completion, JsonRecord, Message
from rollout.config import RolloutConfig
from rollout.engine import ENGINES, EngineMember, Sampling
from rollout.stall import StallWatch

# Catches member `index` of a group up to the weights its policies' engines serve (after a replacement).
Resync = Callable[["EngineGroup", int], None]


def _engine_kwargs(rollout: RolloutConfig, adapters: int, lora_rank: int, weight_channel: str,
                   chat_template_kwargs: Mapping[str, Any]) -> JsonRecord:
    # Every backend renders prompts with the same template variables: the HF engine's ids are vLLM's ids.
    chat = {"chat_template_kwargs": dict(chat_template_kwargs)} if chat_template_kwargs else {}
    if not ENGINES[rollout.backend].capabilities.memory_settings:
        return chat
    return {
        **chat,
        "kv_cache_gb": rollout.vllm.kv_cache_gb,
        "gpu_memory_utilization": rollout.vllm.gpu_memory_utilization,
        "max_model_len": rollout.vllm.max_model_len,
        "max_loras": adapters,
        "max_lora_rank": lora_rank,
        "weight_channel": weight_channel,
        "sync_path": rollout.vllm.sync_path,
        "sleep_mode": rollout.layout == "colocated",
    }


def _engine_env(rollout: RolloutConfig, slot: int) -> dict[str, str]:
    """Environment of engine actor `slot`, set before it imports anything (its class's `actor_env`)."""
    threads = threads_for(rollout.engine_num_cpus, rollout.torch_threads)
    return ENGINES[rollout.backend].actor_env(slot, threads)


def _engine_threads(rollout: RolloutConfig) -> int:
    """Torch threads per engine. vLLM drops torch to one thread unless told, so engines get their count
    explicitly: an actor's from its CPUs, an in-process engine's (engines_per_role 0) the caller's cores."""
    if rollout.engines_per_role:
        return threads_for(rollout.engine_num_cpus, rollout.torch_threads)
    return rollout.torch_threads or (os.cpu_count() or 1)


class EngineGroup:
    """`rollout.engines_per_role` engines (0 = one in-process) serving the roles of `spec` (marl.engine_map):
    one policy's weights, or every policy's LoRA adapter on one base model (multi-LoRA)."""

    def __init__(
        self,
        spec: EngineGroupSpec,
        model_path: str,
        rollout: RolloutConfig,
        dtype: str,
        first_slot: int = 0,
        placement: GroupPlacement | None = None,
        lora_rank: int = 0,
        weight_channel: str = "",
        engine_cls: type[EngineMember] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        resync: Resync | None = None,
    ):
        """`first_slot`: this group's first engine's index among all engines of the run (CPU core binding);
        `lora_rank`: adapters' rank (multi-LoRA); `weight_channel`: the transport (nccl, ipc) engines
        receive weights over through vLLM's weight-transfer engines, or "";
        `engine_cls`: instead of the backend's; `chat_template_kwargs`: extra chat template variables
        (model.chat_template_kwargs); `resync`: catches a replaced member up to the current weights (none: a
        replacement serves the model folder's)."""
        self.spec = spec
        self.policy_of = dict(spec.policy_of)
        self.key = spec.key
        self.multi_lora = spec.multi_lora
        self.policy_id = spec.policy or ""
        self.max_batch_size = rollout.max_batch_size
        self.timeout = rollout.stall_timeout_s
        # Also the deadline of the group's own short calls: a member's version, a replacement taking its name
        # (both may meet an engine that is still starting).
        self.start_timeout = rollout.start_timeout_s
        self.replace_dead = rollout.replace_dead_engines
        self.resync = resync
        self.replacements = 0  # engines replaced, all members together
        self._replacements: dict[int, int] = {}  # member -> its replacements so far (one per failure)
        self._locks: dict[int, asyncio.Lock] = {}
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop the state below belongs to (_for_loop)
        # member -> its progress watch (a replacement gets a new one)
        self._watches: dict[int, StallWatch] = {}
        self._slots: _Slots | None = None
        n, threads = rollout.engines_per_role, _engine_threads(rollout)
        adapters = len(spec.policies) if self.multi_lora else 0
        kwargs = _engine_kwargs(rollout, adapters, lora_rank, weight_channel, chat_template_kwargs or {})
        self.group: Group[EngineMember] = Group(
            engine_cls or ENGINES[rollout.backend], n, name=spec.name,
            args=(model_path, dtype, threads, self.policy_id),
            options=MemberOptions(num_cpus=rollout.engine_num_cpus, env=thread_env(threads)),
            per_member_kwargs=[kwargs] * max(n, 1),
            per_member_env=[_engine_env(rollout, first_slot + i) for i in range(n)] or None,
            placement=placement)

    @property
    def policies(self) -> list[str]:
        return self.spec.policies

    async def generate(self, requests: list[list[Message]], sampling: Sampling,
                       role: str | None = None) -> list[Completion]:
        """Lockstep: `requests` in chunks of at most max_batch_size, spread round-robin over the
        replicas, chunk k sampled with its own seed. `role`: whose requests these are (routes to the
        role's adapter under multi-LoRA)."""
        adapter = self._adapter(role)
        size = self.max_batch_size
        chunks = [requests[i:i + size] for i in range(0, len(requests), size)]
        calls = [self._call(k % self.group.size, role, chunk, sampling.derive("chunk", k), adapter)
                 for k, chunk in enumerate(chunks)]
        results = await asyncio.gather(*calls)
        return [c for chunk in results for c in chunk]

    async def complete(
        self, request: list[Message], sampling: Sampling, role: str | None = None
    ) -> Completion:
        """Streaming: one request, sent now to the replica with the fewest calls in flight (waiting while
        every replica holds max_batch_size); its engine batches it with whatever else it is serving."""
        adapter = self._adapter(role)
        slots = self._for_loop()[1]
        index = await slots.take()
        try:
            return (await self._call(index, role, [request], sampling, adapter))[0]
        finally:
            await slots.give(index)

    def _adapter(self, role: str | None) -> str | None:
        if not self.multi_lora:
            return None
        if role not in self.policy_of:
            raise KeyError(f"{self.group.name} serves roles {sorted(self.policy_of)}, not {role!r}")
        return self.policy_of[role]

    async def _call(self, index: int, role: str | None, requests: list[list[Message]], sampling: Sampling,
                    adapter: str | None) -> list[Completion]:
        replaced = self._replacements.get(index, 0)
        try:
            return await self._watched(index, requests, sampling, adapter)
        except GroupError as e:
            if not (self.replace_dead and _replaceable(self.group, e)):
                raise _for_role(e, role) from e
            failure = e
        await self._replace(index, replaced, failure)
        try:  # exactly once more, on the replacement; a second failure is the step's
            return await self._watched(index, requests, sampling, adapter)
        except GroupError as e:
            raise _for_role(e, role, retried=True) from e

    def _watched(self, index: int, requests: list[list[Message]], sampling: Sampling,
                 adapter: str | None) -> Awaitable[list[Completion]]:
        watches = self._for_loop()[0]
        if index not in watches:
            watches[index] = StallWatch(lambda: self.group.acall(index, EngineMember.progress), self.timeout,
                                        f"{self.group.name}:{index}.generate", self.start_timeout)
        return watches[index].run(
            self.group.acall(index, EngineMember.generate_async, requests, sampling, adapter)
        )

    def _for_loop(self) -> tuple[dict[int, StallWatch], _Slots]:
        """The watches and slots of the running event loop: asyncio objects belong to one loop, and each
        collection runs its own."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._slots is None:
            self._loop, self._watches = loop, {}
            self._slots = _Slots(self.group.size, self.max_batch_size)
            self._locks = {}
        return self._watches, self._slots

    async def _replace(self, index: int, replaced: int, failure: GroupError) -> None:
        """One replacement per failure: chunks of the same member that failed with it (when it had been
        replaced `replaced` times) wait for it."""
        async with self._locks.setdefault(index, asyncio.Lock()):
            if self._replacements.get(index, 0) != replaced:
                return  # another chunk already replaced this member
            await asyncio.to_thread(self._replace_now, index)
            self._replacements[index] = replaced + 1
            self._watches.pop(index, None)  # the stalled watch stays stalled; the replacement starts afresh

    def _replace_now(self, index: int) -> None:
        self.group.replace(index, self.start_timeout)
        self.replacements += 1
        if self.resync is not None:
            self.resync(self, index)

    def versions(self) -> list[int]:
        return self.group.submit(EngineMember.weight_version).result(self.start_timeout)

    def sleep(self, level: int = 1) -> dict[str, float]:
        """Every member releases its memory (rollout.layout=colocated: the update runs on these GPUs);
        {"freed_bytes": all members', "sleeps": the most calls any member has taken}."""
        return _summed(self.group.submit(EngineMember.sleep, level).result(self.start_timeout))

    def wake_up(self, tags: tuple[str, ...] = ("weights", "kv_cache")) -> dict[str, float]:
        """Every member takes back what `tags` name (rollout/sleep.py)."""
        return _summed(self.group.submit(EngineMember.wake_up, tags).result(self.start_timeout))

    def shutdown(self) -> None:
        self.group.shutdown()


def _summed(reports: list[dict[str, float]]) -> dict[str, float]:
    """Members' sleep/wake reports: bytes summed, call counters at their largest."""
    return {k: (sum if k.endswith("bytes") else max)(r[k] for r in reports) for k in reports[0]}


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


class _Slots:
    """The per-engine concurrency limit of streamed calls: each goes to the replica with the fewest in flight
    (the lowest index among equals), and waits while every replica holds `limit`."""

    def __init__(self, n: int, limit: int):
        self.inflight = [0] * n
        self.limit = limit
        self._cond = asyncio.Condition()

    async def take(self) -> int:
        async with self._cond:
            await self._cond.wait_for(lambda: min(self.inflight) < self.limit)
            index = self.inflight.index(min(self.inflight))
            self.inflight[index] += 1
            return index

    async def give(self, index: int) -> None:
        async with self._cond:
            self.inflight[index] -= 1
            self._cond.notify_all()
