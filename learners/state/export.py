"""The served weights, module by module: what a bucketed sync sends and what a ZeRO-3 rank's snapshot copies.

A module's own parameters are gathered (under ZeRO-3: `deepspeed.zero.GatheredParameters`, handed in by the
backend as `gather`; a collective every rank enters), its served tensors are produced (a LoRA layer merged
into its base, learners.state.weights.merge_layer), handed on, and released before the next module is
gathered: the transient is the largest module, not the model. Only the rank that `copies` produces tensors;
the others enter and leave the same gathers in the same order. Names, order and values are those of
`merge_for_serving` (state-dict order: each module's parameters, then its persistent buffers, then its
children), which `serving_layout` gives without gathering anything.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from cluster.buckets import Meta
from learners.state.weights import (
    PolicyModel,
    WeightSnapshot,
    _lora_delta,
    adapter_payload,
    is_lora,
    merge_layer,
    update_lost,
)

Gather = Callable[[list[torch.nn.Parameter]], contextlib.AbstractContextManager[Any]]


def whole(params: list[torch.nn.Parameter]) -> contextlib.AbstractContextManager[Any]:
    """The `gather` of a module that holds its weights whole (torch, ZeRO-1/2): nothing to do."""
    return contextlib.nullcontext()


def _units(model: torch.nn.Module) -> Iterator[tuple[str, Any, bool]]:
    """(prefix, module, is a LoRA layer) in state-dict order: a LoRA layer as one unit (its base layer and
    adapter inside it), every other module with its own tensors alone."""
    from peft.tuners.lora import LoraLayer

    skip: list[str] = []
    for prefix, module in model.named_modules(remove_duplicate=False):
        if any(prefix.startswith(s) for s in skip):
            continue
        if isinstance(module, LoraLayer):
            skip.append(f"{prefix}.")
            yield prefix, module, True
        elif module._parameters or module._buffers:
            yield prefix, module, False


def _own(module: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The module's own parameters, then its persistent buffers (state_dict's order)."""
    params = [(n, p) for n, p in module._parameters.items() if p is not None]
    kept = [(n, b) for n, b in module._buffers.items()
            if b is not None and n not in module._non_persistent_buffers_set]
    return params + kept


def _unit_params(module: torch.nn.Module, lora: bool) -> list[torch.nn.Parameter]:
    return list(module.parameters()) if lora else [p for p in module._parameters.values() if p is not None]


def _key(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


@torch.no_grad()
def serving_tensors(model: PolicyModel, dtype: torch.dtype | None, gather: Gather = whole,
                    copies: bool = True, norms: list[torch.Tensor] | None = None, keep: bool = True
                    ) -> Iterator[tuple[str, torch.Tensor]]:
    """(served name, tensor on the module's device) pairs, one module gathered at a time; `dtype`: the
    serving dtype (None: each weight's own). A gathered tensor is released when the generator moves on, so
    it is yielded as a copy unless the caller copies it before asking for the next (`keep=False`). `norms`
    collects each LoRA layer's [||E||², ||ΔW||²] (merge_rounding: `update_lost`)."""
    base = model.get_base_model() if is_lora(model) else model
    for prefix, module, lora in _units(base):
        params = _unit_params(module, lora)
        gathered = any(hasattr(p, "ds_id") for p in params)
        with gather(params):
            if copies:
                yield from _served(prefix, module, lora, dtype, gathered and keep, norms)


def _served(prefix: str, module: Any, lora: bool, dtype: torch.dtype | None, copy: bool,
            norms: list[torch.Tensor] | None) -> Iterator[tuple[str, torch.Tensor]]:
    if lora:
        weight = module.get_base_layer().weight
        merged, err, upd = merge_layer(weight, _lora_delta(module, module.active_adapters[0]),
                                       dtype or weight.dtype)
        if norms is not None:
            norms.append(torch.stack([err, upd]))
        yield _key(prefix, "weight"), merged
        own = [(n, t) for n, t in _own(module.get_base_layer()) if n != "weight"]
    else:
        own = _own(module)
    for name, tensor in own:
        out = tensor.detach()
        if dtype is not None and out.is_floating_point():
            out = out.to(dtype)
        yield _key(prefix, name), out.clone() if copy and out.data_ptr() == tensor.data_ptr() else out


def serving_layout(model: PolicyModel, dtype: torch.dtype | None) -> list[Meta]:
    """What `serving_tensors` yields, in order, from shapes alone (a ZeRO-3 partition's full shape is its
    `ds_shape`): the layout a bucketed sync hands its receivers before any byte moves."""
    base = model.get_base_model() if is_lora(model) else model
    out = []
    for prefix, module, lora in _units(base):
        own = _own(module.get_base_layer()) if lora else _own(module)
        for name, tensor in own:
            shape = tuple(getattr(tensor, "ds_shape", tensor.shape))
            kind = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
            out.append(Meta(_key(prefix, name), shape, str(kind).removeprefix("torch.")))
    return out


@torch.no_grad()
def snapshot_by_module(model: PolicyModel, policy_id: str, gather: Gather, copies: bool
                       ) -> WeightSnapshot | None:
    """learners.state.weights.take_snapshot, gathered module by module (every rank calls it: the gathers are
    collectives), host copies on the rank that `copies` (rank 0) alone; None elsewhere."""
    norms: list[torch.Tensor] = []
    pairs = serving_tensors(model, None, gather, copies, norms, keep=False)
    merged = {n: t.to("cpu", copy=True) for n, t in pairs}  # each copied before the next module is gathered
    lora = is_lora(model)
    adapter = lora_state = None
    if lora:
        lora_params = [p for n, p in model.named_parameters() if "lora_" in n]
        with gather(lora_params):  # the adapter alone: small
            if copies:
                adapter = adapter_payload(model, policy_id)
                lora_state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()
                              if "lora_" in k}
    if not copies:
        return None
    error_sq, delta_sq = torch.stack(norms).sum(0).tolist() if norms else (0.0, 0.0)
    return WeightSnapshot(merged=merged, merge_rounding=update_lost(error_sq, delta_sq) if lora else None,
                          adapter=adapter, lora_state=lora_state)
