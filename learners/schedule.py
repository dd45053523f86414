"""Learning-rate schedules as pure functions of the training step (advanced once per training step)."""

from __future__ import annotations

import math


def lr_factor(step: int, warmup: int, total: int, schedule: str, min_ratio: float = 0.0) -> float:
    """Multiplier of the base lr for the update made at training step `step` (0-based).

    Linear warmup over `warmup` steps (step 0 gets 1/warmup), then constant or cosine decay from 1 to
    `min_ratio` at step `total - 1`.
    """
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    span = max(total - warmup - 1, 1)
    progress = min(max(step - warmup, 0) / span, 1.0)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


SCHEDULES = ("cosine", "constant")
