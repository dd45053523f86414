"""Gradient checkpointing at study 3's learner shapes, off and on side by side: peak RSS, the update's
seconds, and whether the trained weights are the same bits.

    flock /tmp/marl-heavy.lock .venv/bin/python -m benchmarks.study_checkpointing \
        [--shapes 16x650:620,48x170:110]

The config is a committed study 3 run's (SmolLM2-135M, LoRA r16, fp32, micro-batches of 8 rows); each shape is
ROWSxTOKENS:PROMPT, every row trained (random ids, advantages ±1), one `Learner.update` in a fresh subprocess
per variant so that one peak cannot hide another. The defaults are voting's aggregator (16 rows of the
few-shot prompt and three candidates, ~650 tokens) and its three generators (48 rows of ~170 tokens). The
off variant of the aggregator's shape peaks near 19 GB: run it on a quiet box.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

CONFIG = Path(__file__).resolve().parents[1] / "studies/cpu_smollm2_v3/runs/voting-shared/seed0/config.yaml"
SHAPES = "16x650:620,48x170:110"


@dataclass(frozen=True)
class Measured:
    peak_gb: float
    s: float
    weights: str  # a hash of every trained weight's bytes
    grad_norm: float


def measure_one(rows: int, tokens: int, prompt: int, checkpointing: bool) -> Measured:
    """In this process: one update; its peak RSS, seconds, and a hash of every trained weight."""
    from benchmarks.update import make_batch
    from jobs.config import load_config
    from jobs.models.resolve import resolve_model
    from learners.learner import Learner
    from learners.update.losses import local_normalizer
    from learners.update.ppo_plan import UpdatePlan
    from tests.builders import learner_spec

    cfg = load_config(str(CONFIG), [f"learner.gradient_checkpointing={checkpointing}", "learner.ranks=0"])
    spec = learner_spec(cfg, resolve_model(cfg.model.path))
    learner = Learner(spec)
    vocab = learner.model.get_output_embeddings().weight.shape[0]
    batch = make_batch(rows, tokens, prompt, vocab)
    plan = UpdatePlan.whole(len(batch), local_normalizer(batch.loss_mask[:, 1:], "token_mean"))
    start = time.perf_counter()
    metrics = learner.update(batch, plan)
    seconds = time.perf_counter() - start
    digest = hashlib.sha256()
    for _, weight in sorted(learner.get_weights().items()):
        digest.update(weight.contiguous().numpy().tobytes())
    with open("/proc/self/status") as f:
        peak_kib = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    return Measured(peak_kib / 2**20, seconds, digest.hexdigest()[:16], metrics.step.grad_norm)


def spawn(shape: str, checkpointing: bool) -> Measured | str:
    cmd = [sys.executable, "-m", "benchmarks.study_checkpointing", "--one", shape]
    cmd += ["--checkpointing"] if checkpointing else []
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        return f"exit {done.returncode}: {(done.stderr.strip().splitlines() or [''])[-1]}"
    return Measured(**json.loads(done.stdout.strip().splitlines()[-1]))


def parse_shape(text: str) -> tuple[int, int, int]:
    size, prompt = text.split(":")
    rows, tokens = size.split("x")
    return int(rows), int(tokens), int(prompt)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.study_checkpointing", description=__doc__)
    parser.add_argument("--shapes", default=SHAPES, help="ROWSxTOKENS:PROMPT, comma-separated")
    parser.add_argument("--one", help="measure one shape in this process, print JSON")
    parser.add_argument("--checkpointing", action="store_true")
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(asdict(measure_one(*parse_shape(args.one), args.checkpointing))))
        return 0
    print(f"{'shape':>14} {'variant':>8} {'peak GB':>8} {'update s':>9} {'weights':>17}")
    for shape in args.shapes.split(","):
        off, on = spawn(shape, False), spawn(shape, True)
        for name, r in (("off", off), ("on", on)):
            line = r if isinstance(r, str) else f"{r.peak_gb:8.2f} {r.s:9.1f} {r.weights:>17}"
            print(f"{shape:>14} {name:>8} {line}")
        if isinstance(off, Measured) and isinstance(on, Measured):
            same = "bit-identical" if off.weights == on.weights else "DIFFERENT"
            print(f"{shape:>14}  on/off: peak {on.peak_gb / off.peak_gb:.2f}x, time {on.s / off.s:.2f}x, "
                  f"weights {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
