"""The studies' cell runner: one cell (seed x arm) at a time, from one pinned commit, resumable.

A study names its tag, its arms' sweep file and how one cell's sweep is built (`Study`); this module owns what
every study's runner does the same way: refusing any commit but the tag's on a clean tree, running (or
resuming, or skipping when finished) one cell's sweep under `nice`, exporting it at once into the study's
folder of a checkout of main, skipping cells already exported there, and starting a cell only when its
estimate fits before `--until` (UTC), so that a session's end does not cut a cell.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STORAGE = Path("runs/sweeps")

Arm = dict[str, Any]
# (seed, arm) -> the cell's sweep file as a dict
CellSweep = Callable[[int, Arm], dict[str, Any]]
# (sweep storage, export root, commit) -> the exported folders' names
Export = Callable[[Path, Path, str], list[str]]


class StudyError(RuntimeError):
    """The study cannot run from here (another commit, a dirty tree) or a sweep failed."""


@dataclass(frozen=True)
class Study:
    """What one study's runner fixes: its tag, its cells' order and sweeps, its estimates and its export."""

    tag: str
    cell_sweep: CellSweep
    arm_key: Callable[[Arm], str]  # the short name of an arm (its estimate's key)
    estimate_min: dict[str, float]  # per arm key: minutes a cell is budgeted on a quiet box
    export: Export
    nice: int = 10
    measured: dict[str, float] = field(default_factory=dict)  # per arm key: the longest cell seen here


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], check=True, capture_output=True, text=True).stdout.strip()


def check_commit(tag: str) -> str:
    """The commit `tag` names, when HEAD is it and the tree is clean; StudyError otherwise."""
    try:
        pinned = _git("rev-parse", f"{tag}^{{commit}}")
    except subprocess.CalledProcessError:
        raise StudyError(f"no tag {tag}: the study runs only from its pinned commit") from None
    head = _git("rev-parse", "HEAD")
    if head != pinned:
        raise StudyError(
            f"HEAD is {head[:12]}, the study's commit ({tag}) is {pinned[:12]}: run it from a worktree "
            f"at the tag (git worktree add <dir> {tag})"
        )
    if _git("status", "--porcelain", "--untracked-files=no"):
        raise StudyError("the tree has uncommitted changes: the runs would not record the pinned commit")
    return pinned


def exported(root: Path, seed: int, arm: Arm) -> bool:
    """Whether the cell's run is already in the study's folder (the export's destination: <arm>/seed<s>/)."""
    folder = f"{arm['marl.workflow']}-{arm['marl.sharing']}"
    return (root / folder / f"seed{seed}" / "metrics.jsonl").is_file()


def fits(until: dt.datetime | None, minutes: float) -> bool:
    return until is None or dt.datetime.now(dt.UTC) + dt.timedelta(minutes=minutes) <= until


def parse_until(text: str | None) -> dt.datetime | None:
    """HH:MM UTC, today or (when already past) tomorrow."""
    if text is None:
        return None
    now = dt.datetime.now(dt.UTC)
    hour, minute = (int(x) for x in text.split(":"))
    until = now.replace(hour=hour, minute=minute, second=0, microsecond=0)
    return until if until > now else until + dt.timedelta(days=1)


def run_sweep_file(path: Path, name: str, nice: int) -> None:
    """Run (or resume, or skip when finished) one sweep; StudyError when it does not finish."""
    done = STORAGE / f"{name}.done"
    if done.exists():
        print(f"[study] {name}: finished earlier, skipped", flush=True)
        return
    resume = (STORAGE / name).is_dir()
    cmd = ["nice", "-n", str(nice), sys.executable, "-m", "jobs.sweep", "--config", str(path),
           *(["--resume"] if resume else [])]
    print(f"[study] {name}: {'resuming' if resume else 'starting'}: {' '.join(cmd)}", flush=True)
    rc = subprocess.call(cmd)
    if rc != 0:
        raise StudyError(f"{name}: jobs.sweep exited {rc} (130: interrupted; run this again to resume)")
    done.write_text("finished\n")


def run_cell(study: Study, seed: int, arm: Arm, export: Path | None, commit: str) -> None:
    """Write the cell's sweep file beside its storage (what ran can be read back), run it, export it."""
    # imported here: OmegaConf only when a cell runs, so the refusals above stay cheap to test
    from omegaconf import OmegaConf

    spec = study.cell_sweep(seed, arm)
    path = STORAGE / f"{spec['name']}.yaml"
    OmegaConf.save(OmegaConf.create(spec), path)
    key = study.arm_key(arm)
    start = time.monotonic()
    run_sweep_file(path, spec["name"], study.nice)
    study.measured[key] = max(study.measured.get(key, 0.0), (time.monotonic() - start) / 60)
    if export is not None:
        names = study.export(STORAGE / spec["name"], export, commit)
        print(f"[study] {spec['name']}: exported {', '.join(names)} to {export}", flush=True)


def run_cells(
    study: Study, order: Sequence[tuple[int, Arm]], export: Path | None, until: dt.datetime | None
) -> int:
    """Every cell of `order` not exported yet, while its estimate fits; 0, or 2 on a StudyError."""
    try:
        commit = check_commit(study.tag)
        print(f"[study] commit {commit}", flush=True)
        STORAGE.mkdir(parents=True, exist_ok=True)
        for seed, arm in order:
            key = study.arm_key(arm)
            if export is not None and exported(export, seed, arm):
                print(f"[study] seed {seed} {key}: exported already, skipped", flush=True)
                continue
            estimate = max(study.estimate_min[key], study.measured.get(key, 0.0))
            if not fits(until, estimate):
                print(f"[study] seed {seed} {key}: ~{estimate:.0f} min does not fit before "
                      f"{until:%H:%M} UTC; stopping here (run again to go on)", flush=True)
                return 0
            run_cell(study, seed, arm, export, commit)
    except StudyError as e:
        print(f"[study] {e}", file=sys.stderr)
        return 2
    return 0
