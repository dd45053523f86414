"""Hand-computed checks of grouping keys and group-relative advantage estimators."""

import math

import pytest
import torch

from learners.update.advantages import (
    ADVANTAGE_ESTIMATORS,
    group_keys,
    grpo_advantages,
    keys_to_ids,
    rloo_advantages,
)
from marl.types import Completion, Episode, Task, Turn


def _turn(role: str, agent: str, rnd: int = 0) -> Turn:
    return Turn(role, agent, rnd, [], Completion("", [1], [2], [-0.5]))


def _voting(sample: int, task_id: str = "t1") -> Episode:
    turns = [_turn("generator", f"generator{k}") for k in range(3)] + [_turn("aggregator", "aggregator")]
    return Episode(Task(task_id, "q", "a"), sample, "voting", turns)


def _eval_opt(sample: int) -> Episode:
    turns = [_turn("generator", "generator", 0), _turn("evaluator", "evaluator", 0)]
    turns += [_turn("generator", "generator", 1), _turn("evaluator", "evaluator", 1)]
    return Episode(Task("t9", "q", "a"), sample, "eval_opt", turns)


# Two groups, interleaved: g0 = rewards [1, 0, 1, 0] (mean 0.5, unbiased std sqrt(1/3)),
# g1 = [2, 4] (mean 3, unbiased std sqrt(2)).
REWARDS = torch.tensor([1.0, 2.0, 0.0, 4.0, 1.0, 0.0])
IDS = torch.tensor([0, 1, 0, 1, 0, 0])


def test_grpo_without_std_norm_is_reward_minus_group_mean():
    adv = grpo_advantages(REWARDS, IDS, norm_std=False)
    assert torch.allclose(adv, torch.tensor([0.5, -1.0, -0.5, 1.0, 0.5, -0.5]))


def test_grpo_with_std_norm_divides_by_unbiased_group_std():
    adv = grpo_advantages(REWARDS, IDS, norm_std=True, eps=0.0)
    a, b = 0.5 * math.sqrt(3.0), 1.0 / math.sqrt(2.0)  # 0.866025, 0.707107
    assert torch.allclose(adv, torch.tensor([a, -b, -a, b, a, -a]), atol=1e-6)
    with_eps = grpo_advantages(REWARDS, IDS, norm_std=True)  # default eps=1e-6 barely moves it
    assert torch.allclose(with_eps, adv, atol=1e-5)


def test_grpo_singleton_group_and_constant_group_get_zero():
    adv = grpo_advantages(
        torch.tensor([3.0, 1.0, 2.0, 5.0, 5.0]), torch.tensor([0, 1, 1, 2, 2]), norm_std=True
    )
    assert torch.allclose(adv, torch.tensor([0.0, -1 / math.sqrt(2), 1 / math.sqrt(2), 0.0, 0.0]), atol=1e-5)
    assert not torch.isnan(adv).any()


def test_grpo_singleton_group_gets_its_reward_as_verl():
    # verl's GRPO: a one-member group's mean is 0 and its std 1, so A = (r - 0) / (1
    # + eps), or r - 0 without std.
    rewards, ids = torch.tensor([3.0, 1.0, 2.0, 5.0, 5.0]), torch.tensor([0, 1, 1, 2, 2])
    adv = grpo_advantages(rewards, ids, norm_std=True, singleton="reward")
    assert torch.allclose(
        adv, torch.tensor([3.0 / (1 + 1e-6), -1 / math.sqrt(2), 1 / math.sqrt(2), 0.0, 0.0]), atol=1e-5
    )
    assert adv[0].item() == pytest.approx(3.0 / (1 + 1e-6), rel=1e-7)
    plain = grpo_advantages(rewards, ids, norm_std=False, singleton="reward")
    assert torch.equal(plain, torch.tensor([3.0, -0.5, 0.5, 0.0, 0.0]))
    with pytest.raises(ValueError, match="rloo"):
        rloo_advantages(rewards, ids, singleton="reward")


def verl_grpo(rewards: list[float], ids: list[int], eps: float = 1e-6) -> list[float]:
    """verl 0.6.1's compute_grpo_outcome_advantage as its description reads: per group its
    scores' mean and (unbiased) std, a group of one taking mean 0 and std 1; every score becomes
    (score - mean) / (std + eps)."""
    groups: dict[int, list[float]] = {}
    for r, g in zip(rewards, ids, strict=True):
        groups.setdefault(g, []).append(r)
    stats = {}
    for g, xs in groups.items():
        mean = sum(xs) / len(xs)
        stats[g] = (
            (0.0, 1.0)
            if len(xs) == 1
            else (mean, math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)))
        )
    return [(r - stats[g][0]) / (stats[g][1] + eps) for r, g in zip(rewards, ids, strict=True)]


def test_grpo_with_singletons_as_verl_matches_its_description():
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 12, (40,), generator=gen)  # some groups of one, some of several
    rewards = torch.randint(0, 2, (40,), generator=gen).float()
    got = grpo_advantages(rewards, ids, norm_std=True, singleton="reward")
    assert torch.allclose(got, torch.tensor(verl_grpo(rewards.tolist(), ids.tolist())), atol=1e-5)
    assert (torch.bincount(ids) == 1).any()  # the draw holds a singleton


def test_grpo_accepts_arbitrary_id_values_and_empty_input():
    adv = grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 4.0]), torch.tensor([7, 3, 7, 3]), norm_std=False)
    assert torch.equal(adv, torch.tensor([0.5, -2.0, -0.5, 2.0]))
    empty = grpo_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.long), norm_std=True)
    assert empty.shape == (0,)


def test_rloo_is_reward_minus_mean_of_the_others():
    adv = rloo_advantages(torch.cat([REWARDS, torch.tensor([9.0])]), torch.cat([IDS, torch.tensor([5])]))
    # g0: 1 − 1/3, 0 − 2/3; g1: 2 − 4, 4 − 2; singleton → 0
    third = 2.0 / 3.0
    assert torch.allclose(adv, torch.tensor([third, -2.0, -third, 2.0, third, -third, 0.0]))


def test_estimators_are_selectable_by_name():
    assert set(ADVANTAGE_ESTIMATORS) == {"grpo", "rloo"}
    adv = ADVANTAGE_ESTIMATORS["rloo"](torch.tensor([2.0, 4.0]), torch.tensor([0, 0]), norm_std=False)
    assert torch.equal(adv, torch.tensor([-2.0, 2.0]))


def test_group_keys_voting_two_samples_give_four_groups_of_two():
    episodes = [_voting(0), _voting(1)]
    keys = group_keys(episodes, ("task", "agent"))
    assert keys[:4] == [
        ("t1", "generator0"),
        ("t1", "generator1"),
        ("t1", "generator2"),
        ("t1", "aggregator"),
    ]
    assert keys[4:] == keys[:4]
    ids = keys_to_ids(keys)
    assert ids.tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    assert torch.bincount(ids).tolist() == [2, 2, 2, 2]


def test_group_keys_default_pools_eval_opt_rounds_and_round_splits_them():
    episodes = [_eval_opt(0), _eval_opt(1)]
    assert keys_to_ids(group_keys(episodes)).tolist() == [0, 1, 0, 1] * 2
    by_round = keys_to_ids(group_keys(episodes, ("task", "role", "round")))
    assert by_round.tolist() == [0, 1, 2, 3] * 2


def test_group_keys_by_role_pools_parallel_agents_and_tasks_stay_apart():
    episodes = [_voting(0), _voting(1), _voting(0, task_id="t2")]
    ids = keys_to_ids(group_keys(episodes, ("task", "role")))
    assert ids.tolist() == [0, 0, 0, 1, 0, 0, 0, 1, 2, 2, 2, 3]


def test_group_keys_rejects_unknown_fields():
    with pytest.raises(ValueError, match="group_by"):
        group_keys([_voting(0)], ("task", "sample"))
