"""Task families by name (the `data.task` config key) and the data sources that produce Tasks."""

from __future__ import annotations

from collections.abc import Callable

from marl.tasks.base import TaskFamily
from marl.tasks.digit import DigitFamily
from marl.tasks.math import MathFamily

FAMILIES: dict[str, Callable[..., TaskFamily]] = {"math": MathFamily, "digit": DigitFamily}


def get_family(name: str, answer_fallback: str = "none") -> TaskFamily:
    """A fresh TaskFamily for `name`; unknown names raise ValueError listing the known ones.
    `answer_fallback` applies to the math family only."""
    if name not in FAMILIES:
        raise ValueError(f"data.task must be one of {sorted(FAMILIES)}, got {name!r}")
    return FAMILIES[name](answer_fallback) if name == "math" else FAMILIES[name]()


__all__ = ["FAMILIES", "DigitFamily", "MathFamily", "TaskFamily", "get_family"]
