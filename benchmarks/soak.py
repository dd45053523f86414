"""Soak: a long run on the tiny model in which nothing may grow with the step count.

    .venv/bin/python -m benchmarks.soak [--steps 300] [--window 200] [key=value ...]

The tiny config (voting, isolated: an engine per role and a learner rank per policy, all Ray actors in one
placement group) syncs weights every step and checkpoints every 10 steps keeping 2. After every step a
callback samples the RSS and open descriptors of the driver and of every actor (pids from Ray's state API,
read with psutil on this node), the object store's bytes and objects in use (after the step's sync has
released its payloads), the cluster's live actors and placement groups, the run directory's size without
rollouts/, and the checkpoint folders on disk. Each figure's growth per 100 steps is the least-squares slope
over the last `--window` steps; the targets:

- RSS: < 1% per 100 steps, every process, fitted to the minimum of every 10 steps (what a process keeps: a
  learner's RSS right after an update swings by tens of MiB with the step's batch, allocator high-water marks
  that are released again; the fit to every sample is printed beside it);
- object store: back to its level after the first step, after every step;
- descriptors: no growth (< 1 per 100 steps, every process);
- actors and placement groups: exactly the run's members and its one placement group, every step;
- checkpoints on disk: never more than keep_last + keep_best.

Exit code 0 when every target holds, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil
import ray

from jobs.config import load_config
from jobs.config.schema import TrainConfig
from jobs.plan.layout import run_layout
from jobs.train import train

SOAK = ["run_name=soak", "checkpoint.every=10", "checkpoint.keep_last=2", "checkpoint.keep_best=1",
        "eval_every=10", "data.eval_size=4", "ray.include_dashboard=true", "tracking.progress=line"]
RSS_BLOCK = 10  # RSS growth is fitted to the minimum of every 10 steps
SETTLE_S = 5.0  # object frees are asynchronous: how long a step's leftovers may take to go


@dataclass
class Sample:
    """One step's census. `rss` and `fds` are per process: `driver` and each actor by name."""

    step: int
    rss: dict[str, int]
    fds: dict[str, int]
    store_bytes: int
    store_objects: int
    actors: list[str]
    groups: list[str]
    run_dir_bytes: int  # without rollouts/
    checkpoint_bytes: int  # of which the checkpoint folder (when it is inside the run dir)
    checkpoints: int  # step_* folders on disk, complete or being written
    workers_started: int  # worker processes the cluster started so far (one core-worker log file each)


def expected_actors(cfg: TrainConfig) -> list[str]:
    """Every member the run's placement group holds a bundle for, by name."""
    return sorted(f"{d.name}:{i}" for d in run_layout(cfg).demands for i in range(d.n))


def store_usage() -> tuple[int, int]:
    """(bytes, objects) in the object store, summed over the cluster's nodes."""
    from ray._private import state
    from ray._private.internal_api import get_memory_info_reply

    stats = get_memory_info_reply(state.state).store_stats
    return int(stats.object_store_bytes_used), int(stats.num_local_objects)


def settled_store(baseline: tuple[int, int] | None, quiet_s: float = 1.0) -> tuple[int, int]:
    """The store's usage once it equals `baseline`, or once it has not changed for `quiet_s` (frees are
    asynchronous), or after SETTLE_S: whatever it then holds."""
    end = time.monotonic() + SETTLE_S
    last, since = store_usage(), time.monotonic()
    while last != baseline and time.monotonic() - since < quiet_s and time.monotonic() < end:
        time.sleep(0.1)
        now = store_usage()
        if now != last:
            last, since = now, time.monotonic()
    return last


def live_members() -> tuple[dict[str, int], list[str]]:
    """The cluster's live actors (name -> pid) and live placement groups (names), through the state API."""
    from ray.util.state import list_actors, list_placement_groups

    address = ray.get_runtime_context().gcs_address
    actors = list_actors(address=address, filters=[("state", "=", "ALIVE")], limit=10_000,
                         raise_on_missing_output=False)
    groups = list_placement_groups(address=address, limit=10_000, raise_on_missing_output=False)
    return ({a.name or a.actor_id: a.pid for a in actors},
            sorted(g.name or g.placement_group_id for g in groups if g.state != "REMOVED"))


def workers_started() -> int:
    """Worker processes this node's raylet has started (each leaves a python-core-worker-*.log behind)."""
    from ray._private import worker

    return len(list(Path(worker._global_node.get_logs_dir_path()).glob("python-core-worker-*.log")))


def dir_bytes(root: Path, skip: str = "") -> int:
    if not root.is_dir():
        return 0
    return sum(p.stat().st_size for p in root.rglob("*")
               if p.is_file() and p.relative_to(root).parts[0] != skip)


def process_figures(pids: dict[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    rss, fds = {}, {}
    for label, pid in pids.items():
        try:
            proc = psutil.Process(pid)
            rss[label], fds[label] = proc.memory_info().rss, proc.num_fds()
        except psutil.Error:  # an actor on another node, or one that just ended: not measurable here
            continue
    return rss, fds


class Census:
    """A StepCallback: one Sample per finished step."""

    def __init__(self, run_dir: Path, checkpoints: Path, out: Path | None = None):
        self.run_dir, self.checkpoints, self.out = run_dir, checkpoints, out
        self.samples: list[Sample] = []
        self.baseline: tuple[int, int] | None = None

    def on_step(self, step: int, metrics: dict[str, float], checkpoint: Path | None) -> None:
        store = settled_store(self.baseline)
        self.baseline = self.baseline or store
        actors, groups = live_members()
        rss, fds = process_figures({"driver": os.getpid(), **actors})
        folders = (
            [p for p in self.checkpoints.glob("step_*") if p.is_dir()] if self.checkpoints.is_dir() else []
        )
        self.samples.append(Sample(step, rss, fds, *store, sorted(actors), groups,
                                   dir_bytes(self.run_dir, skip="rollouts"), dir_bytes(self.checkpoints),
                                   len(folders), workers_started()))
        if self.out is not None:
            with self.out.open("a") as f:
                f.write(json.dumps(asdict(self.samples[-1])) + "\n")


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ys over xs (0 for fewer than two points)."""
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0


def block_minima(
    xs: Sequence[float], ys: Sequence[float], block: int = RSS_BLOCK
) -> tuple[list[float], list[float]]:
    """The lowest y of every `block` consecutive points, at the block's middle x: the memory a process keeps.
    An update's transient peak (allocator high-water marks that vary with the step's batch) is not growth."""
    starts = range(0, len(xs) - block + 1, block) if len(xs) >= 2 * block else range(len(xs))
    size = block if len(xs) >= 2 * block else 1
    return ([sum(xs[i:i + size]) / size for i in starts], [min(ys[i:i + size]) for i in starts])


def growth_rows(samples: list[Sample], window: int) -> list[tuple[str, str, bool]]:
    """(figure, growth per 100 steps over the last `window` samples, target met) for RSS, descriptors and the
    run directory."""
    tail = samples[-window:]
    steps = [float(s.step) for s in tail]
    rows = []
    for label in sorted({k for s in tail for k in s.rss}):
        pts = [(st, s.rss[label], s.fds[label]) for st, s in zip(steps, tail, strict=True) if label in s.rss]
        xs, rss, fds = [p[0] for p in pts], [p[1] for p in pts], [p[2] for p in pts]
        floor_x, floor = block_minima(xs, rss)
        per100, raw = 100 * slope(floor_x, floor), 100 * slope(xs, rss)
        pct = per100 / (sum(floor) / len(floor)) * 100
        rows.append((f"rss {label}", f"{per100 / 2**20:+.2f} MiB ({pct:+.2f}%) retained (10-step minima); "
                     f"every-step fit {raw / 2**20:+.2f} MiB; now {rss[-1] / 2**20:.0f} MiB", pct < 1.0))
        fd_growth = 100 * slope(xs, fds)
        rows.append((f"fds {label}", f"{fd_growth:+.2f} (now {fds[-1]}, range {min(fds)}-{max(fds)})",
                     fd_growth < 1.0))
    run_growth = 100 * slope(steps, [float(s.run_dir_bytes) for s in tail])
    ckpt_growth = 100 * slope(steps, [float(s.checkpoint_bytes) for s in tail])
    rows.append(
        (
            "run dir without rollouts",
            f"{run_growth / 2**10:+.1f} KiB (now {tail[-1].run_dir_bytes / 2**20:.1f}"
            " MiB; metrics.jsonl and tb/ take a line per step by design)",
            True,
        )
    )
    rows.append(("  of which checkpoints", f"{ckpt_growth / 2**10:+.1f} KiB (now "
                 f"{tail[-1].checkpoint_bytes / 2**20:.1f} MiB)", True))
    workers = 100 * slope(steps, [float(s.workers_started) for s in tail])
    rows.append(
        ("worker processes started", f"{workers:+.2f} (so far {tail[-1].workers_started})", workers < 1.0)
    )
    return rows


def invariant_rows(
    samples: list[Sample], actors: list[str], run_name: str, keep: int
) -> list[tuple[str, str, bool]]:
    """Every-step checks: the object store's level, the actor and placement-group
    census, checkpoints on disk."""
    base = (samples[0].store_bytes, samples[0].store_objects)
    off = [s.step for s in samples if (s.store_bytes, s.store_objects) != base]
    wrong = [s.step for s in samples if s.actors != actors or s.groups != [f"{run_name}:placement"]]
    most = max(s.checkpoints for s in samples)
    return [
        ("object store after each step", f"{base[0]} B in {base[1]} objects after step 1; "
         f"{len(off)} steps off it{f' (first: {off[:5]})' if off else ''}", not off),
        ("actors / placement groups", f"{len(actors)} actors + 1 group expected; {len(wrong)} steps "
         f"differ{f' (first: {wrong[:5]})' if wrong else ''}", not wrong),
        ("checkpoints on disk", f"at most {most} (keep_last + keep_best = {keep})", most <= keep),
    ]


def report(samples: list[Sample], cfg: TrainConfig, window: int) -> tuple[str, bool]:
    keep = cfg.checkpoint.keep_last + cfg.checkpoint.keep_best
    rows = growth_rows(samples, window) + invariant_rows(samples, expected_actors(cfg), cfg.run_name, keep)
    width = max(len(r[0]) for r in rows)
    lines = [f"soak: {len(samples)} steps, growth per 100 steps over the last {min(window, len(samples))}"]
    lines += [f"  {name:<{width}}  {'ok  ' if ok else 'FAIL'}  {text}" for name, text, ok in rows]
    return "\n".join(lines), all(ok for _, _, ok in rows)


def soak(
    steps: int, overrides: list[str], out_dir: str, samples: Path | None = None
) -> tuple[list[Sample], Any]:
    """Run the soak; every step's Sample is also appended to `samples` (JSONL) as it is taken."""
    cfg = load_config("jobs/configs/tiny.yaml", [*SOAK, f"steps={steps}", f"out_dir={out_dir}", *overrides])
    run_dir = Path(cfg.out_dir) / cfg.run_name
    census = Census(
        run_dir, Path(cfg.checkpoint.dir) if cfg.checkpoint.dir else run_dir / "checkpoints", samples
    )
    train(cfg, callbacks=(census,))
    return census.samples, cfg


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument(
        "--window", type=int, default=200, help="steps the growth is fitted over (the last ones)"
    )
    parser.add_argument("--samples", help="write every step's sample to this JSONL file")
    parser.add_argument("--report", help="no run: report on the samples of an earlier one (a --samples file)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the tiny config")
    args = parser.parse_args(argv)
    if args.report:
        cfg = load_config("jobs/configs/tiny.yaml", [*SOAK, *args.overrides])
        samples = [Sample(**json.loads(line)) for line in Path(args.report).read_text().splitlines() if line]
        text, ok = report(samples, cfg, args.window)
        print(text)
        return 0 if ok else 1
    if args.samples:
        Path(args.samples).unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="soak_") as out:
        samples, cfg = soak(args.steps, args.overrides, out, Path(args.samples) if args.samples else None)
    text, ok = report(samples, cfg, args.window)
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
