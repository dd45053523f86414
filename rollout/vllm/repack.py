"""New weights into a live vLLM model in place, without vLLM's layer-wise reload: the engine's sync path
(`rollout.sync_path=fast`). Runs inside vLLM's worker (`LLM.apply_model`).

On CPU, vLLM serves every unquantized linear from a GEMM handle that owns a packed copy of its weight (oneDNN
reorders it into a blocked layout) and empties the layer's weight parameter, so a copy into that parameter
serves nothing (docs/design.md, vLLM engines). Here only the modules a payload touches are rebuilt:
- a linear: its HF parts concatenated in vLLM's stacking order (q, k, v; gate, up) become the layer's weight
  and vLLM's own `dispatch_cpu_unquantized_gemm` builds the new handle (keeping vLLM's per-ISA kernel choice);
  the old handle is freed as its closure is replaced. Biases are copied into the kept bias parameter;
- the embedding is copied into its kept parameter (its own GEMM handle is never used: not rebuilt);
- the LM head's handle is rebuilt whenever the embedding it is tied to or its own weight changed: a tied head
  otherwise keeps serving the old embedding's packed copy;
- norms and other parameters vLLM keeps under the HF name: copied in place.
A payload with any tensor in another form (quantized layers, unpacked linears, unknown stacking) is not
touched and the caller reloads it through vLLM. On GPU, linears keep their weights:
`model.load_weights` in place.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from cluster.packing import PackedTensors
from rollout.vllm.readback import part_rows, vllm_module

Plan = dict[str, list[str]]  # vLLM module -> the HF names loading into it


@dataclass(frozen=True)
class Kernels:
    """The vLLM pieces this path uses, handed in by the adapter (rollout.vllm.engine, the one module importing
    vllm): vLLM's `dispatch_cpu_unquantized_gemm(layer, remove_weight)` and its unquantized method classes."""

    rebuild: Callable[..., None]
    linear_method: type
    embedding_method: type


@torch.no_grad()
def load_in_place(model: torch.nn.Module, weights: Mapping[str, torch.Tensor], kernels: Kernels) -> bool:
    """Serve `weights` (HF names, any subset of the model's) from now on; False when this path does not know
    the model's layout (nothing was changed: the caller reloads through vLLM)."""
    if torch.cuda.is_available():
        if not unquantized(model, kernels):
            return False  # quantized layers transform their weights after loading: only a reload redoes that
        # CUDA linears keep their weights and their loaders: vLLM's loaders copy (and fuse) in place.
        model.load_weights(weights.items())  # type: ignore[operator]
        return True
    plan = repack_plan(model, weights, kernels)
    if plan is None:
        return False
    head = getattr(model, "lm_head", None)
    embedding = next((m for m, names in plan.items() if head is not None and m != "lm_head"
                      and model.get_submodule(m).weight is getattr(head, "weight", None)), None)
    if embedding is not None:
        plan.pop("lm_head", None)  # tied: one parameter, copied once (a differing head fails the check)
    head_stale = False
    for module, names in plan.items():
        head_stale |= _load_module(model, module, {n: weights[n] for n in names}, kernels, weights)
    if head_stale:
        kernels.rebuild(head, remove_weight=False)
    return True


def unquantized(model: torch.nn.Module, kernels: Kernels) -> bool:
    methods = (kernels.linear_method, kernels.embedding_method)
    return all(
        isinstance(m.quant_method, methods) for m in model.modules() if getattr(m, "quant_method", None)
    )


def repack_plan(model: torch.nn.Module, weights: Mapping[str, torch.Tensor], kernels: Kernels) -> Plan | None:
    """{vLLM module: HF names} when every tensor lands in a form this path rebuilds (see the module
    docstring), every packed linear getting all of its parts' weights; None otherwise."""
    packed = getattr(model, "packed_modules_mapping", {})
    modules = dict(model.named_modules())
    plan: Plan = {}
    for name in weights:
        plan.setdefault(vllm_module(name, packed), []).append(name)
    for module, names in plan.items():
        layer = modules.get(module)
        if layer is None or not _known(layer, module, {n: weights[n] for n in names}, packed, kernels):
            return None
    return plan


def _known(layer: Any, module: str, weights: Mapping[str, torch.Tensor], packed: Mapping[str, Any],
           kernels: Kernels) -> bool:
    if _packed_linear(layer, kernels):
        stacked = [n for n in weights if n.endswith(".weight")]
        return len(stacked) == len(packed.get(module.rsplit(".", 1)[-1], [module]))  # every part, or the one
    if len(weights) != 1:
        return False
    name, sent = next(iter(weights.items()))
    own = getattr(layer, "weight", None)
    method = getattr(layer, "quant_method", None)
    return (name.endswith(".weight") and isinstance(own, torch.Tensor)
            and (method is None or isinstance(method, kernels.embedding_method))
            and own.dim() == sent.dim() and own.shape[1:] == sent.shape[1:] and own.shape[0] >= sent.shape[0])


def _packed_linear(layer: Any, kernels: Kernels) -> bool:
    """An unquantized vLLM linear whose weight lives in a CPU GEMM handle (parameter emptied)."""
    weight = getattr(layer, "weight", None)
    return (
        isinstance(getattr(layer, "quant_method", None), kernels.linear_method)
        and hasattr(layer, "cpu_linear")
        and isinstance(weight, torch.Tensor)
        and weight.numel() == 0
    )


def _load_module(model: torch.nn.Module, module: str, weights: dict[str, torch.Tensor], kernels: Kernels,
                 sent: Mapping[str, torch.Tensor]) -> bool:
    """Load one module's tensors (`sent`: the whole payload); True when the LM
    head's handle must be rebuilt."""
    layer: Any = model.get_submodule(module)
    if _packed_linear(layer, kernels):
        _load_linear(model, layer, module, weights, kernels, sent)
        return False
    (tensor,) = weights.values()
    own: torch.Tensor = layer.weight
    own[:tensor.shape[0]].copy_(tensor)  # embeddings and heads: vLLM pads the vocabulary after the sent rows
    head = getattr(model, "lm_head", None)
    return head is not None and (layer is head or getattr(head, "weight", None) is own)


def _load_linear(model: torch.nn.Module, layer: Any, module: str, weights: dict[str, torch.Tensor],
                 kernels: Kernels, sent: Mapping[str, torch.Tensor]) -> None:
    """A packed linear from its HF parts: a new GEMM handle from the stacked
    weights; biases copied in place."""
    parts = _stacking(model, module)
    order = [f"{module.rsplit('.', 1)[0]}.{p}" for p in parts] if parts else [module]
    dtype = layer.weight.dtype
    stacked = [weights[f"{m}.weight"].to(dtype) for m in order]
    fused = _fused(stacked, [f"{m}.weight" for m in order], sent)
    biases = [weights.get(f"{m}.bias") for m in order]
    if any(b is not None for b in biases):
        rows = part_rows(parts, model.config, layer.output_size_per_partition) if parts else [fused.shape[0]]
        start = 0
        for bias, n in zip(biases, rows, strict=True):
            if bias is not None:
                layer.bias[start:start + n].copy_(bias)
            start += n
    layer.weight = torch.nn.Parameter(fused, requires_grad=False)
    kernels.rebuild(layer, remove_weight=True)
    if layer.weight.numel() and layer.weight.data_ptr() == stacked[0].data_ptr():
        # A kernel that reads the parameter per call (vLLM's plain fallback) must own it: the sent tensor may
        # be a view of the sender's buffer, released after the sync.
        layer.weight = torch.nn.Parameter(fused.clone(), requires_grad=False)


def _fused(stacked: list[torch.Tensor], names: list[str], sent: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The parts stacked along rows: a view of the packed payload when they lie back to back there in stacking
    order (the learner's state dict order: q, k, v; gate, up), else one concatenated copy."""
    if len(stacked) == 1:
        return stacked[0]
    view = sent.stacked(names) if isinstance(sent, PackedTensors) else _adjacent(stacked)
    return view if view is not None and view.dtype == stacked[0].dtype else torch.cat(stacked)


def _adjacent(parts: list[torch.Tensor]) -> torch.Tensor | None:
    """[Σ rows, cols] one view of `parts` when they are row blocks of one tensor, back to back
    in this order, laid out alike (an engine's merge buffers, rollout.lora.BaseWeights,
    column-major there); None otherwise."""
    first, offset = parts[0], parts[0].storage_offset()
    for part in parts:
        if (part.dtype != first.dtype or part.stride() != first.stride() or part.shape[1:] != first.shape[1:]
                or part.storage_offset() != offset
                or part.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()):
            return None
        offset += part.shape[0] * part.stride(0)
    return first.as_strided(
        (sum(p.shape[0] for p in parts), *first.shape[1:]), first.stride(), first.storage_offset()
    )


def _stacking(model: torch.nn.Module, module: str) -> list[str]:
    """The HF parts a fused module stacks, in order ([] for a module of its own)."""
    return list(getattr(model, "packed_modules_mapping", {}).get(module.rsplit(".", 1)[-1], []))

