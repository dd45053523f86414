"""StallWatch in-process, with small deadlines: a call on an engine whose counter keeps moving outlives the
stall deadline; a flat counter fails every call within the deadline plus a poll; an engine still starting up
is given the start deadline instead, and one that never answers fails at it."""

from __future__ import annotations

import asyncio
import time

import pytest

from cluster.group import GroupTimeout
from rollout.stall import StallWatch, poll_interval

STALL_S = 0.3


class FakeEngine:
    """Counts a token every `every_s` for `tokens` tokens, then (if `then_hang`) stops counting forever; its
    `progress` answers only after `starts_s` seconds."""

    def __init__(self, tokens: int, every_s: float, then_hang: bool = False, starts_s: float = 0.0):
        self.tokens, self.every_s, self.then_hang, self.starts_s = tokens, every_s, then_hang, starts_s
        self.count, self.born = 0, time.monotonic()

    async def progress(self) -> int:
        await asyncio.sleep(max(self.born + self.starts_s - time.monotonic(), 0.0))
        return self.count

    async def generate(self) -> str:
        await asyncio.sleep(self.starts_s)
        for _ in range(self.tokens):
            await asyncio.sleep(self.every_s)
            self.count += 1
        if self.then_hang:
            await asyncio.Event().wait()
        return "done"


def _run(engine: FakeEngine, calls: int = 1, start_s: float = 5.0) -> list:
    async def main() -> list:
        watch = StallWatch(engine.progress, STALL_S, "e:0.generate", start_s)
        return await asyncio.gather(
            *(watch.run(engine.generate()) for _ in range(calls)), return_exceptions=True
        )

    return asyncio.run(main())


def test_a_slow_engine_that_keeps_counting_outlives_the_stall_deadline():
    t0 = time.monotonic()
    assert _run(FakeEngine(tokens=8, every_s=0.1)) == ["done"]
    assert time.monotonic() - t0 > 2 * STALL_S


def test_a_flat_counter_fails_every_call_within_the_deadline_and_a_poll():
    t0 = time.monotonic()
    out = _run(FakeEngine(tokens=3, every_s=0.05, then_hang=True), calls=3)
    waited = time.monotonic() - t0
    assert all(
        isinstance(e, GroupTimeout) and "e:0.generate made no progress for 0.3s" in str(e) for e in out
    )
    assert STALL_S + 0.15 <= waited <= 0.15 + STALL_S + poll_interval(STALL_S) + 0.5  # + slack for a busy box


def test_an_engine_still_starting_gets_the_start_deadline_and_one_that_never_starts_fails_at_it():
    assert _run(FakeEngine(tokens=3, every_s=0.05, starts_s=3 * STALL_S)) == ["done"]
    out = _run(FakeEngine(tokens=3, every_s=0.05, starts_s=60.0), start_s=0.5)
    assert isinstance(out[0], GroupTimeout) and "did not start within 0.5s (rollout.start_timeout_s)" in str(
        out[0]
    )


@pytest.mark.parametrize(("stall_s", "interval"), [(120.0, 1.0), (2.0, 0.25), (0.001, 0.001)])
def test_the_poll_interval_is_an_eighth_of_the_deadline_at_most_a_second(stall_s, interval):
    assert poll_interval(stall_s) == interval
