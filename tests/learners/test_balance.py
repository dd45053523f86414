"""verl's length-balanced order (learners/update/balance.py) and verl's mini-batch cutting
(learners/update/ppo_plan.Cut): hand computed examples, and references written from the algorithms'
descriptions (differencing on numbers, the light-heavy-light walk, verl's dispatch-then-split)."""

import random

import pytest
import torch

from learners.update.balance import balanced_order, largest_differencing, light_heavy_light, verl_workload
from learners.update.ppo_plan import Cut, plan_update


def test_workload_by_hand():
    assert verl_workload(10) == 24576 * 10 + 100 == 245860
    assert verl_workload(0) == 0


def test_partition_and_order_by_hand():
    # Sorted (value, row): (1,1) (2,3) | (3,4) (4,2) | (5,0) (6,5): three states of spread 1. Equal spreads
    # pop the heaviest part first: {6} {5}, then {4} {3}: merged {6,3} {5,4} (9, 9). Then {2} {1} (spread 1)
    # pops before it (spread 0): {2}+{5,4}=11, {1}+{6,3}=10. Parts heaviest first: rows {0,2,3}, {1,4,5}.
    w = [5, 1, 4, 2, 3, 6]
    assert largest_differencing(w, 2) == [[0, 2, 3], [1, 4, 5]]
    # Sorted by value: rows 3 (2), 2 (4), 0 (5) -> evens [3, 0] + odds reversed [2];
    # rows 1, 4, 5 -> [1, 5] + [4].
    assert [light_heavy_light(p, w) for p in largest_differencing(w, 2)] == [[3, 0, 2], [1, 5, 4]]
    # By lengths the workloads are near-linear in L: the same parts here (11 vs 10 tokens), rank 0's first.
    assert balanced_order([5, 1, 4, 2, 3, 6], 2) == [3, 0, 2, 1, 5, 4]


def test_a_row_count_that_does_not_split_is_padded_with_empty_rows():
    # Workloads w1 w2 w3 and a pad row of 0 (row 3): states {w1}{0} (spread w1) and {w3}{w2} (spread w3
    # - w2, larger) merge {w3}+{0}, {w2}+{w1}: 73737 > 73733, so rank 0 holds rows 2 and 3 (the pad,
    # left out), rank 1 rows 0, 1.
    assert balanced_order([1, 2, 3], 2) == [2, 0, 1]
    assert balanced_order([], 2) == []
    assert balanced_order([7], 2) == [0]


def differencing_spread(values: list[int]) -> int:
    """Two-way equal-size largest differencing on numbers alone: the sorted values paired neighbour by
    neighbour, then the two largest differences replaced by their difference until one is left."""
    ranked = sorted(values)
    diffs = [ranked[i + 1] - ranked[i] for i in range(0, len(ranked), 2)]
    while len(diffs) > 1:
        diffs.sort()
        a, b = diffs.pop(), diffs.pop()
        diffs.append(a - b)
    return diffs[0]


@pytest.mark.parametrize("seed", range(20))
def test_two_way_partition_matches_differencing_on_numbers(seed):
    rng = random.Random(seed)
    w = [rng.randint(1, 10_000) for _ in range(2 * rng.randint(1, 60))]
    parts = largest_differencing(w, 2)
    assert sorted(parts[0] + parts[1]) == list(range(len(w))) and len(parts[0]) == len(parts[1])
    sums = [sum(w[i] for i in p) for p in parts]
    assert sums[0] >= sums[1] and sums[0] - sums[1] == differencing_spread(w)


def walk_light_heavy_light(rows: list[int], w: list[int]) -> list[int]:
    """The order by its description: lightest first, each next-heavier row alternately appended to the front
    run and put before the back run, so the heaviest rows meet in the middle."""
    front: list[int] = []
    back: list[int] = []
    for n, i in enumerate(sorted(rows, key=lambda i: (w[i], i))):
        if n % 2 == 0:
            front.append(i)
        else:
            back.insert(0, i)
    return front + back


@pytest.mark.parametrize("seed", range(10))
def test_light_heavy_light_matches_its_description(seed):
    rng = random.Random(seed)
    w = [rng.randint(1, 20) for _ in range(rng.randint(0, 30))]  # ties broken by row
    rows = rng.sample(range(len(w)), len(w))
    assert light_heavy_light(rows, w) == walk_light_heavy_light(rows, w)


def global_rows(plan_steps: list[list[int]], rows: list[int]) -> list[list[int]]:
    return [sorted(rows[i] for i in step) for step in plan_steps]


def test_verl_mini_batches_by_hand():
    # The batch in verl's order [3, 0, 2, 1, 5, 4] (rank 0: 3 0 2, rank 1: 1 5 4); M = 2 over W = 2 ranks: one
    # row per rank per mini-batch, in order: {3, 1}, {0, 5}, {2, 4}, on one real rank.
    order = balanced_order([5, 1, 4, 2, 3, 6], 2)
    mask = torch.ones(6, 3, dtype=torch.bool)
    (rows,), (plan,) = plan_update(
        mask,
        torch.ones(6, dtype=torch.bool),
        1,
        2,
        1,
        "seq_mean_token_mean",
        0,
        None,
        shuffle=False,
        cut=Cut(ranks=2, fixed=True),
    )
    assert global_rows(plan.steps, [order[i] for i in rows]) == [[1, 3], [0, 5], [2, 4]]


def verl_split(rows: int, ranks: int, mini: int) -> list[list[int]]:
    """verl's mini-batches by its description: the batch dispatched to the ranks in contiguous
    slices (the first rows % ranks one row longer), each rank's slice cut in order into pieces of
    mini / ranks rows and a remainder;
    mini-batch k is every rank's piece k."""
    out: list[list[int]] = []
    start = 0
    for r in range(ranks):
        size = rows // ranks + (r < rows % ranks)
        for k, first in enumerate(range(start, start + size, mini // ranks)):
            if k == len(out):
                out.append([])
            out[k].extend(range(first, min(first + mini // ranks, start + size)))
        start += size
    return out or [[]]


@pytest.mark.parametrize("rows, ranks, mini", [(2048, 2, 512), (2560, 2, 512), (1100, 2, 512), (37, 2, 8),
                                               (10, 3, 6), (5, 2, 16)])
def test_verl_mini_batches_match_dispatch_then_split(rows, ranks, mini):
    mask = torch.ones(rows, 2, dtype=torch.bool)
    (got,), (plan,) = plan_update(
        mask,
        torch.ones(rows, dtype=torch.bool),
        1,
        mini,
        1,
        "seq_mean_token_mean",
        0,
        None,
        shuffle=False,
        cut=Cut(ranks=ranks, fixed=True, nominal=True),
    )
    assert [sorted(got[i] for i in step) for step in plan.steps] == [
        sorted(s) for s in verl_split(rows, ranks, mini)
    ]
    assert plan.normalizers == [float(mini)] * len(plan.steps)  # nominal: M rows, a partial one too


def test_cutting_as_the_learners_own_ranks_changes_nothing():
    mask = torch.ones(9, 2, dtype=torch.bool)
    args = (mask, torch.ones(9, dtype=torch.bool), 2, 4, 2, "token_mean", 3, None)
    assert plan_update(*args) == plan_update(*args, cut=Cut(ranks=2))


def test_shared_voting_batch_is_length_stratified_into_role_shares():
    # benchmarks/minibatch_roles.py's synthetic step, smaller: the aggregator's rows (its prompt holds the
    # three answers) are the longest, so verl's order puts them into the middle mini-batches; in the given
    # order every mini-batch holds a quarter.
    from benchmarks.minibatch_roles import mini_batches, voting_rows

    roles, lengths, _ = voting_rows(128, 0)
    given = mini_batches(len(roles), 128, False, Cut(), 0)
    order = balanced_order(lengths, 2)
    verl = [[order[i] for i in s] for s in mini_batches(len(roles), 128, False, Cut(2, fixed=True), 0)]

    def shares(steps):
        return [sum(roles[i] == "aggregator" for i in s) / len(s) for s in steps]

    assert shares(given) == [0.25] * 4
    first, second, third, last = shares(verl)
    assert first < 0.1 and last < 0.1 and second > 0.4 and third > 0.4
