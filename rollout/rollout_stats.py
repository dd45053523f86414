"""How a collection used its engines, as flat metrics: the share of its wall time each engine group had at
least one call in flight (`rollout/engine_busy_frac/<group key>`), the wall time any did (`generate_s`), and
each role's turn latency, from the moment its episode asked to the answer
(`rollout/turn_latency_p50_s/<role>`, `..._p99_s`).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) of `values` by linear interpolation between order statistics."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


class _Busy:
    """Wall time with at least one call in flight, overlaps counted once."""

    def __init__(self) -> None:
        self.calls, self.since, self.total = 0, 0.0, 0.0

    def enter(self, now: float) -> None:
        if self.calls == 0:
            self.since = now
        self.calls += 1

    def leave(self, now: float) -> None:
        self.calls -= 1
        if self.calls == 0:
            self.total += now - self.since


class RolloutClock:
    """Started with the collection; clients mark engine calls (`busy`) and finished turns (`turn_done`)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self._any = _Busy()
        self._groups = dict[str, _Busy]()
        self._latency: dict[str, list[float]] = {}

    @contextlib.contextmanager
    def busy(self, group: str) -> Iterator[None]:
        now, mark = time.perf_counter(), self._groups.setdefault(group, _Busy())
        self._any.enter(now)
        mark.enter(now)
        try:
            yield
        finally:
            now = time.perf_counter()
            mark.leave(now)
            self._any.leave(now)

    def turn_done(self, role: str, seconds: float) -> None:
        self._latency.setdefault(role, []).append(seconds)

    @property
    def generate_s(self) -> float:
        return self._any.total

    def metrics(self) -> dict[str, float]:
        wall = max(time.perf_counter() - self.start, 1e-9)
        out = {f"rollout/engine_busy_frac/{g}": b.total / wall for g, b in sorted(self._groups.items())}
        for role, seconds in sorted(self._latency.items()):
            out[f"rollout/turn_latency_p50_s/{role}"] = percentile(seconds, 50)
            out[f"rollout/turn_latency_p99_s/{role}"] = percentile(seconds, 99)
        return out
