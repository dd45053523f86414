"""The PolicyClients a Collector hands its episodes: how each turn reaches its role's EngineGroup.

streaming (rollout.mode=streaming): each turn goes to its engine group the moment its episode reaches it
(`EngineGroup.complete`), seeded by what it is (step, episode, agent, the agent's turn), so the engines'
continuous batching fills each round's tail with the next rounds of other episodes and a run repeats itself
whatever the order requests arrive in.

lockstep (rollout.mode=lockstep): each role's queued turns are flushed as one batched call once the
event loop is quiescent (a full pass added no request), so every episode that can speak has spoken. The
batch composition is a function of the workflow, not of timing, and no sleep is involved; every episode
waits for its round's slowest turn.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from enum import StrEnum
from typing import Protocol

from marl.types import Completion, Message
from rollout.engine import Sampling
from rollout.rollout_stats import RolloutClock


class Engines(Protocol):
    """What a client needs of an EngineGroup (rollout.engine_group)."""

    key: str

    async def generate(self, requests: list[list[Message]], sampling: Sampling,
                       role: str | None = None) -> list[Completion]: ...

    async def complete(
        self, request: list[Message], sampling: Sampling, role: str | None = None
    ) -> Completion: ...


class TurnClient(Protocol):
    """A client shared by a collection's episodes; `seed_parts` say which turn of which episode a call is."""

    clock: RolloutClock

    async def turn(
        self, role: str, messages: list[Message], seed_parts: tuple[int | str, ...]
    ) -> Completion: ...


class EpisodeClient:
    """The PolicyClient of one episode (`episode`: its task's position in the step and its sample): numbers
    each agent's turns and times each turn for its role."""

    def __init__(self, shared: TurnClient, episode: tuple[int, int]):
        self.shared, self.episode = shared, episode
        self._turns: dict[str, int] = {}

    async def complete(self, role: str, agent: str, messages: list[Message]) -> Completion:
        k = self._turns.get(agent, 0)
        self._turns[agent] = k + 1
        t0 = time.perf_counter()
        out = await self.shared.turn(role, messages, (*self.episode, agent, k))
        self.shared.clock.turn_done(role, time.perf_counter() - t0)
        return out


def _engines_of(engines: Mapping[str, Engines], role: str) -> Engines:
    if role not in engines:
        raise KeyError(f"no engine group serves role {role!r}")
    return engines[role]


class StreamingClient:
    """Sends each turn to its role's engine group at once, seeded `sampling.derive(*seed_parts)`."""

    def __init__(self, engines: Mapping[str, Engines], sampling: Sampling):
        self.engines = engines
        self.sampling = sampling
        self.clock = RolloutClock()

    async def turn(self, role: str, messages: list[Message], seed_parts: tuple[int | str, ...]) -> Completion:
        group = _engines_of(self.engines, role)
        with self.clock.busy(group.key):
            return await group.complete(messages, self.sampling.for_role(role).derive(*seed_parts), role=role)


class BatchingClient:
    """Queues each turn and flushes every role's queue as one batched call once the loop is
    quiescent; a role's k-th batch is seeded `sampling.derive(role, k)` (seed_parts are not used:
    the batch fixes the draws)."""

    def __init__(self, engines: Mapping[str, Engines], sampling: Sampling):
        self.engines = engines
        self.sampling = sampling
        self.clock = RolloutClock()
        self.pending: dict[str, list[tuple[list[Message], asyncio.Future]]] = {}
        self.batches: dict[str, int] = {}
        self._flush_scheduled = False
        self._seen = -1
        self._inflight: set[asyncio.Task] = set()

    async def turn(self, role: str, messages: list[Message], seed_parts: tuple[int | str, ...]) -> Completion:
        _engines_of(self.engines, role)
        fut = asyncio.get_running_loop().create_future()
        self.pending.setdefault(role, []).append((messages, fut))
        self._schedule_flush()
        return await fut

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        count = sum(len(q) for q in self.pending.values())
        if count != self._seen:  # something arrived during the last pass: give the loop one more pass
            self._seen = count
            asyncio.get_running_loop().call_soon(self._flush)
            return
        self._flush_scheduled = False
        self._seen = -1
        for role, queue in self.pending.items():
            if queue:
                task = asyncio.ensure_future(self._dispatch(role, queue))
                self._inflight.add(task)
                task.add_done_callback(self._inflight.discard)
        self.pending = {}

    async def _dispatch(self, role: str, queue: list[tuple[list[Message], asyncio.Future]]) -> None:
        k = self.batches.get(role, 0)
        self.batches[role] = k + 1
        group = self.engines[role]
        try:
            with self.clock.busy(group.key):
                # Distinct, reproducible seeds per role and per batch within the step.
                outs = await group.generate(
                    [m for m, _ in queue], self.sampling.for_role(role).derive(role, k), role=role
                )
        except Exception as e:  # noqa: BLE001 - every waiting episode must see the engine's failure
            for _, fut in queue:
                if not fut.done():
                    fut.set_exception(e)
            return
        for (_, fut), out in zip(queue, outs, strict=True):
            if not fut.done():
                fut.set_result(out)


class RolloutMode(StrEnum):
    """`rollout.mode`: how turns reach the engines, each the name of its client in CLIENTS."""

    streaming = "streaming"
    lockstep = "lockstep"


CLIENTS: dict[RolloutMode, type[StreamingClient] | type[BatchingClient]] = {
    RolloutMode.streaming: StreamingClient, RolloutMode.lockstep: BatchingClient,
}
