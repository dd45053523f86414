"""What the served-weight check costs by probe count k (cluster.sketch.SKETCH_PROBES), both of its sides, side
by side in one run: the sent side's W @ P and the served side's read through vLLM's CPU GEMM (oneDNN) with the
k probes as input rows, over SmolLM2-135M's shapes (30 layers of fused qkv, o, fused gate_up and down linears,
and the 49,152 x 576 LM head), random fp32 weights, the k values taking turns.

    .venv/bin/python -m benchmarks.sketch_probes [--reps 7] [--threads 2]

Both sides read every weight once per check whatever k is; the question is whether fewer probes than 4 would
read them faster (they would detect less: a nonzero error row escapes one ±1 probe with probability ≤ 1/2).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from cluster.sketch import probes

HIDDEN, INTER, LAYERS, VOCAB = 576, 1536, 30, 49152
SHAPES = {
    "qkv": (960, HIDDEN),
    "o": (HIDDEN, HIDDEN),
    "gate_up": (2 * INTER, HIDDEN),
    "down": (HIDDEN, INTER),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from vllm import _custom_ops as ops

    g = torch.Generator().manual_seed(0)
    weights = {
        f"{i}.{n}": torch.randn(s, generator=g) * 0.02 for i in range(LAYERS) for n, s in SHAPES.items()
    }
    weights["lm_head"] = torch.randn(VOCAB, HIDDEN, generator=g) * 0.02
    kernels = {name: ops.create_onednn_mm(w.t(), 32) for name, w in weights.items()}  # as vLLM serves them
    times: dict[str, list[float]] = {}
    for _ in range(args.reps):
        for k in (1, 2, 4, 8):
            p = {name: probes(name, w.shape[1], k) for name, w in weights.items()}
            rows = {name: q.T.contiguous() for name, q in p.items()}
            t0 = time.perf_counter()
            for name, w in weights.items():
                w @ p[name]
            t1 = time.perf_counter()
            for name, kernel in kernels.items():
                ops.onednn_mm(kernel, rows[name], None)
            times.setdefault(f"k={k}", []).extend([t1 - t0, time.perf_counter() - t1])
    gib = sum(w.numel() * w.element_size() for w in weights.values()) / 2**30
    print(
        f"the check's two sides over {gib:.2f} GiB of weights, {args.threads} threads, median of {args.reps}:"
    )
    print(f"  {'probes':8s} {'sent W @ P':>12s} {'served kernel':>14s}")
    for label, ts in times.items():
        sent, served = statistics.median(ts[0::2]), statistics.median(ts[1::2])
        print(f"  {label:8s} {sent:10.3f} s {served:12.3f} s")


if __name__ == "__main__":
    main()
