"""Task families by name (the `data.task` config key) and the data sources that produce Tasks."""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum

from marl.tasks.base import AsyncScoring, Scored, TaskFamily
from marl.tasks.code import CodeFamily
from marl.tasks.digit import DigitFamily
from marl.tasks.math import MathFamily
from marl.tasks.sandbox.limits import SandboxConfig

FAMILIES: dict[str, Callable[..., TaskFamily]] = {
    "math": MathFamily,
    "digit": DigitFamily,
    "code": CodeFamily,
}


class TaskName(StrEnum):
    """`data.task`: the names of FAMILIES (the config schema's type for the key)."""

    math = "math"
    digit = "digit"
    code = "code"


def get_family(name: str, answer_fallback: str = "none", sandbox: SandboxConfig | None = None) -> TaskFamily:
    """A fresh TaskFamily for `name`; unknown names raise ValueError listing the known ones.
    `answer_fallback` applies to the math family only, `sandbox` (the `data.sandbox` section: workers and
    limits) to the code family only."""
    if name not in FAMILIES:
        raise ValueError(f"data.task must be one of {sorted(FAMILIES)}, got {name!r}")
    if name == "math":
        return MathFamily(answer_fallback)
    if name == "code":
        return CodeFamily.from_config(sandbox)
    return FAMILIES[name]()


__all__ = ["FAMILIES", "AsyncScoring", "CodeFamily", "DigitFamily", "MathFamily", "Scored", "TaskFamily",
           "TaskName", "get_family"]
