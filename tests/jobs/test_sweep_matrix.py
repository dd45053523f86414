"""tiny_matrix as users run it: the sweep is interrupted (Ctrl-C) once its first trial has finished, and
`--resume` (Tuner.restore) completes the rest without rerunning the finished trial."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobs.sweep import FINISHED, POINTER

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# tiny_matrix's grid and placement, with one-step trials: the test is about the sweep, not the training.
CMD = [
    sys.executable,
    "-m",
    "jobs.sweep",
    "--config",
    "jobs/configs/sweeps/tiny_matrix.yaml",
    "overrides=[steps=1,data.eval_size=1,marl.max_rounds=1,rollout.engine_num_cpus=0.25,"
    "learner.rank_num_cpus=0.25,"
    "checkpoint.every=1]",
]


def _results(exp: Path) -> dict[str, list[dict]]:
    """Trial folder -> its reported results, in order."""
    out = {}
    for f in exp.glob("run_trial_*/result.json"):
        out[f.parent.name] = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return out


def _finished(exp: Path) -> set[str]:
    return {t for t, rows in _results(exp).items() if rows and rows[-1].get(FINISHED)}


def test_interrupted_sweep_resumes_to_completion(tmp_path):
    exp = tmp_path / "tiny_matrix"
    proc = subprocess.Popen([*CMD, f"storage_path={tmp_path}"], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 420
        while not _finished(exp):
            assert proc.poll() is None and time.monotonic() < end, "no trial finished"
            time.sleep(1)
        proc.send_signal(signal.SIGINT)  # Ctrl-C: Tune saves the experiment state and stops
        assert proc.wait(timeout=120) == 130
    finally:
        proc.kill()
    done_before = _finished(exp)
    rows_before = {t: len(_results(exp)[t]) for t in done_before}
    assert 1 <= len(done_before) < 4

    out = subprocess.run(
        [*CMD, f"storage_path={tmp_path}", "--resume"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    results = _results(exp)
    assert len(results) == 4 and _finished(exp) == set(results)
    assert {t: len(results[t]) for t in done_before} == rows_before  # finished trials were not rerun
    assert out.stdout.count(" finished") == 4 and "4 trials, 0 failed, 0 unfinished" in out.stdout
    for rows in results.values():
        assert "reward/mean" in rows[-1] and "eval/accuracy_after" in rows[-1]
    runs = sorted(p.name for p in (exp / "runs").iterdir())
    assert len(runs) == 4 and all((exp / "runs" / r / "metrics.jsonl").exists() for r in runs)
    # Tune keeps a pointer per committed checkpoint; the checkpoint itself stays in the run's folder.
    pointers = [json.loads(f.read_text()) for f in exp.glob(f"run_trial_*/checkpoint_*/{POINTER}")]
    assert len(pointers) >= 4 and all(Path(p["checkpoint"]).is_dir() for p in pointers)
    assert {Path(p["run_dir"]).name for p in pointers} == set(runs)
