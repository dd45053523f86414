"""LoRA wrapping and the merged weight view the learner hands to engines and checkpoints."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from cluster.sketch import sketch, sketch_error
from jobs.config import load_config
from jobs.models.resolve import resolve_model
from learners.state.weights import (
    MergedSketch,
    is_lora,
    load_policy_model,
    merge_for_serving,
    merge_layer,
    update_lost,
)

LORA = [  # scale = alpha / rank = 2
    "model.lora.enabled=true", "model.lora.rank=4", "model.lora.alpha=8", "model.lora.dropout=0.0",
    "model.lora.target_modules=all-linear", "model.dtype=float32",
]


@pytest.fixture(scope="module")
def model_path():
    return resolve_model("builtin:tiny")


@pytest.fixture
def lora_model(model_path):
    torch.manual_seed(0)
    return load_policy_model(model_path, "float32", load_config("jobs/configs/tiny.yaml", LORA).model.lora)


def test_is_lora(model_path, lora_model):
    plain_lora_cfg = load_config("jobs/configs/tiny.yaml", ["model.lora.enabled=false"]).model.lora
    plain = load_policy_model(model_path, "float32", plain_lora_cfg)
    assert is_lora(lora_model)
    assert not is_lora(plain)


def test_merge_for_serving_equals_hand_merged_layer(model_path, lora_model):
    base = AutoModelForCausalLM.from_pretrained(model_path).state_dict()
    layer = lora_model.get_base_model().model.layers[1].mlp.down_proj
    with torch.no_grad():  # lora_B starts at 0 (no delta); give it values so the merge is visible
        layer.lora_B["default"].weight.normal_(0.0, 0.1)
    a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight  # [r, in], [out, r]
    assert a.shape[0] == b.shape[1] == 4

    merged = merge_for_serving(lora_model)[0]

    key = "model.layers.1.mlp.down_proj.weight"
    expected = base[key] + (b @ a) * (8 / 4)
    assert torch.allclose(merged[key], expected, atol=1e-6)
    assert (merged[key] - base[key]).abs().max() > 1e-3  # the delta is not negligible
    assert set(merged) == set(base)  # base HF names, no base_layer / lora_ keys
    for k in set(base) - {key}:  # every other adapter still has B = 0; embeddings and norms untouched
        assert torch.equal(merged[k], base[k]), k
    assert torch.equal(layer.get_base_layer().weight, base[key])  # the model itself is not mutated


def test_merge_for_serving_of_plain_model_is_its_state_dict(model_path):
    plain = AutoModelForCausalLM.from_pretrained(model_path)
    merged = merge_for_serving(plain)[0]
    state = plain.state_dict()
    assert set(merged) == set(state)
    assert all(torch.equal(merged[k], state[k]) for k in state)
    assert not any(v.requires_grad for v in merged.values())


def _lost(base: torch.Tensor, delta: torch.Tensor, dtype: torch.dtype) -> float:
    _, err, upd = merge_layer(base, delta, dtype)
    return update_lost(err.item(), upd.item())


@pytest.mark.parametrize(("delta", "bf16_lost"), [
    (2.0 ** -10, 1.0),  # below half of bf16's spacing at 1 (2^-7): 1 + 2^-10 rounds back to 1, all of it lost
    # 1 + 5·2^-9 rounds to 1 + 2^-7: an error of 2^-9 per entry, 1/5 of the update
    (2.0 ** -7 + 2.0 ** -9, 0.2),
    (0.5, 0.0),  # 1.5 is a bf16 number: the update arrives whole
])
def test_merge_rounding_hand_checked(delta, bf16_lost):
    base = torch.ones(3, 4, dtype=torch.bfloat16)
    update = torch.full((3, 4), delta)
    merged, _, upd = merge_layer(base, update, torch.bfloat16)
    assert merged.dtype == torch.bfloat16 and torch.equal(merged, (base.float() + update).to(torch.bfloat16))
    assert upd.item() == pytest.approx(12 * delta ** 2)
    assert _lost(base, update, torch.bfloat16) == pytest.approx(bf16_lost, abs=1e-12)
    assert _lost(base.float(), update, torch.float32) == 0.0  # every one of these sums is exact in fp32


def test_merge_rounding_is_taken_over_all_layers_together():
    """A layer that keeps its update (||ΔW||² = 12·0.5²) and one that loses it (12·(2^-10)²): the error is the
    second layer's whole update, over the norm of both updates."""
    base, kept, lost = (
        torch.ones(3, 4, dtype=torch.bfloat16),
        torch.full((3, 4), 0.5),
        torch.full((3, 4), 2.0**-10),
    )
    (_, e1, d1), (_, e2, d2) = (
        merge_layer(base, kept, torch.bfloat16),
        merge_layer(base, lost, torch.bfloat16),
    )
    expected = (2.0 ** -10) / (0.5 ** 2 + 2.0 ** -20) ** 0.5
    assert update_lost((e1 + e2).item(), (d1 + d2).item()) == pytest.approx(expected, rel=1e-12)
    assert update_lost(0.0, 0.0) == 0.0  # no update yet (LoRA's B starts at 0)


@pytest.mark.parametrize(("dtype", "scale", "expect"), [
    ("bfloat16", 1e-6, (0.99, 1.0)),  # far below bf16's resolution of W0: the engines would serve the base
    ("bfloat16", 1.0, (0.0, 0.01)),  # a large update survives bf16 up to its rounding
    ("float32", 1e-2, (0.0, 1e-4)),
])
def test_merge_for_serving_reports_the_rounding(model_path, dtype, scale, expect):
    torch.manual_seed(0)
    model = load_policy_model(model_path, dtype, load_config("jobs/configs/tiny.yaml", LORA).model.lora)
    layers = [m for m in model.get_base_model().modules() if hasattr(m, "lora_B")]
    with torch.no_grad():
        for layer in layers:
            layer.lora_B["default"].weight.normal_(0.0, scale)
    merged, lost = merge_for_serving(model)
    assert expect[0] <= lost <= expect[1]
    layer = model.get_base_model().model.layers[0].self_attn.q_proj
    w0, a, b = layer.get_base_layer().weight, layer.lora_A["default"].weight, layer.lora_B["default"].weight
    # The merge is taken in fp32 and rounded once to the serving dtype.
    expected = (w0.float() + (b.float() @ a.float()) * 2.0).to(w0.dtype)
    assert merged["model.layers.0.self_attn.q_proj.weight"].dtype == w0.dtype
    assert torch.equal(merged["model.layers.0.self_attn.q_proj.weight"], expected)
    assert merge_for_serving(AutoModelForCausalLM.from_pretrained(model_path))[1] is None  # no LoRA, no merge


def test_the_merged_sketch_is_the_merges_without_merging_and_keeps_the_frozen_bases(lora_model):
    with torch.no_grad():
        for name, p in lora_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.1)
    sketcher = MergedSketch()
    merged = merge_for_serving(lora_model)[0]
    got = sketcher(lora_model)
    assert list(got) == list(merged)  # the served names, in the merge's order
    # fp32 summation order only
    assert max(sketch_error(got[n], sketch(n, w)) for n, w in merged.items()) < 1e-6
    down = lora_model.get_base_model().model.layers[1].mlp.down_proj
    kept = got["model.layers.1.mlp.down_proj.weight"]
    with torch.no_grad():
        down.lora_B["default"].weight.mul_(2)  # an adapter step: only the low-rank term moves
        down.base_layer.weight.add_(1.0)  # a write to the base: its kept sketch must not be reused
    again = sketcher(lora_model)["model.layers.1.mlp.down_proj.weight"]
    expected = sketch("model.layers.1.mlp.down_proj.weight", merge_for_serving(lora_model)[0][
        "model.layers.1.mlp.down_proj.weight"])
    assert sketch_error(again, expected) < 1e-6 and sketch_error(kept, expected) > 1e-2
