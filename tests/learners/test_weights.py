"""LoRA wrapping and the merged weight view the learner hands to engines and checkpoints."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from jobs.config import load_config
from jobs.models import resolve_model
from learners.weights import is_lora, load_policy_model, merged_state_dict

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


def test_merged_state_dict_equals_hand_merged_layer(model_path, lora_model):
    base = AutoModelForCausalLM.from_pretrained(model_path).state_dict()
    layer = lora_model.get_base_model().model.layers[1].mlp.down_proj
    with torch.no_grad():  # lora_B starts at 0 (no delta); give it values so the merge is visible
        layer.lora_B["default"].weight.normal_(0.0, 0.1)
    a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight  # [r, in], [out, r]
    assert a.shape[0] == b.shape[1] == 4

    merged = merged_state_dict(lora_model)

    key = "model.layers.1.mlp.down_proj.weight"
    expected = base[key] + (b @ a) * (8 / 4)
    assert torch.allclose(merged[key], expected, atol=1e-6)
    assert (merged[key] - base[key]).abs().max() > 1e-3  # the delta is not negligible
    assert set(merged) == set(base)  # base HF names, no base_layer / lora_ keys
    for k in set(base) - {key}:  # every other adapter still has B = 0; embeddings and norms untouched
        assert torch.equal(merged[k], base[k]), k
    assert torch.equal(layer.get_base_layer().weight, base[key])  # the model itself is not mutated


def test_merged_state_dict_of_plain_model_is_its_state_dict(model_path):
    plain = AutoModelForCausalLM.from_pretrained(model_path)
    merged = merged_state_dict(plain)
    state = plain.state_dict()
    assert set(merged) == set(state)
    assert all(torch.equal(merged[k], state[k]) for k in state)
    assert not any(v.requires_grad for v in merged.values())
