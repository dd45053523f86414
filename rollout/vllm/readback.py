"""What a vLLM engine serves, read back inside its worker under the HF names it was sent with, as the seeded
probe sketch of cluster.sketch: each served matrix times k ±1 vectors, through the kernel that serves it, set
against the same sketch of the tensor that was sent. A load that did not land, a skipped layer or a stale LM
head moves the served sketch; the sent one is what the sender holds.

vLLM holds a sent tensor in one of four forms:
- the LM head: read through its own GEMM (the logits path, `quant_method.apply`), never from its parameter (on
  CPU a tied head serves a packed copy of the embedding that a changed embedding parameter does not refresh);
  a tied head is checked against the sent embedding when no `lm_head.weight` was sent;
- its own parameter under the HF name (norms, embeddings, whose vocabulary vLLM pads to a multiple of 64 rows
  after the sent ones): as is;
- rows of a fused linear (q/k/v stacked into qkv_proj, gate/up into gate_up_proj; the model's
  `packed_modules_mapping`): the part's rows start where the stacking put them, after the parts before it
  (q, k, v sizes from the model config, gate and up equal halves);
- any linear's weight, fused or not, through the layer's own GEMM with the probes as input rows (on CPU it
  lives in a packed kernel and the parameter is emptied); biases from the layer's bias parameter.
A tensor in none of these forms (a layout this module does not know) is not read back and not counted. Runs
inside the worker, through `LLM.apply_model` or the worker extension.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from cluster.sketch import (
    checked_error,
    checked_sketch,
    one_hot_columns,
    probes,
    sample_columns,
    sketch,
)

if TYPE_CHECKING:  # the HF model config of the served model
    from transformers import PretrainedConfig

HEAD = "lm_head.weight"
Expected = tuple[tuple[int, ...], torch.Tensor]  # a sent tensor's HF shape and its checked sketch


@torch.no_grad()
def served_errors(model: torch.nn.Module, weights: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """{HF name: cluster.sketch.checked_error of the served tensor against the sent one} for every tensor of
    `weights` read back from `model` (plus the LM head of a tied model sent its embedding only): the sketch
    within the dtype's tolerance and sampled columns bit-exact, as the engine serves the sent tensors
    themselves (cast to its dtype), so a weight one optimizer step stale is caught in bf16 too."""
    return errors_against(model, expected_sketches(model, weights))


@torch.no_grad()
def expected_sketches(model: torch.nn.Module, weights: Mapping[str, torch.Tensor],
                      device: torch.device | None = None) -> dict[str, Expected]:
    """{HF name: (its HF shape, checked sketch (cluster.sketch.checked_sketch) of the sent tensor, as `model`
    serves it)}: what
    `errors_against` compares. Taken on the model's device (an engine on a GPU sketches there, not in host
    fp32 buffers), one tensor at a time; a few columns per tensor are all that is kept, so a bucketed receive
    takes them bucket by bucket and drops the bucket. `device`: where the model serves (the worker's device;
    None: its parameters', which vLLM's layerwise reload moves to the meta device while it runs)."""
    params = dict(model.named_parameters(remove_duplicate=False))  # tied lm_head keeps its own name
    dtype = _serving_dtype(params)
    if device is None:
        device = next(iter(params.values())).device if params else torch.device("cpu")
    return {name: (tuple(sent.shape), checked_sketch(name, sent.to(device, non_blocking=True), dtype))
            for name, sent in _checked(model, params, weights)}


@torch.no_grad()
def errors_against(model: torch.nn.Module, expected: Mapping[str, Expected]) -> dict[str, float]:
    """{HF name: checked_error of the tensor `model` serves against its expected sketch} for every name of
    `expected` read back."""
    params = dict(model.named_parameters(remove_duplicate=False))
    served = _read(model, params, {name: shape for name, (shape, _) in expected.items()}, exact=True)
    return {name: checked_error(s, expected[name][1]) for name, s in served.items()}


def _serving_dtype(params: Mapping[str, torch.Tensor]) -> torch.dtype:
    """The dtype the model serves its weights in: its floating parameters' (vLLM loads every one in it)."""
    return next((p.dtype for p in params.values() if p.is_floating_point()), torch.float32)


@torch.no_grad()
def served_sketches(model: torch.nn.Module, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """{HF name: [rows, k] sketch of the tensor as `model` serves it} for every name of `shapes` (HF shapes)
    read back (the LM head through the logits path): what a sender that holds the expected sketch compares."""
    return _read(model, dict(model.named_parameters(remove_duplicate=False)), shapes, exact=False)


def raise_if_off(policy_id: str, errors: Mapping[str, float], rtol: float) -> None:
    """RuntimeError naming the tensors whose served sketch is off by more than `rtol` (worst first)."""
    off = sorted(((e, n) for n, e in errors.items() if not e <= rtol), reverse=True)
    if off:
        worst = ", ".join(f"{n} ({e:.2e})" for e, n in off[:3])
        raise RuntimeError(
            f"engine for policy {policy_id!r}: {len(off)} of {len(errors)} tensors serve other "
            f"values than were loaded (relative sketch error above {rtol:.0e}, or inf: sampled elements "
            f"not bit-exact): {worst}"
        )


def _checked(model: torch.nn.Module, params: Mapping[str, torch.Tensor],
             weights: Mapping[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, sent tensor) pairs to check: `weights`, and the head of a tied model under HEAD, against the
    sent tensor it is tied to, when HEAD itself was not sent (its kernel is rebuilt from that tensor)."""
    yield from weights.items()
    head = getattr(getattr(model, "lm_head", None), "weight", None)
    if HEAD in weights or head is None:
        return
    tied = [n for n, p in params.items() if p is head and n != HEAD and n in weights]
    if tied:
        yield HEAD, weights[tied[0]]


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


def whole_modules(
    names: Sequence[str], changed: Sequence[str], packed: Mapping[str, Sequence[str]]
) -> list[str]:
    """The tensors of `names` to reload so that `changed` lands: every tensor loading into a vLLM module that
    a changed one loads into. vLLM's in-place reload rebuilds each module it is given any tensor of from those
    tensors alone (a fused qkv_proj sent q alone would serve uninitialised k and v rows), and keeps the
    modules it is given nothing of as they were."""
    touched = {vllm_module(n, packed) for n in changed}
    return [n for n in names if vllm_module(n, packed) in touched]


def part_rows(parts: Sequence[str], config: PretrainedConfig, fused_rows: int) -> list[int]:
    """Rows of each HF part of a fused linear, in stacking order: q, k, v from the model config
    (num_heads × head_dim, then num_kv_heads × head_dim twice); any other stack (gate, up) equal shares of
    `fused_rows`."""
    if tuple(parts) == ("q_proj", "k_proj", "v_proj"):
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        kv = getattr(config, "num_key_value_heads", None) or heads
        return [heads * head_dim, kv * head_dim, kv * head_dim]
    return [fused_rows // len(parts)] * len(parts)


def _read(model: torch.nn.Module, params: Mapping[str, torch.Tensor],
          shapes: Mapping[str, tuple[int, ...]], exact: bool) -> dict[str, torch.Tensor]:
    """{name: [rows, k] served sketch} for the names of `shapes` that are read back, in their order (`exact`:
    cluster.sketch.checked_sketch's, with sampled columns read exactly). The parts
    of one linear are read through its kernel in one call (`_kernel_sketches`): each call reads the whole
    packed weight, so q, k, v (gate, up) read one by one would read their fused module three (two) times."""
    modules = dict(model.named_modules())
    out: dict[str, torch.Tensor] = {}
    kernel_reads: dict[int, tuple[Any, list[tuple[str, int, tuple[int, ...]]]]] = {}
    for name, shape in shapes.items():
        served = _served(model, params, modules, name, shape)
        if isinstance(served, torch.Tensor):
            out[name] = checked_sketch(name, served) if exact else sketch(name, served)
        elif served is not None:
            layer, offset = served
            kernel_reads.setdefault(id(layer), (layer, []))[1].append((name, offset, shape))
    for layer, parts in kernel_reads.values():
        out.update(_kernel_sketches(layer, parts, exact))
    return {name: out[name] for name in shapes if name in out}


def _served(model: torch.nn.Module, params: Mapping[str, torch.Tensor], modules: dict[str, torch.nn.Module],
            name: str, shape: tuple[int, ...]) -> torch.Tensor | tuple[Any, int] | None:
    """Where `model` serves tensor `name` (HF shape `shape`): the served tensor itself, (a layer whose GEMM
    holds it, its first row there), or None: not read back."""
    if int(torch.Size(shape).numel()) == 0:
        return None
    head = getattr(model, "lm_head", None)
    if name == HEAD and head is not None and hasattr(head, "quant_method"):
        return head, 0
    own = params.get(name)
    if own is not None and tuple(own.shape) == shape:
        return own
    if own is not None and _padded_vocab(modules.get(name.rsplit(".", 1)[0]), own, shape):
        return own[:shape[0]]
    slot = _linear_slot(model, modules, name, shape)
    if slot is None:
        return None
    layer, leaf, offset = slot
    bias = getattr(layer, "bias", None)
    if leaf == "bias" and len(shape) == 1 and bias is not None:
        return bias[offset:offset + shape[0]]
    if leaf != "weight" or len(shape) != 2:
        return None
    return layer, offset


def _padded_vocab(module: Any, own: torch.Tensor, shape: tuple[int, ...]) -> bool:
    """An embedding or LM head whose vocabulary vLLM padded (to a multiple of
    64): the sent rows come first."""
    return (len(shape) == 2 and own.dim() == 2 and getattr(module, "org_vocab_size", None) == shape[0]
            and own.shape[0] >= shape[0] and own.shape[1] == shape[1])


def _linear_slot(model: torch.nn.Module, modules: dict[str, torch.nn.Module], name: str,
                 shape: tuple[int, ...]) -> tuple[Any, str, int] | None:
    """(vLLM linear layer, "weight" | "bias", first row of the HF tensor in it) for an HF linear's tensor,
    kept as its own layer (row 0) or stacked into a fused one; None when the layout does not match `shape`."""
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


def _kernel_sketches(
    layer: Any, parts: Sequence[tuple[str, int, tuple[int, ...]]], exact: bool
) -> dict[str, torch.Tensor]:
    """{name: [rows, k] W[offset:offset + rows] @ probes(name)} (`exact`: then the sampled columns of
    cluster.sketch.checked_sketch) for each (name, offset, HF shape) of `parts`, all rows of the weight one
    vLLM linear (or LM head) multiplies by, through its own GEMM in one call (bias left out): every part's
    probes go in as input rows of their own, and each part keeps its rows and columns."""
    weight = layer.weight
    # [Σ k_part, in], ±1 or one-hot (`exact`: each part's sampled columns): exact in any dtype
    inputs = [_probe_rows(name, shape, exact) for name, _, shape in parts]
    # [Σ k_part, out] = X @ W^T
    out = layer.quant_method.apply(layer, torch.cat(inputs).to(weight.device, weight.dtype), bias=None)
    sketches, start = {}, 0
    for (name, offset, shape), x in zip(parts, inputs, strict=True):
        sketches[name] = out[start:start + len(x), offset:offset + shape[0]].T.float().cpu()
        start += len(x)
    return sketches


def _probe_rows(name: str, shape: tuple[int, ...], exact: bool) -> torch.Tensor:
    """[k, cols] input rows of one HF matrix's read: its ±1 probes, then (`exact`) one-hot rows of its
    sampled columns."""
    signs = probes(name, shape[1]).T
    if not exact:
        return signs
    return torch.cat([signs, one_hot_columns(sample_columns(name, shape[0], shape[1]), shape[1]).T])
