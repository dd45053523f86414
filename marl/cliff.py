"""Terminal-cliff detection on held-out accuracy: a drop of at least `drop` below the running peak that
persists for `window` consecutive evaluations. Pure Python; the driver decides what to do on a flag."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CliffTracker:
    drop: float = 0.1  # absolute accuracy points below the peak (0.1 = 10 points)
    window: int = 2  # consecutive evaluations the drop must persist
    peak: float = float("-inf")
    peak_step: int = -1
    below: int = 0
    history: list[tuple[int, float]] = field(default_factory=list)

    def update(self, step: int, accuracy: float) -> bool:
        """Record one evaluation; True once the drop has persisted for `window` evaluations."""
        self.history.append((step, accuracy))
        if accuracy > self.peak:
            self.peak, self.peak_step, self.below = accuracy, step, 0
        elif self.peak - accuracy >= self.drop:
            self.below += 1
        else:
            self.below = 0
        return self.below >= self.window

    def metrics(self) -> dict[str, float]:
        return {"cliff/peak": self.peak, "cliff/peak_step": float(self.peak_step),
                "cliff/evals_below": float(self.below)}

    def state(self) -> dict:
        return {"peak": self.peak, "peak_step": self.peak_step, "below": self.below,
                "history": [list(h) for h in self.history]}

    def load_state(self, state: dict) -> None:
        self.peak, self.peak_step, self.below = state["peak"], state["peak_step"], state["below"]
        self.history = [tuple(h) for h in state["history"]]


def detect(curve: list[float], drop: float = 0.1, window: int = 2) -> list[int]:
    """Indices of the evaluations at which a cliff is flagged (for offline curves and reports)."""
    tracker = CliffTracker(drop, window)
    return [i for i, acc in enumerate(curve) if tracker.update(i, acc)]
