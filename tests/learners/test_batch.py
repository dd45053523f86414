"""Hand-built episodes → TrainBatch: masks, alignment, policy split, truncation, slicing round trips."""

import dataclasses
import pickle
from collections import defaultdict
from collections.abc import Mapping

import pytest
import torch

from learners.batch import (
    STAT_KEYS,
    RoleDropError,
    TrainBatch,
    build_batches,
    check_role_drops,
    empty_batch,
    flat_rewards,
)
from marl.policy_map import PolicyMap
from marl.types import Completion, Episode, Task, Turn

PAD = 0
# every policy's pad id (build_batches pads each policy with its own tokenizer's)
PADS: Mapping[str, int] = defaultdict(lambda: PAD)
ROLES = ["generator", "evaluator"]


def _turn(role, prompt, response, logprobs, reward, rnd=0):
    return Turn(role, role, rnd, [], Completion("", prompt, response, logprobs), reward=reward)


def _episodes():
    """Flat order: gen [1,2|3,4,5], eval [6|7,8], gen [1,2|9], eval [6,7,8|] (empty → dropped)."""
    task = Task("t1", "q", "a")
    ep0 = Episode(
        task,
        0,
        "eval_opt",
        [
            _turn("generator", [1, 2], [3, 4, 5], [-0.1, -0.2, -0.3], 1.0),
            _turn("evaluator", [6], [7, 8], [-0.4, -0.5], 1.0),
        ],
    )
    ep1 = Episode(
        task,
        1,
        "eval_opt",
        [
            _turn("generator", [1, 2], [9], [-0.6], 0.0),
            _turn("evaluator", [6, 7, 8], [], [], 0.0, rnd=1),
        ],
    )
    return [ep0, ep1]


ADV = torch.tensor([0.1, 0.2, 0.3, 0.4])


def _per_role(**counts: tuple[int, int, int, int]) -> dict[str, int]:
    """role=(rows, dropped_empty, dropped_truncated, truncated) -> the per-role stats keys."""
    return {f"{key}/{role}": n for role, ns in counts.items() for key, n in zip(STAT_KEYS, ns, strict=True)}


def _assert_same(a: TrainBatch, b: TrainBatch):
    for f in dataclasses.fields(a):
        v, w = getattr(a, f.name), getattr(b, f.name)
        k = f.name
        assert torch.equal(v, w) if isinstance(v, torch.Tensor) else v == w, k


def _generator_batch() -> TrainBatch:
    return build_batches(_episodes(), PolicyMap.isolated(ROLES), ADV, PADS)[0]["generator"]


def test_isolated_map_splits_rows_with_masks_over_responses_and_aligned_logprobs():
    batches, stats = build_batches(_episodes(), PolicyMap.isolated(ROLES), ADV, PADS)
    assert list(batches) == ["generator", "evaluator"]
    assert stats == {
        "batch/rows": 3,
        "batch/dropped_empty": 1,
        "batch/dropped_truncated": 0,
        "batch/truncated": 0,
        **_per_role(generator=(2, 0, 0, 0), evaluator=(1, 1, 0, 0)),
    }
    gen = batches["generator"]
    assert gen.input_ids.tolist() == [[1, 2, 3, 4, 5], [1, 2, 9, 0, 0]]
    assert gen.attention_mask.tolist() == [[True] * 5, [True, True, True, False, False]]
    assert gen.loss_mask.tolist() == [[False, False, True, True, True], [False, False, True, False, False]]
    assert torch.allclose(gen.rollout_logprobs, torch.tensor([[0, 0, -0.1, -0.2, -0.3], [0, 0, -0.6, 0, 0]]))
    assert torch.allclose(gen.advantages, torch.tensor([0.1, 0.3]))
    assert gen.rewards.tolist() == [1.0, 0.0] and gen.roles == ["generator"] * 2
    assert int(gen.loss_mask.sum()) == 4 and len(gen) == 2 and gen.pad_id == PAD
    ev = batches["evaluator"]
    assert ev.input_ids.tolist() == [[6, 7, 8]] and ev.loss_mask.tolist() == [[False, True, True]]
    assert torch.allclose(ev.rollout_logprobs, torch.tensor([[0.0, -0.4, -0.5]]))
    assert torch.allclose(ev.advantages, torch.tensor([0.2])) and ev.agents == ["evaluator"]


def test_each_policy_is_padded_with_its_own_tokenizers_pad_id():
    """Policies on different base models: the generator's tokenizer pads with 0, the evaluator's with 100."""
    episodes = _episodes()
    episodes[1].turns[1] = _turn("evaluator", [6], [7], [-0.7], 0.0, rnd=1)
    batches, _ = build_batches(episodes, PolicyMap.isolated(ROLES), ADV, {"generator": 0, "evaluator": 100})
    assert batches["generator"].input_ids.tolist() == [[1, 2, 3, 4, 5], [1, 2, 9, 0, 0]]
    assert batches["evaluator"].input_ids.tolist() == [[6, 7, 8], [6, 7, 100]]
    assert (batches["generator"].pad_id, batches["evaluator"].pad_id) == (0, 100)


def test_shared_map_gives_one_batch_in_flat_order():
    batches, _ = build_batches(_episodes(), PolicyMap.shared(ROLES), ADV, {"shared": -1})
    assert list(batches) == ["shared"]
    b = batches["shared"]
    assert b.roles == ["generator", "evaluator", "generator"]
    assert b.input_ids.tolist() == [[1, 2, 3, 4, 5], [6, 7, 8, -1, -1], [1, 2, 9, -1, -1]]
    assert torch.allclose(b.advantages, torch.tensor([0.1, 0.2, 0.3]))
    assert int(b.loss_mask.sum()) == 6 and not b.loss_mask[:, 0].any()


def test_policy_without_rows_is_absent():
    pmap = PolicyMap.isolated(["generator", "evaluator", "aggregator"])
    assert list(build_batches(_episodes(), pmap, ADV, PADS)[0]) == ["generator", "evaluator"]


def test_max_len_truncates_from_the_right_and_drops_rows_without_response():
    batches, stats = build_batches(_episodes(), PolicyMap.isolated(ROLES), ADV, PADS, max_len=4)
    gen = batches["generator"]
    assert gen.input_ids.tolist() == [[1, 2, 3, 4], [1, 2, 9, 0]]
    assert gen.loss_mask.tolist() == [[False, False, True, True], [False, False, True, False]]
    assert torch.allclose(gen.rollout_logprobs, torch.tensor([[0, 0, -0.1, -0.2], [0, 0, -0.6, 0]]))
    assert stats["batch/truncated"] == 1
    batches, stats = build_batches(_episodes(), PolicyMap.isolated(ROLES), ADV, PADS, max_len=2)
    assert list(batches) == ["evaluator"] and batches["evaluator"].input_ids.tolist() == [[6, 7]]
    assert stats == {
        "batch/rows": 1,
        "batch/dropped_empty": 1,
        "batch/dropped_truncated": 2,
        "batch/truncated": 1,
        **_per_role(generator=(0, 0, 2, 0), evaluator=(1, 1, 0, 1)),
    }


def test_a_prompt_over_the_cap_trains_no_row_and_is_counted_for_its_role():
    # Prompts: generator 2 and 2 tokens, evaluator 1 and 3 (the second evaluator turn is empty anyway).
    batches, stats = build_batches(_episodes(), PolicyMap.isolated(ROLES), ADV, PADS, max_prompt_len=1)
    assert list(batches) == ["evaluator"] and batches["evaluator"].input_ids.tolist() == [[6, 7, 8]]
    assert stats == {
        "batch/rows": 1,
        "batch/dropped_empty": 1,
        "batch/dropped_truncated": 2,
        "batch/truncated": 0,
        **_per_role(generator=(0, 0, 2, 0), evaluator=(1, 1, 0, 0)),
    }
    # A prompt exactly at the cap is kept whole.
    batches, stats = build_batches(_episodes(), PolicyMap.isolated(ROLES), ADV, PADS, max_prompt_len=2)
    assert batches["generator"].input_ids.tolist() == [[1, 2, 3, 4, 5], [1, 2, 9, 0, 0]]
    assert stats["batch/dropped_truncated"] == 0 and stats["batch/rows/generator"] == 2


def test_roles_without_turns_still_have_their_keys():
    _, stats = build_batches(_episodes(), PolicyMap.isolated([*ROLES, "aggregator"]), ADV, PADS)
    assert [stats[f"{k}/aggregator"] for k in STAT_KEYS] == [0, 0, 0, 0]


def _stats(role: str, rows: int, lost: int, empty: int = 0) -> dict[str, int]:
    return {
        f"batch/rows/{role}": rows,
        f"batch/dropped_truncated/{role}": lost,
        f"batch/dropped_empty/{role}": empty,
    }


def test_check_role_drops_names_the_role_that_lost_the_largest_share():
    stats = {**_stats("generator", rows=90, lost=10), **_stats("evaluator", rows=18, lost=2, empty=5)}
    check_role_drops(stats, step=3, max_frac=0.1)  # 10/100 and 2/20: at the limit, not over it
    # 3/20 = 0.15; empty responses are not length losses
    stats |= _stats("evaluator", rows=17, lost=3, empty=5)
    msg = r"role 'evaluator' lost 3 of 20 rows to length caps in step 3 \(algo.max_role_drop_frac=0.1\)"
    with pytest.raises(RoleDropError, match=msg):
        check_role_drops(stats, step=3, max_frac=0.1)
    check_role_drops(stats, step=3, max_frac=0.15)
    check_role_drops(_stats("evaluator", rows=0, lost=4), step=0, max_frac=1.0)  # 1 never stops
    with pytest.raises(RoleDropError, match="lost 4 of 4"):
        check_role_drops(_stats("evaluator", rows=0, lost=4), step=0, max_frac=0.99)
    check_role_drops({**_stats("generator", 0, 0), "batch/dropped_truncated": 0}, step=0, max_frac=0.0)


def test_build_batches_validates_lengths():
    with pytest.raises(ValueError, match="advantages"):
        build_batches(_episodes(), PolicyMap.isolated(ROLES), ADV[:3], PADS)
    bad = _episodes()
    bad[0].turns[0].completion.logprobs.pop()
    with pytest.raises(ValueError, match="logprobs"):
        build_batches(bad, PolicyMap.isolated(ROLES), ADV, PADS)


def test_flat_rewards_in_flat_order():
    assert flat_rewards(_episodes()).tolist() == [1.0, 1.0, 0.0, 0.0]


def test_select_reorders_and_trims_trailing_padding():
    gen = _generator_batch()
    one = gen.select([1])
    assert one.input_ids.tolist() == [[1, 2, 9]] and one.loss_mask.tolist() == [[False, False, True]]
    swapped = gen.select(torch.tensor([1, 0]))
    assert swapped.input_ids.shape == (2, 5) and torch.allclose(swapped.advantages, torch.tensor([0.3, 0.1]))
    _assert_same(gen.select(torch.tensor([False, True])), one)


def test_shard_is_contiguous_balanced_and_concat_restores():
    batches, _ = build_batches(_episodes(), PolicyMap.shared(ROLES), ADV, PADS)
    b = batches["shared"]
    shards = [b.shard(r, 2) for r in range(2)]
    assert [len(s) for s in shards] == [2, 1] and shards[1].roles == ["generator"]
    assert shards[1].input_ids.tolist() == [[1, 2, 9]]
    _assert_same(TrainBatch.concat(shards), b)
    assert sum(int(s.loss_mask.sum()) for s in shards) == int(b.loss_mask.sum())


def test_empty_shard_has_shape_zero_by_one_and_concat_ignores_it():
    gen = _generator_batch().select([0])
    empty = gen.shard(1, 2)
    assert len(empty) == 0 and empty.input_ids.shape == (0, 1) and empty.loss_mask.shape == (0, 1)
    assert int(empty.loss_mask.sum()) == 0 and empty.roles == [] and empty.advantages.shape == (0,)
    _assert_same(TrainBatch.concat([gen.shard(0, 2), empty]), gen)
    _assert_same(empty_batch("generator", pad_id=PAD), empty)
    assert not empty_batch("p") and empty_batch("p").shard(0, 3).input_ids.shape == (0, 1)
    with pytest.raises(ValueError, match="rank"):
        gen.shard(2, 2)


def test_micro_batches_round_trip_and_pad_to_min_count():
    batches, _ = build_batches(_episodes(), PolicyMap.shared(ROLES), ADV, PADS)
    b = batches["shared"]
    mbs = b.micro_batches(2)
    assert [len(m) for m in mbs] == [2, 1]
    _assert_same(TrainBatch.concat(mbs), b)
    assert [len(m) for m in b.micro_batches(2, min_count=4)] == [2, 1, 0, 0]
    assert [m.input_ids.shape for m in b.shard(3, 4).micro_batches(2)] == [(0, 1)]


def test_concat_rejects_mixed_policies_and_pickle_round_trip():
    batches, _ = build_batches(_episodes(), PolicyMap.isolated(ROLES), ADV, PADS)
    with pytest.raises(ValueError, match="policy_id"):
        TrainBatch.concat([batches["generator"], batches["evaluator"]])
    # What crossing Ray does to a batch: a TrainBatch comes back whole.
    _assert_same(pickle.loads(pickle.dumps(batches["generator"])), batches["generator"])


def test_inconsistent_shapes_are_rejected():
    gen = _generator_batch()
    with pytest.raises(ValueError, match="loss_mask"):
        dataclasses.replace(gen, loss_mask=gen.loss_mask[:, :3])


def _of_lengths(lengths):
    """A shared-policy batch whose row i holds lengths[i] tokens (1 prompt token, the rest response)."""
    rows = [_turn("generator", [1], list(range(2, n + 1)), [-0.1] * (n - 1), 1.0) for n in lengths]
    episodes = [Episode(Task(f"t{i}", "q", "a"), 0, "eval_opt", [t]) for i, t in enumerate(rows)]
    batches, _ = build_batches(episodes, PolicyMap.shared(ROLES), torch.ones(len(lengths)), PADS)
    return batches["shared"]


def test_longest_first_orders_rows_by_length_and_cuts_padding():
    """Rows of lengths 2, 6, 3, 5 (ties keep their order): longest first is [1, 3, 2, 0]. Chunked in pairs, as
    given they pad to 2·6 + 2·5 = 22 cells, longest first to 2·6 + 2·3 = 18."""
    b = _of_lengths([2, 6, 3, 5])
    assert b.attention_mask.sum(-1).tolist() == [2, 6, 3, 5]
    assert b.longest_first() == [1, 3, 2, 0] and b.longest_first([0, 2]) == [2, 0]
    assert _of_lengths([3, 3, 4]).longest_first() == [2, 0, 1]

    def padded_cells(batch):
        return sum(m.input_ids.numel() for m in batch.micro_batches(2))

    assert padded_cells(b) == 22
    assert padded_cells(b.select(b.longest_first())) == 18


def test_balanced_order_reorders_the_whole_batch_before_the_policy_split():
    # Turns of lengths (prompt + response) 5, 2, 4, 3 as generator, aggregator, generator,
    # aggregator. verl's order over 2 ranks: states {w3}{w2} (spread 24581) and {w5}{w4} (24585,
    # first): {w5}+{w2} = 172061 > {w4}+{w3} = 172057, so rank 0 holds rows 0, 1 (light first: 1, 0),
    # rank 1 rows 2, 3 (3, 2): [1, 0, 3, 2].
    def turn(role, n):
        return _turn(role, [1], [2] * (n - 1), [-0.1] * (n - 1), 0.0)

    episodes = [Episode(Task("t", "q", "a"), 0, "voting", [turn("generator", 5), turn("aggregator", 2),
                                                           turn("generator", 4), turn("aggregator", 3)])]
    adv = torch.tensor([1.0, 2.0, 3.0, 4.0])
    shared = PolicyMap.shared(["generator", "aggregator"])
    (batch,) = build_batches(episodes, shared, adv, PADS, balance_ranks=2)[0].values()
    given = build_batches(episodes, shared, adv, PADS)[0]["shared"]
    assert given.advantages.tolist() == [1.0, 2.0, 3.0, 4.0]
    assert batch.attention_mask.sum(-1).tolist() == [2, 5, 3, 4]
    assert (
        batch.advantages.tolist() == [2.0, 1.0, 4.0, 3.0] and batch.roles == ["aggregator", "generator"] * 2
    )
    isolated = build_batches(
        episodes, PolicyMap.isolated(["generator", "aggregator"]), adv, PADS, balance_ranks=2
    )[0]
    # each policy keeps the global order's rows
    assert isolated["generator"].advantages.tolist() == [1.0, 3.0]
