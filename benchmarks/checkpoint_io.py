"""Checkpoint write / read cost of one policy: seconds and bytes, full weights and LoRA.

    .venv/bin/python -m benchmarks.checkpoint_io [--model builtin:tiny]
    [--lora-rank 0] [--reps 3] [--dir /tmp/x]

One in-process learner takes one (empty) update so its optimizer holds its moments, then the driver's commit
path (jobs/driver/run_checkpoints.write: learner files + driver state + manifest, every file fsynced, rename,
`latest`) and the restore (LearnerGroup.load) are timed. Prints the median seconds and the bytes on disk.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from jobs.config import load_config, to_yaml
from jobs.driver import run_checkpoints as ckpt
from jobs.models.resolve import resolve_model
from learners.batch import empty_batch
from learners.group import LearnerGroup
from tests.builders import learner_spec


def _group(model: str, lora_rank: int) -> tuple[LearnerGroup, str]:
    lora = [f"model.lora.enabled={lora_rank > 0}", f"model.lora.rank={max(lora_rank, 1)}"]
    cfg = load_config("jobs/configs/tiny.yaml", [f"model.path={model}", "learner.ranks=0", *lora])
    spec = learner_spec(cfg, resolve_model(model), temperature=0.7)
    group = LearnerGroup(spec, "bench")
    group.update(empty_batch("p", 0))  # zero gradients still give the optimizer its moments
    return group, to_yaml(cfg)


def measure(model: str, lora_rank: int, reps: int, root: Path) -> dict[str, float]:
    group, config_yaml = _group(model, lora_rank)
    writes, reads, size = [], [], 0
    for rep in range(reps):
        t0 = time.perf_counter()
        folder = ckpt.write(root, ckpt.Progress(step=rep + 1), {"p": group}, config_yaml)
        writes.append(time.perf_counter() - t0)
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        t0 = time.perf_counter()
        group.load(str(folder / "policies" / "p"))
        reads.append(time.perf_counter() - t0)
        ckpt.prune(root, keep_last=1, keep_best=0)
    group.shutdown()
    return {"write_s": statistics.median(writes), "read_s": statistics.median(reads), "bytes": float(size)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:tiny")
    parser.add_argument("--lora-rank", type=int, default=0, help="0 = full weights")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--dir", default="", help="where to write (default: a temp dir, removed after)")
    args = parser.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="ckpt-bench-"))
    try:
        m = measure(args.model, args.lora_rank, args.reps, root)
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    kind = f"LoRA r={args.lora_rank}" if args.lora_rank else "full weights"
    print(f"{args.model} ({kind}): write {m['write_s']:.2f}s  read {m['read_s']:.2f}s  "
          f"{m['bytes'] / 2**20:.1f} MiB  ({m['bytes'] / 2**20 / max(m['write_s'], 1e-9):.0f} MiB/s written)")


if __name__ == "__main__":
    main()
