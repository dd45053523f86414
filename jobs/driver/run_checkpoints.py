"""Driver checkpoints: the on-disk layout, the atomic commit, discovery for resume, pruning.

    <dir>/latest                 the newest committed checkpoint's name (replaced via tmp + rename)
    <dir>/step_<N>/              N = training steps completed
        driver.json              Progress: step, weight version, sampler position, cliff tracker, accuracies
        config.yaml              the resolved config of the run that wrote it
        policies/<policy>/       learner state of every rank (contract in learners/state/state_io.py)
        manifest.json            written last: the completeness marker and every file's size
    <dir>/step_<N>.tmp/          being written; never read, removed on failure and before the next write

A checkpoint counts only when its manifest says complete and every listed file has its recorded size; the
folder is renamed into place after every file is fsynced, so a crash leaves either the old set or the new.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cluster.group import GroupError
from jobs.config.schema import TrainConfig

MANIFEST, DRIVER, LATEST, FORMAT = "manifest.json", "driver.json", "latest", 1


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or is not usable; the message names the folder and the reason."""


@dataclass
class Progress:
    """The driver's side of a checkpoint: everything besides learner state that a resume needs."""

    step: int = 0  # training steps completed (the next step's index)
    weight_version: int = 0  # the version the engines serve
    sampler: dict = field(default_factory=dict)  # PromptSampler.state() before step `step`
    cliff: dict = field(default_factory=dict)  # CliffTracker.state()
    acc_before: float = math.nan
    eval_accuracy: float | None = None  # held-out accuracy of exactly these weights, if measured
    best_accuracy: float = -math.inf
    rollbacks: int = 0


def root_dir(cfg: TrainConfig, run_dir: Path) -> Path:
    return Path(cfg.checkpoint.dir) if cfg.checkpoint.dir else run_dir / "checkpoints"


def write(root: Path, progress: Progress, learners: dict[str, Any], config_yaml: str) -> Path:
    """Write and commit `step_<progress.step>`; on any failure the previous checkpoints and
    `latest` are as they were (CheckpointError). A dead or hung rank's GroupError passes through:
    the driver may restart on it."""
    final, tmp = root / f"step_{progress.step}", root / f"step_{progress.step}.tmp"
    if is_complete(final):
        return final  # this exact state is already committed (a stop right after a resume)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True, exist_ok=True)
        for pid, learner in learners.items():
            learner.save(str(tmp / "policies" / pid))
        _write_text(tmp / DRIVER, json.dumps(asdict(progress)))
        _write_text(tmp / "config.yaml", config_yaml)
        _write_manifest(tmp, progress)
        shutil.rmtree(final, ignore_errors=True)  # an incomplete leftover of the same name
        os.rename(tmp, final)
        _fsync_dir(root)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, Exception) and not member_lost(e):
            raise CheckpointError(
                f"checkpoint {final} not written ({e}); {root / LATEST} is unchanged"
            ) from e
        raise
    _write_text(root / f"{LATEST}.tmp", final.name)
    os.rename(root / f"{LATEST}.tmp", root / LATEST)
    _fsync_dir(root)
    return final


def member_lost(e: Exception) -> bool:
    """A dead or hung rank (the driver may restart on it), as opposed to a rank that failed to write."""
    return isinstance(e, GroupError) and e.member_lost


def _write_manifest(folder: Path, progress: Progress) -> None:
    files = {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}
    for sub in {p.parent for p in folder.rglob("*") if p.is_file()}:
        _fsync_dir(sub)
    manifest = {
        "format": FORMAT,
        "complete": True,
        "step": progress.step,
        "eval_accuracy": progress.eval_accuracy,
        "files": files,
    }
    _write_text(folder / MANIFEST, json.dumps(manifest))
    _fsync_dir(folder)


def check(folder: Path) -> dict:
    """The manifest of a complete, intact checkpoint; CheckpointError saying what is wrong otherwise."""
    if not folder.is_dir():
        raise CheckpointError(f"checkpoint {folder} does not exist")
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {folder} is incomplete (no {MANIFEST})") from None
    except (OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint {folder} has an unreadable {MANIFEST}: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("complete") is not True:
        raise CheckpointError(
            f"checkpoint {folder} is incomplete (its manifest lacks the completeness marker)"
        )
    for rel, size in manifest.get("files", {}).items():
        path = folder / rel
        if not path.is_file() or path.stat().st_size != size:
            raise CheckpointError(f"checkpoint {folder} is corrupt: {rel} is missing or not {size} bytes")
    return manifest


def is_complete(folder: Path) -> bool:
    try:
        check(folder)
        return True
    except CheckpointError:
        return False


def read_progress(folder: Path) -> Progress:
    check(folder)
    try:
        return Progress(**json.loads((folder / DRIVER).read_text()))
    except (OSError, ValueError, TypeError) as e:
        raise CheckpointError(f"checkpoint {folder} has an unreadable {DRIVER}: {e}") from None


def _steps(root: Path) -> list[tuple[int, Path]]:
    """Committed-looking folders `step_<N>` under root, newest first (.tmp folders never count)."""
    out = []
    for p in root.glob("step_*") if root.is_dir() else []:
        suffix = p.name.removeprefix("step_")
        if p.is_dir() and suffix.isdigit():
            out.append((int(suffix), p))
    return sorted(out, reverse=True)


def newest(root: Path) -> Path | None:
    """The newest complete checkpoint; incomplete or damaged ones are skipped with a warning."""
    for _, folder in _steps(root):
        try:
            check(folder)
            return folder
        except CheckpointError as e:
            print(f"warning: skipping {e}", flush=True)
    return None


def best(root: Path) -> Path | None:
    """The complete checkpoint with the highest held-out accuracy (the earliest among equals)."""
    scored = [(m["eval_accuracy"], -step, folder) for step, folder in _steps(root)
              if (m := _manifest_or_none(folder)) and m.get("eval_accuracy") is not None]
    return max(scored)[2] if scored else None


def _manifest_or_none(folder: Path) -> dict | None:
    try:
        return check(folder)
    except CheckpointError:
        return None


def prune(root: Path, keep_last: int, keep_best: int) -> list[Path]:
    """Delete all but the newest `keep_last` and the `keep_best` most accurate complete checkpoints, and any
    leftover incomplete ones. Only called after a commit, so what is deleted is never the only good copy."""
    complete = [(step, f, m) for step, f in _steps(root) if (m := _manifest_or_none(f))]
    keep = {f for _, f, _ in complete[:keep_last]}
    scored = sorted(
        ((m["eval_accuracy"], -step, f) for step, f, m in complete if m.get("eval_accuracy") is not None),
        reverse=True,
    )
    keep |= {f for _, _, f in scored[:keep_best]}
    latest = root / LATEST
    if latest.is_file():
        keep.add(root / latest.read_text().strip())
    doomed = [f for _, f in _steps(root) if f not in keep] + [
        p for p in root.glob("step_*.tmp") if p.is_dir()
    ]
    for folder in doomed:
        shutil.rmtree(folder, ignore_errors=True)
    return doomed


def truncate_metrics(path: Path, step: int) -> int:
    """Drop metrics.jsonl lines of steps >= `step` (they are about to be rerun);
    returns how many were dropped."""
    if not path.is_file():
        return 0
    lines = path.read_text().splitlines(keepends=True)
    kept = [ln for ln in lines if ln.strip() and _line_step(ln) < step]
    tmp = path.with_suffix(".jsonl.tmp")
    _write_text(tmp, "".join(kept))
    os.rename(tmp, path)
    return len(lines) - len(kept)


def _line_step(line: str) -> float:
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return math.inf  # a torn last line from a crash: drop it


def _write_text(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
