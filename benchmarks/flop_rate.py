"""A learner step against the machine's own GEMM peak (benchmarks/update.py prints it).

The step's FLOPs are counted from the model's shapes; the peak is what `torch.mm` reaches on this machine for
the very GEMMs the step runs (each linear's forward and its backward to the activations, the LM head in its
chunks); the largest remaining gap is named from a profile of one step, by its share of the step's CPU time.

FLOPs per token (N: the weights of the model's linear layers, the LM head included; L layers of width d;
`ctx` the mean causal context): forward 2·N + attention 4·ctx·d·L; backward 2·N to the activations, 2·N
more for the weight gradients when the weights train (full fine-tuning: the 6·N·tokens rule; LoRA's frozen
base has no weight-gradient GEMM: 4·N), attention 8·ctx·d·L. The LM head (V·d) runs on loss tokens only,
its logits recomputed once in backward. LoRA's own low-rank products are left out (r·(in + out) per
linear: under 1 % of N at r = 64 here).
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class StepShapes:
    linears: Counter[tuple[int, int]]  # (in, out) of each base linear, the LM head included -> count
    layers: int
    width: int
    vocab: int

    @property
    def params(self) -> int:
        return sum(i * o * n for (i, o), n in self.linears.items())


def step_shapes(model: Any) -> StepShapes:
    """The linears' (in, out) shapes of `model` (a LoRA model's base layers; the LM head counted once, tied or
    not), its layer count, width and vocabulary."""
    shapes: Counter[tuple[int, int]] = Counter()
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and "lora_" not in name:
            shapes[(module.in_features, module.out_features)] += 1
    cfg = model.config
    head = (int(cfg.hidden_size), int(cfg.vocab_size))
    if not shapes[head]:  # a head tied to the embedding is not an nn.Linear of its own everywhere
        shapes[head] += 1
    return StepShapes(shapes, int(cfg.num_hidden_layers), int(cfg.hidden_size), int(cfg.vocab_size))


def step_flops(shapes: StepShapes, tokens: int, loss_tokens: int, seq: int, full: bool) -> float:
    """FLOPs of one forward + backward over `tokens` positions of rows `seq` long, `loss_tokens` of them
    through the LM head (learners.compute.logprob_head runs it on loss positions only; module docstring)."""
    head = shapes.vocab * shapes.width
    attention = 4 * (seq + 1) / 2 * shapes.width * shapes.layers
    body = (2 + 2 + (2 if full else 0)) * (shapes.params - head) + 3 * attention
    # the head: forward, recomputed in backward, backward to the activations (and to a trained head's weight)
    return body * tokens + (8 if full else 6) * head * loss_tokens


def forward_flops(shapes: StepShapes, tokens: int, loss_tokens: int, seq: int) -> float:
    """FLOPs of one no-grad forward (an extra pass: the movement's, the metrics')."""
    head = shapes.vocab * shapes.width
    attention = 4 * (seq + 1) / 2 * shapes.width * shapes.layers
    return (2 * (shapes.params - head) + attention) * tokens + 2 * head * loss_tokens


def _mm_seconds(m: int, k: int, n: int, reps: int) -> float:
    a, b = torch.randn(m, k), torch.randn(k, n)
    torch.mm(a, b)  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def gemm_peak(shapes: StepShapes, rows: int, chunk: int, reps: int = 5) -> float:
    """FLOP/s that fp32 `torch.mm` reaches on the step's GEMMs: each linear's forward [rows, in] x [in, out]
    and backward to the activations [rows, out] x [out, in], weighted by how often the step runs them (the
    head in chunks of `chunk` rows)."""
    flops, seconds = 0.0, 0.0
    for (i, o), count in shapes.linears.items():
        m = min(rows, chunk) if o == shapes.vocab else rows
        calls = count * (rows / m)
        for k, n in ((i, o), (o, i)):
            flops += calls * 2 * m * k * n
            seconds += calls * _mm_seconds(m, k, n, reps)
    return flops / seconds


def top_ops(step: Callable[[], object], count: int = 5) -> list[tuple[str, float]]:
    """(op, share of the step's self CPU time) of the `count` largest ops of one profiled step."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    events = [(e.key, e.self_cpu_time_total) for e in prof.key_averages()]
    total = sum(t for _, t in events) or 1.0
    return [(k, t / total) for k, t in sorted(events, key=lambda e: -e[1])[:count]]
