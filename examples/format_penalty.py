"""A reward-shaping hook: a turn that gives no \\boxed{} answer earns the episode's reward less a penalty.

Use it for any role whose turns must end in \\boxed{...} (answers, verdicts, choices), e.g.
    marl.reward_shaping.generator=examples.format_penalty.boxed_or_penalty
A hook is `hook(episode, turn) -> float`: that turn's reward in place of the episode's (marl/rewards.py).
"""

from __future__ import annotations

from marl.tasks.math import last_boxed
from marl.types import Episode, Turn

PENALTY = 0.1


def boxed_or_penalty(episode: Episode, turn: Turn) -> float:
    """The episode's reward, less PENALTY when `turn` wrote no \\boxed{} answer."""
    return episode.reward - (PENALTY if last_boxed(turn.text) is None else 0.0)
