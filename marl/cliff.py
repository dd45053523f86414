"""Terminal-cliff detection on held-out accuracy: a drop below the running peak that persists for `window`
consecutive evaluations. The drop is absolute (at least `drop` below the peak) or, when `relative_drop` > 0,
relative (at or below (1 - relative_drop) x the peak), so runs that peak at low accuracy can be flagged too.
Pure Python; the driver decides what to do on a flag."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from marl.types import JsonRecord


@dataclass
class CliffTracker:
    drop: float = 0.1  # absolute accuracy points below the peak (0.1 = 10 points)
    window: int = 2  # consecutive evaluations the drop must persist
    relative_drop: float = 0.0  # fraction of the peak (0.5 = fell to half of it); 0 = off
    peak: float = float("-inf")
    peak_step: int = -1
    below: int = 0  # consecutive evaluations below the peak by either condition
    history: list[tuple[int, float]] = field(default_factory=list)

    def update(self, step: int, accuracy: float) -> bool:
        """Record one evaluation; True once the drop has persisted for `window` evaluations."""
        self.history.append((step, accuracy))
        if accuracy > self.peak:
            self.peak, self.peak_step, self.below = accuracy, step, 0
        elif self._absolute(accuracy) or self._relative(accuracy):
            self.below += 1
        else:
            self.below = 0
        return self.below >= self.window

    def _absolute(self, accuracy: float) -> bool:
        return self.peak - accuracy >= self.drop

    def _relative(self, accuracy: float) -> bool:
        # A peak of 0 has nothing to fall from (0 <= 0 x (1 - r) would hold for every later 0).
        return self.relative_drop > 0 and self.peak > 0 and accuracy <= (1 - self.relative_drop) * self.peak

    def _held(self, condition: Callable[[float], bool]) -> bool:
        """Whether `condition` held at each of the last `window` evaluations of a flagged run of them. The
        peak is the same throughout such a run (a new peak restarts it), so the history alone tells."""
        recent = self.history[-self.window:]
        return (
            self.below >= self.window and len(recent) == self.window and all(condition(a) for _, a in recent)
        )

    def metrics(self) -> dict[str, float]:
        """Peak, evaluations below it, and which condition flags the cliff: `cliff/flagged_absolute` and
        `cliff/flagged_relative` are 1.0 when that condition alone held for the whole window (both may)."""
        return {"cliff/peak": self.peak, "cliff/peak_step": float(self.peak_step),
                "cliff/evals_below": float(self.below),
                "cliff/flagged_absolute": float(self._held(self._absolute)),
                "cliff/flagged_relative": float(self._held(self._relative))}

    def state(self) -> JsonRecord:
        return {"peak": self.peak, "peak_step": self.peak_step, "below": self.below,
                "history": [list(h) for h in self.history]}

    def load_state(self, state: JsonRecord) -> None:
        self.peak = state["peak"]
        self.peak_step = state["peak_step"]
        self.below = state["below"]
        self.history = [tuple(h) for h in state["history"]]


def detect(curve: list[float], drop: float = 0.1, window: int = 2, relative_drop: float = 0.0) -> list[int]:
    """Indices of the evaluations at which a cliff is flagged (for offline curves and reports)."""
    tracker = CliffTracker(drop, window, relative_drop)
    return [i for i, acc in enumerate(curve) if tracker.update(i, acc)]


@dataclass(frozen=True)
class CliffEvent:
    index: int  # the evaluation at which the cliff was first flagged
    peak: float  # the running peak it fell from (not the run's overall peak, which may come later)
    peak_index: int
    recovered: bool  # the curve's last evaluation is no longer below its running peak by either condition


def first_cliff(curve: list[float], drop: float = 0.1, window: int = 2,
                relative_drop: float = 0.0) -> CliffEvent | None:
    """The first cliff flagged on `curve` (None if none), and whether the curve came back from it: a flag says
    a drop persisted for `window` evaluations, not that the run never recovered."""
    tracker = CliffTracker(drop, window, relative_drop)
    first: tuple[int, float, int] | None = None
    for i, acc in enumerate(curve):
        if tracker.update(i, acc) and first is None:
            first = (i, tracker.peak, tracker.peak_step)
    return None if first is None else CliffEvent(*first, recovered=tracker.below == 0)
