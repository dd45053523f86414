"""The learner memory model's arithmetic against hand-computed and published figures: Qwen3's parameter counts
(its model cards), the LoRA and KV-cache sizes, DeepSpeed's ZeRO-2 formula, and how each setting moves a term."""

import dataclasses

import pytest

from jobs.models.shape import qwen3_shape
from learners.memory import GIB, LearnerSetup, learner_memory

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


def test_activations_at_the_budget_with_and_without_checkpointing():
    s = qwen3_shape("0.6b")
    off = learner_memory(s, dataclasses.replace(GPU, checkpointing=False)).activations
    on = learner_memory(s, GPU).activations
    # (8h + 6(n_q+n_kv)d + 8I) · L · T = 51,200 · 28 · 40,960 bytes, about 59 GB
    assert off == 51200 * 28 * 40960
    assert on == 2 * 1024 * 28 * 40960 + 51200 * 40960  # each layer's input, plus one layer recomputed
    assert on < off / 10


def test_logits_chunk_bounds_the_head_whatever_the_budget():
    s = qwen3_shape("4b")
    small, large = (learner_memory(s, dataclasses.replace(GPU, tokens=t)).logits for t in (8192, 40960))
    assert small == large == 12 * 1024 * 151936
    whole = learner_memory(s, dataclasses.replace(GPU, logits_chunk=0)).logits
    assert whole == 16 * 40960 * 151936 and whole / GIB > 90  # the [T, V] logits alone do not fit an 80 GB GPU


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
