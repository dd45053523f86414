"""Advantage estimation: grouping turns into comparison groups and group-relative baselines.

Turns are addressed in one *flattened order* used everywhere learner-side: episodes in order, each
episode's turns in order. `group_keys` gives one key per turn in that order, `keys_to_ids` turns keys
into dense group ids, and an estimator from `ADVANTAGE_ESTIMATORS` maps (rewards, group ids) to one
advantage per turn. Everything here is a pure function; nothing reads global state.

    keys = group_keys(episodes, ("task", "agent"))  # or group_keys(episodes, ["paper"]), a preset
    adv = ADVANTAGE_ESTIMATORS["grpo"](flat_rewards(episodes), keys_to_ids(keys), norm_std=True)
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from enum import StrEnum

import torch
from torch import Tensor

from marl.registry import Registry
from marl.types import Episode, Turn
from marl.workflows import slot_roles

GROUP_FIELDS: dict[str, Callable[[Episode, Turn], Hashable]] = {
    "task": lambda ep, turn: ep.task.task_id,
    "agent": lambda ep, turn: turn.agent,
    "role": lambda ep, turn: turn.role,
    "round": lambda ep, turn: turn.round,
}
DEFAULT_GROUP_BY = ("task", "agent")


def paper_group_key(ep: Episode, turn: Turn) -> tuple[Hashable, ...]:
    """The GRPO group of one turn as in the paper (arXiv 2605.24202): (task_id, agent) when the turn's role is
    one of its workflow's slot roles (marl.workflows.slot_roles), else (task_id, role).

    So over the n samples of one prompt: voting has one group per generator slot (generator0, generator1,
    ... apart) plus the aggregator's; orch_workers pools worker0..k-1 into one `worker` group beside the
    orchestrator's and the synthesizer's; eval_opt has one group per role, across rounds; single_agent one.
    """
    agent_is_slot = turn.role in slot_roles(ep.workflow)
    return (ep.task.task_id, turn.agent if agent_is_slot else turn.role)


# A preset is a whole grouping rule named in place of the fields: group_by = ["paper"].
GROUP_PRESETS: dict[str, Callable[[Episode, Turn], tuple[Hashable, ...]]] = {"paper": paper_group_key}


def group_keys(
    episodes: list[Episode], group_by: Sequence[str] = DEFAULT_GROUP_BY
) -> list[tuple[Hashable, ...]]:
    """One key per (episode, turn) in flattened order.

    `group_by` is either fields, the key holding them in order: 'task' (episode.task.task_id), 'agent'
    (turn.agent), 'role' (turn.role), 'round'; or one preset of GROUP_PRESETS alone (['paper']). With the
    default ('task', 'agent') the n samples of one prompt form one group per agent instance: generator0
    and generator1 are separate groups, while one agent's repeated turns (eval_opt rounds) pool into one.
    """
    if len(group_by) == 1 and group_by[0] in GROUP_PRESETS:
        preset = GROUP_PRESETS[group_by[0]]
        return [preset(ep, turn) for ep in episodes for turn in ep.turns]
    unknown = [f for f in group_by if f not in GROUP_FIELDS]
    if unknown or not group_by:
        raise ValueError(f"group_by must be a non-empty subset of {list(GROUP_FIELDS)} or one preset of "
                         f"{list(GROUP_PRESETS)}, got {list(group_by)}")
    getters = [GROUP_FIELDS[f] for f in group_by]
    return [tuple(get(ep, turn) for get in getters) for ep in episodes for turn in ep.turns]


def keys_to_ids(keys: Sequence[Hashable]) -> Tensor:
    """Dense group ids [N] (long), numbered in order of first appearance of each key."""
    index: dict[Hashable, int] = {}
    return torch.tensor([index.setdefault(k, len(index)) for k in keys], dtype=torch.long)


def _group_stats(values: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-element (group count, group sum, unbiased group std), each [N], without python loops.

    Std uses Bessel's correction (n − 1), as torch.std and verl's GRPO do; it is 0 for singletons.
    """
    _, dense = torch.unique(group_ids, return_inverse=True)
    num_groups = int(dense.max()) + 1 if dense.numel() else 0
    values = values.to(torch.float32)
    counts = torch.zeros(num_groups, dtype=values.dtype).index_add_(0, dense, torch.ones_like(values))
    sums = torch.zeros(num_groups, dtype=values.dtype).index_add_(0, dense, values)
    mean = (sums / counts)[dense]
    sq_dev = torch.zeros(num_groups, dtype=values.dtype).index_add_(0, dense, (values - mean) ** 2)
    std = (sq_dev / (counts - 1).clamp(min=1)).sqrt()
    return counts[dense], sums[dense], std[dense]


class SingletonAdvantage(StrEnum):
    """`algo.singleton_advantage`: a one-member GRPO group's advantage: 0 (no row to compare with), or verl's
    reward (its GRPO takes a singleton's mean as 0 and std as 1)."""

    zero = "zero"
    reward = "reward"


def grpo_advantages(rewards: Tensor, group_ids: Tensor, norm_std: bool = True, eps: float = 1e-6,
                    singleton: str = "zero") -> Tensor:
    """GRPO: A_i = (r_i − mean_g) / (std_g + eps) if norm_std else r_i − mean_g.

    rewards [N] float, group_ids [N] long (any values; equal id = same group) → advantages [N] float32.
    std_g is the unbiased (n − 1) group std. Singleton groups get advantage 0, or with `singleton="reward"`
    verl's mean 0 and std 1: r_i / (1 + eps) if norm_std else r_i. A group whose rewards are all equal gets 0
    (0 / eps), never NaN.
    """
    counts, sums, std = _group_stats(rewards, group_ids)
    r = rewards.to(torch.float32)
    adv = r - sums / counts
    if norm_std:
        adv = adv / (std + eps)
    alone = r / (1 + eps) if norm_std else r
    return torch.where(counts > 1, adv, alone if singleton == "reward" else torch.zeros_like(adv))


def rloo_advantages(rewards: Tensor, group_ids: Tensor, norm_std: bool = False, eps: float = 1e-6,
                    singleton: str = "zero") -> Tensor:
    """RLOO: A_i = r_i − mean of the other members of i's group; optionally / (std_g + eps).

    rewards [N] float, group_ids [N] long → advantages [N] float32. Singleton groups get 0 (leave-one-out has
    no other member; `singleton` must be "zero"). Equals n / (n − 1) · (r_i − mean_g), i.e. GRPO's centring
    rescaled per group size.
    """
    if singleton != "zero":
        raise ValueError(
            f"rloo has no baseline for a one-member group; singleton must be 'zero', got {singleton!r}"
        )
    counts, sums, std = _group_stats(rewards, group_ids)
    r = rewards.to(torch.float32)
    adv = r - (sums - r) / (counts - 1).clamp(min=1)
    if norm_std:
        adv = adv / (std + eps)
    return torch.where(counts > 1, adv, torch.zeros_like(adv))


# Selected by name from config (validated at load): fn(rewards, group_ids, norm_std, eps, singleton) -> [N].
class AdvantageEstimator(StrEnum):
    """`algo.advantage`: the names of ADVANTAGE_ESTIMATORS (the config schema's type for the key)."""

    grpo = "grpo"
    rloo = "rloo"


ADVANTAGE_ESTIMATORS: Registry[Callable[..., Tensor]] = Registry("algo.advantage", {
    "grpo": grpo_advantages,
    "rloo": rloo_advantages,
}, names=AdvantageEstimator)
