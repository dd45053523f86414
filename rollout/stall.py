"""Deadlines by progress: an engine is hung when it holds calls but its token counter stays flat for
`rollout.stall_timeout_s`, however long its work takes. A healthy engine on long answers keeps counting.

One `StallWatch` per engine (per incarnation: a replacement gets a new one). While any call runs under it, it
polls the engine's `progress()`; once the engine has answered, a poll that is not answered counts as no
progress. Until its first answer the engine is starting (a new actor loads its model, and queues calls and
polls meanwhile), which `start_s` bounds instead. When the counter has not moved for the deadline, every call
under the watch fails with GroupTimeout (the member is lost), which the EngineGroup turns into one replacement
and one retry of each affected call.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from cluster.group import GroupError, GroupTimeout

T = TypeVar("T")


def poll_interval(stall_s: float) -> float:
    """How often the counter is read: often enough that a stall is caught within ~1/8 of its deadline past it,
    rarely enough to cost nothing (at most once a second)."""
    return max(min(1.0, stall_s / 8), 0.001)


class StallWatch:
    """Runs calls on one engine and fails them all once `progress` (its token counter) stays
    flat for `stall_s` while at least one is running. `name`: the engine and method, for the
    error (`<group>:<i>.generate`)."""

    def __init__(self, progress: Callable[[], Awaitable[int]], stall_s: float, name: str, start_s: float):
        self.progress, self.stall_s, self.name, self.start_s = progress, stall_s, name, start_s
        self.running = 0
        self.answered = False  # the engine has answered a poll: it is up
        self._stalled: asyncio.Future[None] | None = None
        self._poller: asyncio.Task[None] | None = None

    async def run(self, call: Coroutine[Any, Any, T]) -> T:
        loop = asyncio.get_running_loop()
        if self._stalled is None:
            self._stalled = loop.create_future()
        task: asyncio.Future[T] = asyncio.ensure_future(call)
        self.running += 1
        if self._poller is None or self._poller.done():
            self._poller = asyncio.ensure_future(self._watch())
        try:
            waiting: list[asyncio.Future[Any]] = [task, self._stalled]
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                return task.result()
            task.cancel()
            if not self.answered:
                raise GroupTimeout(
                    f"{self.name} did not start within {self.start_s:g}s (rollout.start_timeout_s)"
                )
            raise GroupTimeout(
                f"{self.name} made no progress for {self.stall_s:g}s (rollout.stall_timeout_s)"
            )
        finally:
            self.running -= 1

    async def _watch(self) -> None:
        """Polls while calls run; marks the watch stalled (for good: the engine is to be replaced) on a flat
        counter."""
        interval = poll_interval(self.stall_s)
        last, since = -1, time.monotonic()
        while self.running and self._stalled is not None and not self._stalled.done():
            try:  # unanswered for the whole deadline is a stall too, however slow the answer path
                value = await asyncio.wait_for(
                    self.progress(), self.stall_s if self.answered else self.start_s
                )
                self.answered = True
            except (asyncio.TimeoutError, GroupError):
                value = last  # an engine that cannot answer is making no progress either
            now = time.monotonic()
            if value != last:
                last, since = value, now
            elif now - since >= (self.stall_s if self.answered else self.start_s):
                self._stalled.set_result(None)
                return
            await asyncio.sleep(interval)
