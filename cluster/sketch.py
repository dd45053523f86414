"""A seeded random-probe sketch of named weight matrices: W @ P for k ±1 probe vectors P chosen from the
tensor's name, so that whoever holds W in some form (a plain tensor, a packed GEMM kernel, an LM head reached
through the logits path) can compute the same [rows, k] product and compare.

Unlike the sampled fingerprint (cluster.fingerprint), the sketch touches every element: a wrong row, a stale
layer or a head left on old weights moves it. The two products are taken by different kernels (a oneDNN GEMM,
a torch matmul), so they agree to rounding only, and are compared relative to their scale (`sketch_error`). ±1
probes are exact in every float dtype, so the only difference is the kernels' summation.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Mapping

import torch

# A nonzero error row escapes one ±1 probe with probability ≤ 1/2, all four with ≤ 1/16. Both sides of the
# check read every weight once whatever k is (memory-bound): k = 1, 2, 4 took 0.03-0.05 s each for
# SmolLM2-135M's 0.5 GiB (benchmarks/sketch_probes.py), so fewer probes would weaken the check for nothing.
SKETCH_PROBES = 4
# Largest relative sketch error (`sketch_error`) of a weight served as sent, by the served dtype: fp32
# sums in another order differ by ~1e-7 relative (oneDNN and torch agreed exactly on the tiny model,
# within this bound on SmolLM2-135M); bf16/fp16 kernels round their outputs to 8/11 bits. A stale or wrong
# matrix moves the sketch by its relative change (an optimizer step of lr 2e-5 moves weights of size ~0.02
# by ~1e-3; a skipped layer by ~1).
SKETCH_RTOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 4e-3}
# The bf16 tolerance is wider than one optimizer step, so a weight one version stale passes the sketch: a step
# of lr 2e-5 moves an element of size ~0.02 by a sixth of a bf16 ulp, so about one element in six changes,
# by one ulp. Where the engine serves exactly what was sent (full weights: the learner's own tensors cast to
# the serving dtype), `checked_sketch` adds this many whole columns of the matrix, read through the same
# kernel with one-hot inputs (a sum of one nonzero product: exact in every dtype; a vector's elements are
# read as they are), at least EXACT_ELEMENTS elements where the matrix has them, and `checked_error`
# requires them bit for bit: a stale or partly loaded tensor then fails (thousands of elements, ~1/6 moved).
EXACT_COLUMNS = 4
EXACT_ELEMENTS = 4096


@functools.lru_cache(maxsize=1024)  # a model's tensors (Qwen3-4B: ~400 of cols × k fp32, ≤ 160 KB)
def probes(name: str, cols: int, k: int = SKETCH_PROBES) -> torch.Tensor:
    """[cols, k] fp32 ±1 entries, seeded by `name` alone (the same on every process and device). Stored column
    by column (a transposed view): W @ P then takes a matrix-times-vectors kernel, 2.7-3.5x faster on CPU than
    with row-major probes (median 0.24 -> 0.09 s for SmolLM2-135M's 272 tensors, 2 threads). Kept per (name,
    cols, k), since every sync sketches the same tensors (drawing them was ~0.03 s of a full-weight check):
    the same tensor object is handed to every caller, which must not write into it."""
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    return (
        torch.randint(0, 2, (cols, k), generator=g, dtype=torch.int8).float().mul_(2).sub_(1).T.contiguous().T
    )


def sample_columns(name: str, rows: int, cols: int) -> torch.Tensor:
    """The column indices `checked_sketch` reads exactly, seeded by `name`: EXACT_COLUMNS of them, or as
    many as make EXACT_ELEMENTS elements of a matrix with few rows (a norm's vector: all of it, to 4,096)."""
    n = min(cols, max(EXACT_COLUMNS, -(-EXACT_ELEMENTS // max(rows, 1))))
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()) ^ 0x5EED)
    return torch.randperm(cols, generator=g)[:n].sort().values


def one_hot_columns(columns: torch.Tensor, cols: int) -> torch.Tensor:
    """[cols, len(columns)] fp32: W @ this = W[:, columns], exactly, through any GEMM."""
    out = torch.zeros(cols, len(columns))
    out[columns, torch.arange(len(columns))] = 1.0
    return out


def checked_sketch(name: str, tensor: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """[rows, SKETCH_PROBES + e] fp32 on CPU: the sketch, then the `sample_columns` of `tensor` as served in
    `dtype` (the serving dtype: rounded as the engine's load rounds them; None = as they are)."""
    w = as_matrix(tensor.detach())
    picked = w[:, sample_columns(name, w.shape[0], w.shape[1]).to(w.device)]
    if dtype is not None and w.is_floating_point():
        picked = picked.to(dtype)
    return torch.cat([sketch(name, tensor), picked.float().cpu()], dim=1)


def checked_error(served: torch.Tensor, expected: torch.Tensor) -> float:
    """`sketch_error` of the probe columns of two `checked_sketch`es, or inf when their sampled columns are
    not bit-equal (or the shapes differ)."""
    if served.shape != expected.shape:
        return float("inf")
    if not torch.equal(served[:, SKETCH_PROBES:], expected[:, SKETCH_PROBES:]):
        return float("inf")
    return sketch_error(served[:, :SKETCH_PROBES], expected[:, :SKETCH_PROBES])


def as_matrix(tensor: torch.Tensor) -> torch.Tensor:
    """A weight as [rows, cols]: matrices as they are, vectors (norms, biases) as one row [1, n]."""
    return tensor.reshape(1, -1) if tensor.dim() < 2 else tensor.reshape(tensor.shape[0], -1)


def sketch(name: str, tensor: torch.Tensor, k: int = SKETCH_PROBES) -> torch.Tensor:
    """[rows, k] fp32: as_matrix(tensor) @ probes(name, cols), taken in fp32 on the
    tensor's device, returned on CPU."""
    w = as_matrix(tensor.detach())
    return (w.float() @ probes(name, w.shape[1], k).to(w.device)).cpu()


def sketch_error(served: torch.Tensor, expected: torch.Tensor) -> float:
    """‖served − expected‖ / ‖expected‖ over a sketch ([rows, k] each); inf when the shapes differ, 0 for two
    zero sketches. A dense relative change δ of W moves it by about δ (probes of unit variance)."""
    if served.shape != expected.shape:
        return float("inf")
    scale = expected.double().norm().item()
    diff = (served.double() - expected.double()).norm().item()
    return diff / scale if scale > 0 else (0.0 if diff == 0 else float("inf"))


def low_rank_sketch(base: torch.Tensor, b: torch.Tensor, a: torch.Tensor, p: torch.Tensor,
                    scale: float) -> torch.Tensor:
    """[rows, k] fp32 sketch of W0 + scale·B@A without forming it: base = sketch(name, W0) [rows, k], B
    [rows, r], A [r, cols], p = probes(name, cols) [cols, k]: base + scale·B@(A@P), O((rows + cols)·r·k) work
    instead of a [rows, cols] merge."""
    a, b = a.detach().float(), b.detach().float()
    return base + (b @ (a @ p.to(a.device))).mul_(scale).cpu()


def sketch_mismatch(served: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor],
                    rtol: float) -> str | None:
    """None when every expected tensor's served sketch is within `rtol` (`sketch_error`); else what is off,
    worst first. A name the server did not report counts as off: every expected tensor must be read back."""
    errors = {n: sketch_error(served[n], s) if n in served else float("inf") for n, s in expected.items()}
    off = sorted(((e, n) for n, e in errors.items() if not e <= rtol), reverse=True)
    if not off:
        return None
    worst = ", ".join(f"{n} ({e:.2e})" for e, n in off[:3])
    return (
        f"{len(off)} of {len(errors)} tensors serve other values "
        f"(relative sketch error above {rtol:.0e}): {worst}"
    )
