"""Reward assignment: the episode's outcome reward goes to every turn, unless a role has a shaping hook.

Hooks come from the config (`marl.reward_shaping`: role -> function path, loaded by `load_shaping`) or are
passed in directly; each is `hook(episode, turn) -> float`, that turn's reward in place of the episode's.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping

from marl.plugins import PluginError, load_function
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


def load_shaping(
    paths: Mapping[str, str], roles: Iterable[str]
) -> dict[str, Callable[[Episode, Turn], float]]:
    """role -> function path (`pkg.module.function`, `path/file.py:function`) → role -> hook. Raises
    ValueError naming the role when a role is not the workflow's, a path does not load, or the function cannot
    be called as hook(episode, turn)."""
    roles = list(roles)
    hooks = {}
    for role, path in paths.items():
        if role not in roles:  # a typo would silently shape nothing
            raise ValueError(f"{role}: the workflow has no role {role!r}; its roles are {roles}")
        try:
            hook = load_function(path)
        except PluginError as e:
            raise ValueError(f"{role}: {e}") from None
        try:
            inspect.signature(hook).bind(None, None)
        except TypeError:
            raise ValueError(f"{role}: {path} must take (episode, turn); its signature is "
                             f"{inspect.signature(hook)}") from None
        except ValueError:  # builtins without a signature: accepted as they are
            pass
        hooks[role] = hook
    return hooks
