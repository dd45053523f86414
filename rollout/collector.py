"""The Collector: runs many workflow episodes concurrently and batches their engine calls per role.

Each episode is a plain coroutine that awaits `client.complete(...)` once per turn. The client queues the
request; a flush runs once the event loop is quiescent (a full pass added no request), so every episode
that can speak has spoken, and each role's queue goes to its EngineGroup as one batched call. The batch
composition is a function of the workflow, not of timing, and no sleep is involved.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

from marl.episode import run_episode
from marl.types import Completion, Episode, Message, Task
from rollout.engine import Sampling
from rollout.engine_group import EngineGroup


class BatchingClient:
    """A PolicyClient that routes each role's requests to that role's EngineGroup in batches (a group may
    serve several roles; it is told whose batch it gets)."""

    def __init__(self, engines: Mapping[str, EngineGroup], sampling: Sampling):
        self.engines, self.sampling = engines, sampling
        self.pending: dict[str, list[tuple[list[Message], asyncio.Future]]] = {}
        self.batches: dict[str, int] = {}
        self._flush_scheduled = False
        self._seen = -1
        self._inflight: set[asyncio.Task] = set()
        # Wall time with at least one engine call in flight: the rollout's generation, overlaps counted once.
        self.generate_s = 0.0
        self._calls, self._busy_since = 0, 0.0

    async def complete(self, role: str, agent: str, messages: list[Message]) -> Completion:
        if role not in self.engines:
            raise KeyError(f"no engine group serves role {role!r}")
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
        self._flush_scheduled, self._seen = False, -1
        for role, queue in self.pending.items():
            if queue:
                task = asyncio.ensure_future(self._dispatch(role, queue))
                self._inflight.add(task)
                task.add_done_callback(self._inflight.discard)
        self.pending = {}

    async def _dispatch(self, role: str, queue: list[tuple[list[Message], asyncio.Future]]) -> None:
        k = self.batches.get(role, 0)
        self.batches[role] = k + 1
        if self._calls == 0:
            self._busy_since = time.perf_counter()
        self._calls += 1
        try:
            # Distinct, reproducible seeds per role and per batch within the step.
            sampling = self.sampling.for_role(role).derive(role, k)
            outs = await self.engines[role].generate([m for m, _ in queue], sampling, role=role)
        except Exception as e:  # noqa: BLE001 - every waiting episode must see the engine's failure
            for _, fut in queue:
                if not fut.done():
                    fut.set_exception(e)
            return
        finally:
            self._calls -= 1
            if self._calls == 0:
                self.generate_s += time.perf_counter() - self._busy_since
        for (_, fut), out in zip(queue, outs, strict=True):
            if not fut.done():
                fut.set_result(out)


class Collector:
    """Runs `samples_per_prompt` episodes of `workflow` for each task and returns them scored."""

    def __init__(self, engines: Mapping[str, EngineGroup], workflow: str, family: Any, options: Any,
                 shaping: Mapping[str, Callable] | None = None):
        self.engines, self.workflow, self.family = engines, workflow, family
        self.options, self.shaping = options, shaping

    def collect(self, tasks: list[Task], samples_per_prompt: int, sampling: Sampling,
                on_episode: Callable[[int, int], None] | None = None,
                timings: dict[str, float] | None = None) -> list[Episode]:
        """`on_episode(done, total)` is told each time an episode finishes (progress display). `timings`, if
        given, receives `generate_s`: the wall time during which at least one engine call was in flight."""
        return asyncio.run(self._collect(tasks, samples_per_prompt, sampling, on_episode, timings))

    async def _collect(self, tasks: list[Task], n: int, sampling: Sampling,
                       on_episode: Callable[[int, int], None] | None,
                       timings: dict[str, float] | None) -> list[Episode]:
        client = BatchingClient(self.engines, sampling)
        total, done = len(tasks) * n, 0

        async def tracked(coro: Any) -> Episode:
            nonlocal done
            episode = await coro
            done += 1
            if on_episode is not None:
                on_episode(done, total)
            return episode

        runs = [
            tracked(run_episode(self.workflow, task, client, self.family, self.options, i, self.shaping))
            for task in tasks for i in range(n)
        ]
        try:
            return list(await asyncio.gather(*runs))
        finally:
            if timings is not None:
                timings["generate_s"] = client.generate_s
