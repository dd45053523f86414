"""What a vLLM engine serves, read back inside its worker under the HF names it was sent with, so that the
fingerprint of a sync (cluster.fingerprint) proves what vLLM loaded rather than echoing what it received.

vLLM holds a sent tensor in one of three forms, each read back at the fingerprint's sampled positions only:
- its own parameter under the HF name (norms; unfused linears on GPU; embeddings and lm_head, whose
  vocabulary vLLM pads to a multiple of 64 rows after the sent ones): as is;
- rows of a fused linear (q/k/v stacked into qkv_proj, gate/up into gate_up_proj; the model's
  `packed_modules_mapping`): the part's rows start where the stacking put them, after the parts before it
  (q, k, v sizes from the model config, gate and up equal halves);
- on CPU, every linear's weight (fused or not) lives in a packed GEMM kernel (oneDNN) and the parameter is
  emptied: the sampled columns come back through the layer's own GEMM with one-hot inputs, which yields the
  served W[:, c] exactly (one non-zero product per output, in any precision).
A tensor in none of these forms (a layout this module does not know) contributes the received tensor's terms
and is not counted as read back. Runs inside the worker, through `LLM.apply_model` or the worker extension.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from cluster.fingerprint import fingerprint_terms, sample_indices, sampled_terms


@torch.no_grad()
def served_terms(model: torch.nn.Module, weights: Mapping[str, torch.Tensor]) -> tuple[list[float], int]:
    """Fingerprint terms of `weights` (HF name -> received tensor) as `model` serves them, and the number of
    tensors read back from the model (the rest are the received tensors' terms)."""
    params = dict(model.named_parameters(remove_duplicate=False))  # tied lm_head keeps its own name
    modules = dict(model.named_modules())
    terms: list[float] = []
    read = 0
    for name, sent in weights.items():
        values = _read_back(model, params, modules, name, tuple(sent.shape))
        if values is None:
            terms += fingerprint_terms(name, sent)
        else:
            terms += sampled_terms(name, values)
            read += 1
    return terms, read


def vllm_module(name: str, packed: Mapping[str, Sequence[str]]) -> str:
    """The vLLM module an HF tensor loads into: its own module, or the fused one its part is stacked into
    (`packed`: the model's packed_modules_mapping):
    'm.layers.0.self_attn.k_proj.bias' → 'm.layers.0.self_attn.qkv_proj', 'm.norm.weight' → 'm.norm'."""
    path = name.rsplit(".", 1)[0]
    prefix, _, part = path.rpartition(".")
    for fused, parts in packed.items():
        if part in parts:
            return f"{prefix}.{fused}" if prefix else fused
    return path


def whole_modules(names: Sequence[str], changed: Sequence[str], packed: Mapping[str, Sequence[str]]) -> list[str]:
    """The tensors of `names` to reload so that `changed` lands: every tensor loading into a vLLM module that a
    changed one loads into. vLLM's in-place reload rebuilds each module it is given any tensor of from those
    tensors alone (a fused qkv_proj sent q alone would serve uninitialised k and v rows), and keeps the modules
    it is given nothing of as they were."""
    touched = {vllm_module(n, packed) for n in changed}
    return [n for n in names if vllm_module(n, packed) in touched]


def part_rows(parts: Sequence[str], config: Any, fused_rows: int) -> list[int]:
    """Rows of each HF part of a fused linear, in stacking order: q, k, v from the model config
    (num_heads × head_dim, then num_kv_heads × head_dim twice); any other stack (gate, up) equal shares of
    `fused_rows`."""
    if tuple(parts) == ("q_proj", "k_proj", "v_proj"):
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        kv = getattr(config, "num_key_value_heads", None) or heads
        return [heads * head_dim, kv * head_dim, kv * head_dim]
    return [fused_rows // len(parts)] * len(parts)


def _read_back(model: torch.nn.Module, params: Mapping[str, torch.Tensor], modules: dict[str, torch.nn.Module],
               name: str, shape: tuple[int, ...]) -> torch.Tensor | None:
    """[k] the served elements of tensor `name` (HF shape `shape`) at its fingerprint's sampled positions."""
    numel = int(torch.Size(shape).numel())
    if numel == 0:
        return None
    idx = torch.tensor(sample_indices(name, numel))
    own = params.get(name)
    if own is not None and tuple(own.shape) == shape:
        return own.detach().reshape(-1)[idx.to(own.device)]
    if own is not None and _padded_vocab(modules.get(name.rsplit(".", 1)[0]), own, shape):
        return own.detach()[(idx // shape[1]).to(own.device), (idx % shape[1]).to(own.device)]
    slot = _linear_slot(model, modules, name, shape)
    if slot is None:
        return None
    layer, leaf, offset = slot
    bias = getattr(layer, "bias", None)
    if leaf == "bias" and len(shape) == 1 and bias is not None:
        return bias.detach()[(idx + offset).to(bias.device)]
    if leaf != "weight" or len(shape) != 2:
        return None
    rows, cols = idx // shape[1] + offset, idx % shape[1]
    weight = layer.weight
    if tuple(weight.shape) == (layer.output_size_per_partition, layer.input_size_per_partition):
        return weight.detach()[rows.to(weight.device), cols.to(weight.device)]
    return _gemm_elements(layer, rows, cols)


def _padded_vocab(module: Any, own: torch.Tensor, shape: tuple[int, ...]) -> bool:
    """An embedding or LM head whose vocabulary vLLM padded (to a multiple of 64): the sent rows come first."""
    return (len(shape) == 2 and own.dim() == 2 and getattr(module, "org_vocab_size", None) == shape[0]
            and own.shape[0] >= shape[0] and own.shape[1] == shape[1])


def _linear_slot(model: torch.nn.Module, modules: dict[str, torch.nn.Module], name: str,
                 shape: tuple[int, ...]) -> tuple[Any, str, int] | None:
    """(vLLM linear layer, "weight" | "bias", first row of the HF tensor in it) for an HF linear's tensor, kept
    as its own layer (row 0) or stacked into a fused one; None when the layout does not match `shape`."""
    path, leaf = name.rsplit(".", 1)
    layer = modules.get(path)
    if layer is not None:
        return (layer, leaf, 0) if _rows_of(layer) == shape[0] else None
    prefix, part = path.rsplit(".", 1) if "." in path else ("", path)
    for fused, parts in getattr(model, "packed_modules_mapping", {}).items():
        layer = modules.get(f"{prefix}.{fused}" if prefix else fused)
        fused_rows = _rows_of(layer) if layer is not None else None
        if part not in parts or layer is None or fused_rows is None:
            continue
        rows = part_rows(parts, model.config, fused_rows)
        i = list(parts).index(part)
        if sum(rows) != fused_rows or rows[i] != shape[0]:
            return None  # another layout (tensor-parallel shards, an unknown stacking): not read back
        return layer, leaf, sum(rows[:i])
    return None


def _rows_of(layer: torch.nn.Module) -> int | None:
    return getattr(layer, "output_size_per_partition", None) if hasattr(layer, "quant_method") else None


def _gemm_elements(layer: Any, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """[k] W[rows[j], cols[j]] of the weight a vLLM linear multiplies by, through its own GEMM: one one-hot input
    row per distinct column (bias left out), so each output is a single product w · 1."""
    distinct, which = torch.unique(cols, return_inverse=True)
    x = torch.zeros(len(distinct), layer.input_size_per_partition, dtype=layer.weight.dtype,
                    device=layer.weight.device)
    x[torch.arange(len(distinct), device=x.device), distinct.to(x.device)] = 1
    out = layer.quant_method.apply(layer, x, bias=None)  # [distinct, out rows] = one-hot @ W^T
    return out[which.to(out.device), rows.to(out.device)]
