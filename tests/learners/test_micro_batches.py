"""Micro-batches by token budget (learners/update/micro_batches.py): the hard cap, the fewest groups, balance,
padding, the error naming the key, the config check, and the same update as row-count micro-batches."""

import pytest
import torch

from jobs.config import ConfigError, load_config
from learners.compute.padding_free import pack, packed_index
from learners.update.micro_batches import micro_batch_rows, padding
from tests.builders import rows_batch
from tests.learners.test_learner import ROWS, grads, update
from tests.learners.test_logprob_head import _learner


def _cost(lengths, group):
    return len(group) * max(lengths[i] for i in group)


def test_budget_groups_hold_the_cap_cover_every_row_once_and_are_balanced():
    lengths = [100, 7, 60, 55, 30, 30, 29, 5, 61, 100]
    groups = micro_batch_rows(lengths, size=2, budget=200)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    assert all(_cost(lengths, g) <= 200 for g in groups)
    # Longest first: [100, 100] | [61, 60, 55] | [30, 30, 29, 7, 5] is the fewest (3); the cap lowered to 200
    # keeps 3, and no group mixes a 100-token row with short ones.
    assert [sorted(lengths[i] for i in g) for g in groups] == [[100, 100], [55, 60, 61], [5, 7, 29, 30, 30]]


def test_balancing_lowers_the_largest_group_without_adding_groups():
    lengths = [10] * 9  # the greedy cut under 80 gives 8 + 1 rows; balanced, 5 + 4
    groups = micro_batch_rows(lengths, size=1, budget=80)
    assert [len(g) for g in groups] == [5, 4]


def test_packed_rows_count_their_tokens_only():
    # padded, 160 holds [100] | [60, 40] | [30, 30, 20]; packed, two groups
    lengths = [100, 60, 40, 30, 30, 20]
    assert [sorted(lengths[i] for i in g) for g in micro_batch_rows(lengths, 1, 160, packed=True)] == [
        [60, 100], [20, 30, 30, 40]]
    assert len(micro_batch_rows(lengths, 1, 160)) == 3


def test_row_count_mode_and_empty():
    assert micro_batch_rows([3, 1, 2], size=2, budget=0) == [[0, 1], [2]]
    assert micro_batch_rows([], size=2, budget=0) == micro_batch_rows([], size=2, budget=10) == []


def test_a_row_over_the_budget_names_the_key():
    with pytest.raises(ValueError, match="learner.max_tokens_per_micro_batch=8 is below a row of 9 tokens"):
        micro_batch_rows([3, 9], size=1, budget=8)


def test_padding_counts_positions_as_memory_sees_them():
    assert padding([4, 2, 3]) == (3, 12) and padding([]) == (0, 0)


def test_config_refuses_a_budget_below_the_row_cap():
    with pytest.raises(ConfigError, match="learner.max_tokens_per_micro_batch must be 0"):
        load_config("jobs/configs/tiny.yaml", ["algo.max_len=512", "learner.max_tokens_per_micro_batch=100"])
    assert load_config("jobs/configs/tiny.yaml", ["algo.max_len=512",
                                                  "learner.max_tokens_per_micro_batch=512"]).learner


def test_a_token_budget_gives_the_update_of_row_count_micro_batches():
    by_rows, by_tokens = (
        _learner("learner.micro_batch_size=6"),
        _learner("learner.max_tokens_per_micro_batch=16", "algo.max_len=16"),
    )
    batch = rows_batch(ROWS)  # rows of 7, 4, 7, 7, 4, 4 tokens: three micro-batches of at most 16 tokens
    m_rows, m_tokens = update(by_rows, batch), update(by_tokens, batch)
    for a, b in zip(grads(by_rows), grads(by_tokens), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    assert m_tokens.sums.loss == pytest.approx(m_rows.sums.loss, rel=1e-5, abs=1e-7)
    assert m_tokens.step.grad_norm == pytest.approx(m_rows.step.grad_norm, rel=1e-5)
    # One micro-batch of 6 rows × 7 = 42 positions holds 33 tokens; [7, 7] | [7, 4] | [4, 4] hold them in 36.
    assert m_rows.sums.padded_positions / m_rows.sums.positions == pytest.approx(9 / 42)
    assert m_tokens.sums.padded_positions / m_tokens.sums.positions == pytest.approx(3 / 36)


def test_packing_bookkeeping_keeps_every_target_in_its_row():
    batch = rows_batch(ROWS[:3])  # lengths 7, 4, 7
    ids, positions, offsets = pack(batch.input_ids, batch.attention_mask)
    assert offsets.tolist() == [0, 7, 11] and ids.shape == positions.shape == (1, 18)
    assert positions[0].tolist() == [*range(7), *range(4), *range(7)]
    index = packed_index(batch.loss_mask, offsets)
    # Each loss token's predictor is its own row's previous token: the packed row's next id is the target.
    assert torch.equal(ids[0, index + 1], batch.input_ids[:, 1:][batch.loss_mask[:, 1:]])
    assert index.tolist() == [2, 3, 4, 5, 8, 9, 14, 15, 16]


def test_padding_free_rows_give_the_padded_update():
    """On CPU the SDPA mask keeps packed rows apart (transformers' packed-sequence
    detection from position ids)."""
    padded, packed = _learner("learner.logits_chunk_tokens=4"), _learner("learner.logits_chunk_tokens=4",
                                                                         "learner.padding_free=true")
    batch = rows_batch(ROWS)
    m_padded, m_packed = update(padded, batch), update(packed, batch)
    for a, b in zip(grads(padded), grads(packed), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    assert m_packed.sums.loss == pytest.approx(m_padded.sums.loss, rel=1e-5, abs=1e-7)
    with pytest.raises(ConfigError, match="padding_free=true needs learner.logits_chunk_tokens"):
        load_config("jobs/configs/tiny.yaml", ["learner.padding_free=true", "learner.logits_chunk_tokens=0"])


def test_packed_rows_on_a_gpu_without_flash_attention_are_refused_naming_the_key():
    """The plan charges no [N, N] mask for packed rows on a GPU (flash-attention's varlen kernel): a GPU node
    without flash_attn must fail at load, not out of memory mid-update."""
    from learners.compute.padding_free import attention_implementation

    assert attention_implementation(False, cuda=True, flash_attn=False) is None
    # CPU: the [N, N] mask is planned
    assert attention_implementation(True, cuda=False, flash_attn=False) is None
    assert attention_implementation(True, cuda=True, flash_attn=True) == "flash_attention_2"
    with pytest.raises(RuntimeError, match="learner.padding_free"):
        attention_implementation(True, cuda=True, flash_attn=False)
