"""rollout.vllm.readback on a stand-in of vLLM's model (no vllm needed): fused q/k/v and gate/up split back
into HF names at the config's sizes, packed CPU linears read through their GEMM, padded vocabularies, a tied
LM head read through its own kernel, and a changed served tensor showing in its sketch error under its HF name
(the real engine: tests/rollout/test_vllm_engine.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from cluster.sketch import SKETCH_RTOL, sketch, sketch_error
from rollout.vllm.readback import part_rows, served_errors, served_sketches

CONFIG = SimpleNamespace(num_attention_heads=4, num_key_value_heads=2, head_dim=8, hidden_size=24)
PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
HIDDEN, INTER, VOCAB, PADDED_VOCAB = 24, 40, 30, 64


class Linear(nn.Module):
    """A vLLM linear as the read-back sees it. `packed`: as on CPU, the weight lives only inside the GEMM
    kernel and the parameter is emptied."""

    def __init__(self, weight: torch.Tensor, packed: bool):
        super().__init__()
        self.output_size_per_partition, self.input_size_per_partition = weight.shape
        self.kernel = weight.clone()
        self.weight = nn.Parameter(torch.empty(0, dtype=weight.dtype) if packed else weight.clone(),
                                   requires_grad=False)  # vLLM keeps the dtype of an emptied weight
        self.quant_method = SimpleNamespace(apply=lambda layer, x, bias=None: x @ layer.served().T)

    def served(self) -> torch.Tensor:
        return self.kernel if self.weight.numel() == 0 else self.weight


class Embedding(nn.Module):
    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.org_vocab_size = weight.shape[0]
        padded = torch.zeros(PADDED_VOCAB, weight.shape[1])
        padded[:weight.shape[0]] = weight
        self.weight = nn.Parameter(padded, requires_grad=False)
        self.quant_method = SimpleNamespace()


class Head(nn.Module):
    """A tied LM head as on CPU: its parameter is the embedding's, its GEMM a packed copy taken when built."""

    def __init__(self, embedding: Embedding):
        super().__init__()
        self.org_vocab_size = embedding.org_vocab_size
        self.weight = embedding.weight
        self.kernel = embedding.weight.detach().clone()
        self.quant_method = SimpleNamespace(apply=lambda layer, x, bias=None: x @ layer.kernel.T)


def _hf_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    attn, mlp = "model.layers.0.self_attn", "model.layers.0.mlp"
    shapes = {"model.embed_tokens.weight": (VOCAB, HIDDEN), "model.norm.weight": (HIDDEN,),
              f"{attn}.q_proj.weight": (32, HIDDEN), f"{attn}.k_proj.weight": (16, HIDDEN),
              f"{attn}.v_proj.weight": (16, HIDDEN), f"{attn}.o_proj.weight": (HIDDEN, 32),
              f"{mlp}.gate_proj.weight": (INTER, HIDDEN), f"{mlp}.up_proj.weight": (INTER, HIDDEN),
              f"{mlp}.down_proj.weight": (HIDDEN, INTER)}
    return {name: torch.randn(shape, generator=g) for name, shape in shapes.items()}


def _served_model(w: dict[str, torch.Tensor], packed: bool, config=CONFIG) -> nn.Module:
    """vLLM's layout of `w`: q/k/v and gate/up stacked in fused linears, embeddings padded."""
    attn, mlp = "model.layers.0.self_attn", "model.layers.0.mlp"
    root = nn.Module()
    # plain attributes, as vLLM's
    root.config, root.packed_modules_mapping = config, PACKED  # type: ignore[assignment]
    modules = {
        "model.embed_tokens": Embedding(w["model.embed_tokens.weight"]),
        f"{attn}.qkv_proj": Linear(torch.cat([w[f"{attn}.{p}.weight"] for p in PACKED["qkv_proj"]]), packed),
        f"{attn}.o_proj": Linear(w[f"{attn}.o_proj.weight"], packed),
        f"{mlp}.gate_up_proj": Linear(
            torch.cat([w[f"{mlp}.{p}.weight"] for p in PACKED["gate_up_proj"]]), packed
        ),
        f"{mlp}.down_proj": Linear(w[f"{mlp}.down_proj.weight"], packed),
    }
    for path, module in modules.items():
        parent = root
        for part in path.split(".")[:-1]:
            if not hasattr(parent, part):
                parent.add_module(part, nn.Module())
            parent = getattr(parent, part)
        parent.add_module(path.rsplit(".", 1)[1], module)
    root.model.norm = nn.Module()  # type: ignore[method-assign]  # `model` is a submodule added above
    root.model.norm.weight = nn.Parameter(w["model.norm.weight"].clone(), requires_grad=False)
    return root


def test_part_rows_follow_the_config():
    assert part_rows(PACKED["qkv_proj"], CONFIG, 64) == [32, 16, 16]
    no_head_dim = SimpleNamespace(num_attention_heads=4, num_key_value_heads=1, hidden_size=64)
    assert part_rows(PACKED["qkv_proj"], no_head_dim, 96) == [64, 16, 16]  # head_dim = hidden / heads
    mha = SimpleNamespace(num_attention_heads=2, hidden_size=16)
    assert part_rows(PACKED["qkv_proj"], mha, 48) == [16, 16, 16]  # no kv heads: multi-head attention
    assert part_rows(PACKED["gate_up_proj"], CONFIG, 80) == [40, 40]


@pytest.mark.parametrize("packed", [False, True])
def test_every_tensor_is_read_back_and_served_as_sent(packed):
    w = _hf_weights()
    errors = served_errors(_served_model(w, packed), w)
    assert sorted(errors) == sorted(w)
    assert max(errors.values()) < 1e-6


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize(("fused", "part", "rows"), [
    ("self_attn.qkv_proj", "self_attn.k_proj", slice(32, 48)),
    ("self_attn.qkv_proj", "self_attn.v_proj", slice(48, 64)),
    ("mlp.gate_up_proj", "mlp.up_proj", slice(40, 80)),
])
def test_a_changed_part_of_a_fused_layer_shows_under_its_hf_name(packed, fused, part, rows):
    w = _hf_weights()
    model = _served_model(w, packed)
    layer = model.get_submodule(f"model.layers.0.{fused}")
    with torch.no_grad():
        # what vLLM serves, no longer what it was sent: by one part in a thousand
        layer.served()[rows] *= 1.001
    errors = served_errors(model, w)
    name = f"model.layers.0.{part}.weight"
    assert errors[name] == float("inf")  # its sampled columns are not the sent ones
    assert max(e for n, e in errors.items() if n != name) < 1e-6
    # a dense relative change moves the probe sketch by as much
    served = served_sketches(model, {name: tuple(w[name].shape)})[name]
    assert sketch_error(served, sketch(name, w[name])) == pytest.approx(1e-3, rel=0.05)


def test_a_layout_the_config_does_not_explain_is_not_claimed_as_read_back():
    w = _hf_weights()
    wrong = SimpleNamespace(num_attention_heads=4, num_key_value_heads=1, head_dim=8, hidden_size=24)
    errors = served_errors(_served_model(w, packed=True, config=wrong), w)
    assert sorted(errors) == sorted(
        n for n in w if not n.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight"))
    )


def test_a_tied_head_is_read_through_its_kernel_even_when_only_the_embedding_was_sent():
    w = _hf_weights()
    model = _served_model(w, packed=True)
    model.lm_head = Head(model.model.embed_tokens)
    assert served_errors(model, w)["lm_head.weight"] < 1e-6  # checked against the sent embedding
    new = {**w, "model.embed_tokens.weight": w["model.embed_tokens.weight"] * 1.01}
    with torch.no_grad():  # the embedding lands, the head's packed copy is not rebuilt: it serves the old one
        model.model.embed_tokens.weight[:VOCAB] = new["model.embed_tokens.weight"]
    errors = served_errors(model, new)
    assert errors["model.embed_tokens.weight"] == 0.0 and errors["lm_head.weight"] > 5e-3
    assert (
        served_errors(model, {**new, "lm_head.weight": new["model.embed_tokens.weight"]})["lm_head.weight"]
        > 5e-3
    )


def test_fused_biases_are_split_like_their_weights():
    w = _hf_weights()
    attn = "model.layers.0.self_attn"
    g = torch.Generator().manual_seed(1)
    biases = {f"{attn}.{p}.bias": torch.randn(w[f"{attn}.{p}.weight"].shape[0], generator=g)
              for p in PACKED["qkv_proj"]}
    model = _served_model(w, packed=True)
    qkv = model.get_submodule(f"{attn}.qkv_proj")
    qkv.bias = nn.Parameter(torch.cat(list(biases.values())), requires_grad=False)
    sent = {**w, **biases}
    errors = served_errors(model, sent)
    assert sorted(errors) == sorted(sent) and max(errors.values()) < 1e-6
    with torch.no_grad():
        qkv.bias[48:] = 0.0  # v's bias
    errors = served_errors(model, sent)
    # v's elements are not the sent ones (and its sketch is off by 1.0); k's are
    assert errors[f"{attn}.v_proj.bias"] == float("inf") and errors[f"{attn}.k_proj.bias"] == 0.0
    v_bias = f"{attn}.v_proj.bias"
    served = served_sketches(model, {v_bias: tuple(biases[v_bias].shape)})[v_bias]
    assert sketch_error(served, sketch(v_bias, biases[v_bias])) == pytest.approx(1.0)


def _one_step(w: dict[str, torch.Tensor], lr: float = 2e-5, seed: int = 1) -> dict[str, torch.Tensor]:
    """`w` after one Adam-like step of `lr` (every element moves by lr, either way), in `w`'s dtype."""
    g = torch.Generator().manual_seed(seed)
    return {n: (t.float() + lr * torch.randint(0, 2, t.shape, generator=g).mul(2).sub(1)).to(t.dtype)
            for n, t in w.items()}


@pytest.mark.parametrize("packed", [False, True])
def test_a_bf16_engine_one_step_stale_is_caught(packed):
    """A bf16 engine still serving version v-1 when told it got v (one lr-2e-5 step apart: ~1/6 of the
    elements moved by one bf16 ulp): the probe sketch alone stays within the bf16 tolerance, so the check
    must read sampled elements exactly. Served as sent, every tensor passes."""
    weights = {n: (t * 0.02).to(torch.bfloat16) for n, t in _hf_weights().items()}  # Qwen-like scale
    current = _one_step(weights)
    stale = _served_model(weights, packed)  # bf16 GEMMs: the probes' products round to bf16 as vLLM's do
    served = served_sketches(stale, {n: tuple(t.shape) for n, t in current.items()})
    rtol = SKETCH_RTOL[torch.bfloat16]
    assert max(sketch_error(served[n], sketch(n, current[n])) for n in current) < rtol  # the old check passes
    errors = served_errors(stale, current)
    changed = [n for n in current if not torch.equal(current[n], weights[n])]
    assert changed and all(errors[n] > rtol for n in changed), errors
    fresh = served_errors(_served_model(current, packed), current)
    assert max(fresh.values()) <= rtol
