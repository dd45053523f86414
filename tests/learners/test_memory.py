"""The learner memory model's arithmetic against hand-computed and published figures: Qwen3's
parameter counts (its model cards), the LoRA and KV-cache sizes, DeepSpeed's ZeRO-2 formula, and
how each setting moves a term."""

import dataclasses

import pytest

from jobs.models.shape import qwen3_shape
from learners.compute.memory import GIB, LearnerSetup, export_transient, learner_memory, mask_entries

# Qwen3 model cards: total and non-embedding parameters (billions).
PUBLISHED = {"0.6b": (0.6, 0.44), "1.7b": (1.7, 1.4), "4b": (4.0, 3.6)}
GPU = LearnerSetup(tokens=40960, lora_rank=64, zero_stage=2, ranks=1, checkpointing=True,
                   logits_chunk=1024, role_rows=0, device="gpu")


@pytest.mark.parametrize("size", PUBLISHED)
def test_qwen3_parameter_counts_match_the_model_cards(size):
    s = qwen3_shape(size)
    total, non_embedding = PUBLISHED[size]
    assert s.params() / 1e9 == pytest.approx(total, rel=0.03)
    assert (s.params() - s.vocab * s.hidden) / 1e9 == pytest.approx(non_embedding, rel=0.03)


def test_lora_and_kv_sizes():
    s = qwen3_shape("0.6b")
    # r·L·(7h + 2·n_q·d + 2·n_kv·d + 3I) = 64·28·(7168 + 4096 + 2048 + 9216)
    assert s.lora_params(64) == 64 * 28 * 22528
    assert s.kv_bytes_per_token(2) == 112 * 1024  # 2·28·8·128·2
    assert qwen3_shape("4b").kv_bytes_per_token(2) == 144 * 1024


def test_zero2_model_states_follow_deepspeeds_estimator():
    s = qwen3_shape("1.7b")
    full = dataclasses.replace(GPU, lora_rank=0, ranks=4)
    m = learner_memory(s, full)
    p = s.params()
    assert m.weights + m.gradients + m.optimizer == pytest.approx(2 * p + 18 * p / 4)
    lora = learner_memory(s, GPU)  # frozen bf16 base, 18 bytes per adapter parameter on one rank
    assert lora.weights == pytest.approx(2 * (p + s.lora_params(64)))
    assert lora.gradients + lora.optimizer == pytest.approx(18 * s.lora_params(64))


def test_the_export_transient_is_the_largest_module_and_the_buckets_not_the_model():
    """ZeRO-3 exports module by module (learners/state/export.py): the largest module (Qwen3-4B: the
    embedding, 151,936 × 2,560) gathered and copied on rank 0, plus two sync buckets in flight; it shows in
    the peak only where it exceeds the micro-batch's activations and logits, gone by then."""
    s = qwen3_shape("4b")
    assert s.largest_module_params() == 151936 * 2560
    zero3 = dataclasses.replace(GPU, zero_stage=3, lora_rank=0, sync_bucket_bytes=1 << 30)
    assert export_transient(s, zero3) == pytest.approx(2 * 2 * 151936 * 2560 + 2 * (1 << 30))
    assert export_transient(s, zero3) < 0.5 * 2 * s.params()  # the old all-at-once gather: the whole model
    # ZeRO-2 holds whole weights: the buckets alone
    assert export_transient(s, dataclasses.replace(zero3, zero_stage=2)) == 2 * (1 << 30)
    m = learner_memory(s, zero3)
    assert m.export == max(0.0, export_transient(s, zero3) - m.activations - m.logits)
    tiny_batch = learner_memory(s, dataclasses.replace(zero3, tokens=16))
    assert tiny_batch.export > 0 and tiny_batch.total() > learner_memory(
        s, dataclasses.replace(zero3, tokens=16, sync_bucket_bytes=0)).total()


def test_activations_at_the_budget_with_and_without_checkpointing():
    s = qwen3_shape("0.6b")
    off = learner_memory(s, dataclasses.replace(GPU, checkpointing=False)).activations
    on = learner_memory(s, GPU).activations
    # (8h + 6(n_q+n_kv)d + 8I) · L · T = 51,200 · 28 · 40,960 bytes, about 59 GB
    assert off == 51200 * 28 * 40960
    assert on == 2 * 1024 * 28 * 40960 + 51200 * 40960  # each layer's input, plus one layer recomputed
    assert on < off / 10


def test_attention_masks_follow_padding_free():
    """Padded rows: each layer's copy of a [rows, 1, T, T] mask in the compute dtype (2 bytes bf16 on a GPU, 4
    fp32 on the CPU), at most tokens · min(longest row, tokens / 2) entries; packed rows: one [N, N] block on
    the CPU, none on a GPU (flash-attention's varlen kernel). Tokens are the same either way."""
    s, n, width = qwen3_shape("0.6b"), 8192, 2048
    padded = dataclasses.replace(GPU, tokens=n, longest_row=width, checkpointing=False)

    def mask(setup: LearnerSetup) -> float:  # the activations less those of rows of one length (no mask)
        return (
            learner_memory(s, setup).activations
            - learner_memory(s, dataclasses.replace(setup, longest_row=0, padding_free=False)).activations
        )

    assert mask(padded) == n * width * s.layers * 2
    assert mask(dataclasses.replace(padded, checkpointing=True)) == n * width * 2  # one layer recomputed
    assert mask(dataclasses.replace(padded, padding_free=True)) == 0
    cpu = dataclasses.replace(padded, device="cpu", zero_stage=0)
    assert mask(cpu) == n * width * s.layers * 4
    assert mask(dataclasses.replace(cpu, padding_free=True)) == n * n * s.layers * 4
    # One row alone pads nothing: the widest padded micro-batch is two rows of half the budget.
    assert mask_entries(dataclasses.replace(padded, longest_row=n)) == 2 * (n // 2) ** 2


def test_the_learner_builds_the_masks_the_model_counts(monkeypatch):
    """The masks mask_entries counts are those transformers hands sdpa for the learner's rows: [rows, 1, T, T]
    padded, none for rows of one length, [1, 1, N, N] packed (learners.compute.padding_free.pack)."""
    import torch
    from transformers import AutoModelForCausalLM

    from jobs.models.resolve import resolve_model
    from learners.compute.padding_free import pack

    model = AutoModelForCausalLM.from_pretrained(resolve_model("builtin:tiny"), attn_implementation="sdpa")
    sdpa, seen = torch.nn.functional.scaled_dot_product_attention, []

    def spy(*args, attn_mask=None, **kwargs):
        seen.append(None if attn_mask is None else tuple(attn_mask.shape))
        return sdpa(*args, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    ids = torch.randint(1, 100, (3, 10))
    attention = torch.ones(3, 10, dtype=torch.bool)
    model(input_ids=ids, attention_mask=attention, use_cache=False)
    assert seen[-1] is None
    attention[1, 7:], attention[2, 4:] = False, False
    model(input_ids=ids, attention_mask=attention, use_cache=False)
    assert seen[-1] == (3, 1, 10, 10)
    packed, positions, _ = pack(ids, attention)
    model(input_ids=packed, position_ids=positions, use_cache=False)
    assert seen[-1] == (1, 1, 21, 21)  # N = 10 + 7 + 4


def test_logits_chunk_bounds_the_head_whatever_the_budget():
    s = qwen3_shape("4b")
    small, large = (learner_memory(s, dataclasses.replace(GPU, tokens=t)).logits for t in (8192, 40960))
    assert small == large == 12 * 1024 * 151936
    whole = learner_memory(s, dataclasses.replace(GPU, logits_chunk=0)).logits
    # the [T, V] logits alone do not fit an 80 GB GPU
    assert whole == 16 * 40960 * 151936 and whole / GIB > 90


def test_role_gradient_buffer_is_roles_by_trainable_parameters():
    s = qwen3_shape("0.6b")
    m = learner_memory(s, dataclasses.replace(GPU, role_rows=3))
    assert m.role_grads == 4 * 3 * s.lora_params(64)


def test_shapes_come_from_config_json_a_builtin_spec_or_a_qwen3_name(tmp_path):
    import json

    from jobs.models.shape import shape_of

    (tmp_path / "config.json").write_text(json.dumps({
        "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 1000, "tie_word_embeddings": False}))
    s = shape_of(str(tmp_path))
    assert (s.layers, s.head_dim, s.vocab, s.tied) == (2, 16, 1000, False)
    assert shape_of("builtin:qwen3-4b-shape?vocab=151936&layers=2") == qwen3_shape("4b", layers=2)
    assert shape_of("/nowhere/Qwen3-1.7B") == qwen3_shape("1.7b")
    with pytest.raises(ValueError, match="model.path='/nowhere/other'"):
        shape_of("/nowhere/other")
