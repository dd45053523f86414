"""Learning-rate schedules as pure functions of the schedule's position, and the position a
learner's scheduler is at (learner.optim.schedule_unit): training steps, optimizer steps, or
every policy's update calls."""

from __future__ import annotations

import math
from collections.abc import Callable

from learners.choices import Schedule
from learners.config import OptimConfig
from marl.registry import Registry


def lr_factor(step: int, warmup: int, total: int, schedule: str, min_ratio: float = 0.0, *,
              start_zero: bool = False, clamp: bool = True) -> float:
    """Multiplier of the base lr for the update made at schedule position `step` (0-based).

    Linear warmup over `warmup` steps: step 0 gets 1/warmup (or 0 with `start_zero`, verl's: s / warmup), then
    constant or cosine decay from 1 to `min_ratio`: at step `total - 1`, held there after it (`clamp`); or, as
    verl's get_cosine_schedule_with_warmup, at step `total`, the cosine running on past it (back to 1 at step
    warmup + 2·(total − warmup)).
    """
    if warmup > 0 and step < warmup:
        return (step if start_zero else step + 1) / warmup
    return SCHEDULES[schedule](step, warmup, total, min_ratio, clamp)


def _constant(step: int, warmup: int, total: int, min_ratio: float, clamp: bool) -> float:
    return 1.0


def _cosine(step: int, warmup: int, total: int, min_ratio: float, clamp: bool) -> float:
    if clamp:
        progress = min(max(step - warmup, 0) / max(total - warmup - 1, 1), 1.0)
    else:
        progress = (step - warmup) / max(total - warmup, 1)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


# After warmup: fn(step, warmup, total, min_ratio, clamp) -> the lr factor (lr_factor's arguments).
SCHEDULES: Registry[Callable[[int, int, int, float, bool], float]] = Registry(
    "learner.optim.schedule", {"cosine": _cosine, "constant": _constant}, names=Schedule)


def schedule_position(ticks: int, unit: str, policies: int = 1, index: int = 0) -> int:
    """The schedule position after `ticks` scheduler steps of a learner: one tick per training step
    (step, update_call) or per optimizer step (optimizer_step). update_call: one schedule shared by
    the `policies` policies' update calls, policy `index` being called index-th in each training
    step: ticks·policies + index."""
    return ticks * policies + index if unit == "update_call" else ticks


def lr_lambda(optim: OptimConfig, total: int, policies: int = 1, index: int = 0) -> Callable[[int], float]:
    """The LambdaLR multiplier of a learner's scheduler, from its `learner.optim` section
    (schedule, warmup_steps, min_lr_ratio, schedule_unit, warmup_start_zero, cosine_clamp) and the
    run's `total` training steps."""

    def factor(ticks: int) -> float:
        position = schedule_position(ticks, optim.schedule_unit, policies, index)
        return lr_factor(position, optim.warmup_steps, total, optim.schedule, optim.min_lr_ratio,
                         start_zero=optim.warmup_start_zero, clamp=optim.cosine_clamp)

    return factor
