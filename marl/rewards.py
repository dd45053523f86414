"""Reward assignment: the episode's outcome reward goes to every turn, unless a role has a shaping hook."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from marl.types import Episode, Turn

# role -> hook(episode, turn) returning that turn's reward in place of the episode reward.
RewardShaping = Mapping[str, Callable[[Episode, Turn], float]]


def assign(episode: Episode, shaping: RewardShaping | None = None) -> Episode:
    """Set every turn's reward (in place) and return the episode for chaining."""
    hooks = shaping or {}
    for turn in episode.turns:
        hook = hooks.get(turn.role)
        turn.reward = float(hook(episode, turn)) if hook is not None else episode.reward
    return episode


def validate_shaping(shaping: RewardShaping | None, roles: Iterable[str]) -> None:
    """Reject hooks for roles the workflow does not have (a typo would silently shape nothing)."""
    roles = list(roles)
    unknown = sorted(set(shaping or {}) - set(roles))
    if unknown:
        raise ValueError(f"reward shaping names roles {unknown} the workflow lacks; its roles are {roles}")
