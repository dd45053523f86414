"""The CPU learner's measured peak against the planner's estimate (learners/compute/memory.py), at a few
shapes of a Qwen3-shaped body with Qwen3's real vocabulary: one `Learner.update` (fp32, full fine-tuning, the
whole batch one micro-batch, role diagnostics off), its peak RSS above the loaded model's, next to the
estimate of the terms that rise during the update (gradients, optimizer state, activations, logits).

`python -m benchmarks.learner_peak` prints the table; each shape runs in a fresh subprocess
(`--one`), so one shape's allocations do not hide another's. Run it under the heavy lock: the largest
default shape peaks near 2 GB.
`--layouts` prints, at 8 x 2,048, rows of one length (no attention mask) beside padded rows (the last one 64
tokens short: a [rows, T, T] mask) and packed rows (learner.padding_free: an [N, N] mask on CPU), measured and
estimated (learners.compute.memory.mask_entries); the packed 8x2048 peaks near 4 GB.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from jobs.models.shape import shape_of
from learners.compute.memory import LearnerSetup, ModelShape, learner_memory

# A Qwen3-shaped body small enough for CPU (2 layers, hidden 64), the real vocabulary: the logits dominate.
MODEL = ("builtin:qwen3-0.6b-shape?vocab=151936&layers=2&hidden=64&intermediate=192&heads=4&kv_heads=2"
         "&head_dim=32")
SHAPES = ((1, 1024), (4, 1024), (8, 2048))  # rows x tokens per row
PROMPT = 64  # prompt tokens per row (the rest is response)
CHUNK = 1024  # learner.logits_chunk_tokens, its default


LAYOUTS = ("even", "padded", "packed")  # rows of one length | the last row SHORT tokens short | padding-free
SHORT = 64


def setup_of(rows: int, width: int, checkpointing: bool, chunk: int, layout: str = "even") -> LearnerSetup:
    return LearnerSetup(tokens=rows * width, lora_rank=0, zero_stage=0, ranks=1,
                        checkpointing=checkpointing, logits_chunk=chunk, role_rows=0, device="cpu",
                        padding_free=layout == "packed", longest_row=0 if layout == "even" else width)


def estimate(shape: ModelShape, setup: LearnerSetup) -> float:
    """Bytes the update adds over the loaded model: all terms but the weights."""
    m = learner_memory(shape, setup)
    return m.total() - m.weights


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field))


def measure_one(
    rows: int, width: int, checkpointing: bool, chunk: int, layout: str = "even"
) -> dict[str, float]:
    """In this process: build the body, one update, the peak RSS rise over the loaded learner (bytes)."""
    import torch

    from jobs.config import load_config
    from jobs.models.resolve import resolve_model
    from learners.learner import Learner
    from learners.update.losses import local_normalizer
    from learners.update.ppo_plan import UpdatePlan
    from tests.builders import learner_spec, random_batch

    torch.set_num_threads(1)
    overrides = ["model.dtype=float32", "model.lora.enabled=false", "learner.role_grad_diagnostics=false",
                 f"learner.micro_batch_size={rows}", f"learner.gradient_checkpointing={checkpointing}",
                 f"learner.logits_chunk_tokens={chunk}", f"model.path={MODEL}",
                 f"learner.padding_free={layout == 'packed'}"]
    cfg = load_config("jobs/configs/tiny.yaml", overrides)
    learner = Learner(
        learner_spec(cfg, resolve_model(MODEL))
    )
    batch = random_batch(rows, width, PROMPT, shape_of(MODEL).vocab)
    if layout != "even":
        batch.attention_mask[-1, width - SHORT:] = batch.loss_mask[-1, width - SHORT:] = False
    with open("/proc/self/clear_refs", "w") as f:  # resets VmHWM to the current RSS (Linux)
        f.write("5")
    before = _rss_kib("VmRSS:")
    learner.update(batch, UpdatePlan.whole(rows, local_normalizer(batch.loss_mask[:, 1:], "token_mean")))
    return {"measured": (_rss_kib("VmHWM:") - before) * 1024.0}


def measure(rows: int, width: int, checkpointing: bool = False, chunk: int = CHUNK,
            layout: str = "even") -> dict[str, float]:
    """One shape in a fresh subprocess: {measured, estimate} bytes."""
    args = [sys.executable, "-m", "benchmarks.learner_peak", "--one", f"{rows}x{width}", "--layout", layout]
    args += ["--checkpointing"] * checkpointing + ["--chunk", str(chunk)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
    out = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env, check=True)
    measured = json.loads(out.stdout.strip().splitlines()[-1])["measured"]
    setup = setup_of(rows, width, checkpointing, chunk, layout)
    return {"measured": measured, "estimate": estimate(shape_of(MODEL), setup)}


def layouts_table(chunk: int) -> None:
    """Per shape and checkpointing: each layout's measured and estimated rise,
    and both less the even rows'."""
    print(f"{MODEL}, learner.logits_chunk_tokens={chunk}")
    print(f"{'shape':>10} {'ckpt':>5} {'layout':>7} {'measured MB':>12} {'estimate MB':>12} {'est/meas':>9} "
          f"{'mask meas MB':>13} {'mask est MB':>12}")
    for rows, width in SHAPES[-1:]:  # at 4 x 1,024 the masks (tens of MB) are within the RSS noise
        for ckpt in (False, True):
            even = None
            for layout in LAYOUTS:
                r = measure(rows, width, ckpt, chunk, layout)
                even = even or r
                print(f"{rows}x{width:<8} {ckpt!s:>5} {layout:>7} {r['measured'] / 1e6:12.1f} "
                      f"{r['estimate'] / 1e6:12.1f} {r['estimate'] / r['measured']:9.2f} "
                      f"{(r['measured'] - even['measured']) / 1e6:13.1f} "
                      f"{(r['estimate'] - even['estimate']) / 1e6:12.1f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.learner_peak", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--one", help="ROWSxWIDTH: measure one shape in this process, print JSON")
    parser.add_argument("--checkpointing", action="store_true")
    parser.add_argument(
        "--chunk", type=int, default=CHUNK, help="learner.logits_chunk_tokens (0: the full logits)"
    )
    parser.add_argument("--layout", choices=LAYOUTS, default="even", help="with --one: the rows' layout")
    parser.add_argument("--layouts", action="store_true", help="even, padded and packed rows side by side")
    args = parser.parse_args(argv)
    if args.one:
        rows, width = (int(x) for x in args.one.split("x"))
        print(json.dumps(measure_one(rows, width, args.checkpointing, args.chunk, args.layout)))
        return 0
    if args.layouts:
        layouts_table(args.chunk)
        return 0
    print(f"{MODEL}, learner.logits_chunk_tokens={args.chunk}")
    print(f"{'shape':>10} {'ckpt':>5} {'measured MB':>12} {'estimate MB':>12} {'est/meas':>9}")
    for rows, width in SHAPES:
        for ckpt in (False, True):
            r = measure(rows, width, ckpt, args.chunk)
            print(f"{rows}x{width:<8} {ckpt!s:>5} {r['measured'] / 1e6:12.1f} {r['estimate'] / 1e6:12.1f} "
                  f"{r['estimate'] / r['measured']:9.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
