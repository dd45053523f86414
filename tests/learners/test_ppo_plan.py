"""PPO mini-batch planning (learners/update/ppo_plan.py), checked by hand: step counts, per-rank
chunks, normalisers counted before zero-advantage rows are dropped, seeded shuffles, and the
parallel-agent mini-batch size."""

import pytest
import torch

from learners.update.losses import LOSS_AGGREGATIONS
from learners.update.ppo_plan import (
    Cut,
    UpdatePlan,
    contiguous_shards,
    effective_mini_batch_size,
    mean_and_last,
    num_mini_batches,
    plan_update,
    split_even,
)


def mask_of(lengths: list[int]) -> torch.Tensor:
    """Aligned loss mask [B, max] with `lengths[i]` loss tokens in row i."""
    out = torch.zeros(len(lengths), max(lengths), dtype=torch.bool)
    for i, n in enumerate(lengths):
        out[i, :n] = True
    return out


def test_number_of_mini_batches():
    assert num_mini_batches(512, 0) == 1  # 0: the whole batch
    assert num_mini_batches(512, 512) == 1
    assert num_mini_batches(1536, 512) == 3  # voting's three generator slots under isolated
    assert num_mini_batches(513, 512) == 2
    assert num_mini_batches(0, 512) == 1  # an empty batch still takes its step


def test_split_even_and_shards():
    assert split_even(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert split_even([1], 2) == [[1], []]
    assert contiguous_shards(5, 2) == [range(0, 3), range(3, 5)]


def test_one_rank_whole_batch_is_todays_single_step():
    rows, plans = plan_update(
        mask_of([3, 1, 2]), torch.ones(3, dtype=torch.bool), 1, 0, 1, "token_mean", 5, None
    )
    assert rows == [[0, 1, 2]]
    assert plans == [UpdatePlan([[0, 1, 2]], [6.0], None, 1)]  # in order, normaliser = all 6 loss tokens


def test_two_mini_batches_on_one_rank_by_hand():
    lengths = [1, 2, 3, 4, 5, 6]
    rows, plans = plan_update(
        mask_of(lengths), torch.ones(6, dtype=torch.bool), 1, 3, 1, "token_mean", 0, ["g"]
    )
    (plan,) = plans
    assert rows == [list(range(6))] and len(plan.steps) == 2
    assert sorted(plan.steps[0] + plan.steps[1]) == list(range(6))  # every row once per epoch
    assert plan.steps[0] != [0, 1, 2]  # shuffled (seeded)
    # Each step's normaliser is its own rows' loss tokens.
    assert plan.normalizers == [float(sum(lengths[i] for i in s)) for s in plan.steps]
    assert plan.roles == ["g"]


def test_shuffle_is_seeded_and_epochs_reshuffle():
    args = (mask_of([1] * 8), torch.ones(8, dtype=torch.bool), 1, 4, 2, "token_mean")
    _, (a,) = plan_update(*args, 7, None)
    _, (b,) = plan_update(*args, 7, None)
    _, (c,) = plan_update(*args, 8, None)
    assert a == b and a.steps != c.steps
    assert len(a.steps) == 4 and a.epochs == 2  # 2 mini-batches × 2 epochs
    assert a.steps[:2] != a.steps[2:]  # the second epoch reshuffles


def test_zero_advantage_rows_count_in_the_normaliser_and_are_sent_for_metrics_only():
    keep = torch.tensor([True, False, True, True])
    rows, plans = plan_update(mask_of([2, 5, 1, 1]), keep, 1, 0, 1, "token_mean", 0, None)
    assert rows == [[0, 2, 3, 1]]  # row 1 comes last, after the training rows
    # in no step, but its 5 tokens normalise
    assert plans[0].steps == [[0, 1, 2]] and plans[0].normalizers == [9.0]
    assert plans[0].metric_rows == [3]  # and it gets the metrics-only pass
    _, (whole,) = plan_update(
        mask_of([2, 5]), torch.ones(2, dtype=torch.bool), 1, 0, 1, "token_mean", 0, None
    )
    assert whole.metric_rows is None  # nothing dropped anywhere: no metrics-only pass


def test_a_rank_without_dropped_rows_still_gets_an_empty_metric_pass():
    # Ranks that communicate inside forward must run the same passes: a rank whose
    # shard lost no row runs idle ones.
    keep = torch.tensor([True, True, False, True])
    _, plans = plan_update(mask_of([1, 1, 1, 1]), keep, 2, 0, 1, "token_mean", 0, None)
    assert [p.metric_rows for p in plans] == [[], [1]]


def test_in_order_split_by_hand():
    # verl's data.split: no shuffle, consecutive chunks; the same chunks every epoch, on every seed.
    rows, plans = plan_update(
        mask_of([1] * 7), torch.ones(7, dtype=torch.bool), 1, 3, 2, "token_mean", 5, None, shuffle=False
    )
    assert plans[0].steps == [[0, 1, 2], [3, 4], [5, 6]] * 2
    _, plans2 = plan_update(mask_of([1] * 8), torch.ones(8, dtype=torch.bool), 2, 4, 1, "token_mean", 9, None,
                            shuffle=False)
    assert [p.steps for p in plans2] == [[[0, 1], [2, 3]], [[0, 1], [2, 3]]]  # each rank cuts its own shard


def test_two_ranks_split_each_mini_batch_and_share_its_normaliser():
    lengths = [1, 2, 3, 4, 5, 6, 7, 8]
    rows, plans = plan_update(
        mask_of(lengths), torch.ones(8, dtype=torch.bool), 2, 4, 1, "seq_mean_token_mean", 3, None
    )
    assert rows == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [len(p.steps) for p in plans] == [2, 2]
    assert all(len(s) == 2 for p in plans for s in p.steps)  # 4 rows per mini-batch, 2 on each rank
    assert plans[0].normalizers == plans[1].normalizers == [4.0, 4.0]  # seq_mean: rows with loss tokens


def test_effective_mini_batch_size_counts_parallel_agents_once():
    gen3 = torch.full((12,), 1 / 3)  # an isolated generator policy: 3 slots × 4 rows, weights 1/3
    assert effective_mini_batch_size(4, gen3) == 12  # one mini-batch: the steps of one generator
    shared = torch.tensor([1 / 3] * 12 + [1.0] * 4)  # a shared policy: 3 generators + an aggregator
    assert effective_mini_batch_size(4, shared) == 8  # 16 rows / 8 = 2 steps, as 4 + 4 rows of one agent each
    assert effective_mini_batch_size(0, gen3) == 0
    assert effective_mini_batch_size(4, torch.ones(8)) == 4


def test_mean_and_last():
    out = mean_and_last([{"a": 1.0, "b": 4.0}, {"a": 3.0}])
    assert out == {"a": 2.0, "last/a": 3.0, "b": 4.0, "last/b": 4.0}


@pytest.mark.parametrize("world", [1, 3])
def test_every_kept_row_trains_exactly_once_per_epoch(world):
    keep = torch.tensor([i % 3 != 0 for i in range(20)])
    rows, plans = plan_update(mask_of([2] * 20), keep, world, 6, 2, "token_mean", 1, None)
    for r, plan in zip(rows, plans, strict=True):
        trained = len(r) - len(plan.metric_rows or [])
        for epoch in range(2):
            per_epoch = plan.steps[epoch * 4:(epoch + 1) * 4]
            assert sorted(i for s in per_epoch for i in s) == list(range(trained))
        assert all(not keep[r[i]] for i in plan.metric_rows or [])
    assert sorted(g for r in rows for g in r) == list(range(20))


def test_fixed_chunks_and_nominal_normaliser_by_hand():
    # 7 rows, M = 3, in order: even chunks 3 / 2 / 2; verl's fixed chunks 3 / 3 / 1.
    # seq_mean_token_mean's actual normaliser is each mini-batch's rows; the nominal one is M = 3 for
    # all, the last one (1 row) down-weighted.
    args = (mask_of([1] * 7), torch.ones(7, dtype=torch.bool), 1, 3, 1, "seq_mean_token_mean", 0, None)
    _, (even,) = plan_update(*args, shuffle=False)
    _, (fixed,) = plan_update(*args, shuffle=False, cut=Cut(fixed=True))
    _, (nominal,) = plan_update(*args, shuffle=False, cut=Cut(fixed=True, nominal=True))
    assert even.steps == [[0, 1, 2], [3, 4], [5, 6]] and even.normalizers == [3.0, 2.0, 2.0]
    assert fixed.steps == [[0, 1, 2], [3, 4, 5], [6]] and fixed.normalizers == [3.0, 3.0, 1.0]
    assert nominal.steps == fixed.steps and nominal.normalizers == [3.0, 3.0, 3.0]
    with pytest.raises(ValueError, match="seq_mean_token_mean"):
        plan_update(mask_of([1] * 7), torch.ones(7, dtype=torch.bool), 1, 3, 1, "token_mean", 0, None,
                    cut=Cut(nominal=True))


def test_nominal_normaliser_is_verls_rows_over_mini_batch_scale():
    # A partial mini-batch of 2 rows, M = 3. Per-token losses [1, 3] and [2, 0]: token means 2 and 1.
    # verl: the micro-batch's seq-mean-token-mean (1.5) scaled by rows / M (2 / 3) =
    # 1.0; here Σ token means / M.
    loss, mask = torch.tensor([[1.0, 3.0], [2.0, 0.0]]), torch.ones(2, 2, dtype=torch.bool)
    assert LOSS_AGGREGATIONS["seq_mean_token_mean"].reduce(loss, mask, 3.0).item() == pytest.approx(
        1.5 * 2 / 3
    )
    # actual
    assert LOSS_AGGREGATIONS["seq_mean_token_mean"].reduce(loss, mask, 2.0).item() == pytest.approx(1.5)
