"""Which tensors a partial vLLM reload must carry (rollout.vllm.readback.whole_modules): pure, no vLLM."""

from __future__ import annotations

from rollout.vllm.readback import vllm_module, whole_modules

PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
ATTN = "model.layers.3.self_attn"
NAMES = [f"{ATTN}.{p}_proj.{leaf}" for p in "qkvo" for leaf in ("weight", "bias")] + [
    "model.layers.3.mlp.gate_proj.weight",
    "model.layers.3.mlp.up_proj.weight",
    "model.layers.3.mlp.down_proj.weight",
    "model.embed_tokens.weight",
    "model.norm.weight",
]


def test_each_tensor_maps_to_the_module_vllm_loads_it_into():
    assert vllm_module(f"{ATTN}.k_proj.bias", PACKED) == f"{ATTN}.qkv_proj"
    assert vllm_module("model.layers.3.mlp.up_proj.weight", PACKED) == "model.layers.3.mlp.gate_up_proj"
    assert vllm_module(f"{ATTN}.o_proj.weight", PACKED) == f"{ATTN}.o_proj"
    assert vllm_module("model.norm.weight", PACKED) == "model.norm"
    assert vllm_module("lm_head.weight", {}) == "lm_head"


def test_a_changed_part_brings_every_tensor_of_its_fused_module_and_nothing_else():
    assert whole_modules(NAMES, [f"{ATTN}.q_proj.weight"], PACKED) == [
        f"{ATTN}.{p}_proj.{leaf}" for p in "qkv" for leaf in ("weight", "bias")]
    assert whole_modules(NAMES, ["model.layers.3.mlp.up_proj.weight", f"{ATTN}.o_proj.weight"], PACKED) == [
        f"{ATTN}.o_proj.weight", f"{ATTN}.o_proj.bias", "model.layers.3.mlp.gate_proj.weight",
        "model.layers.3.mlp.up_proj.weight"]
    assert whole_modules(NAMES, [], PACKED) == []
    # A model without fused modules: each tensor is its own module's alone.
    assert whole_modules(NAMES, [f"{ATTN}.q_proj.weight"], {}) == [
        f"{ATTN}.q_proj.weight",
        f"{ATTN}.q_proj.bias",
    ]
