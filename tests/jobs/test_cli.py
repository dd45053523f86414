"""The driver as users run it: exit codes, and SIGTERM (what `ray job stop` sends) ending a run cleanly."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CMD = [sys.executable, "-m", "jobs.train", "--config", "jobs/configs/tiny.yaml"]


def _run(*overrides: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*CMD, *overrides], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_config_error_exits_2():
    out = _run("learner.optim.lr=abc")
    assert out.returncode == 2 and "learner.optim.lr" in out.stderr


def test_missing_model_exits_3_naming_the_key(tmp_path):
    out = _run(f"out_dir={tmp_path}", f"model.path={tmp_path}/absent")
    assert out.returncode == 3 and "model.path" in out.stderr


def test_sigterm_stops_the_run_and_releases_it(tmp_path):
    proc = subprocess.Popen([*CMD, f"out_dir={tmp_path}", "steps=500", "data.eval_size=0", "ray.num_cpus=2"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:  # wait for training to be under way, whatever the machine's speed
            if line.startswith("step 1/"):
                break
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 143
        assert "stopped by signal" in proc.stderr.read()
    finally:
        proc.kill()
    steps = (tmp_path / "tiny" / "metrics.jsonl").read_text().count("\n")
    assert 1 <= steps < 500


def test_resources_the_cluster_cannot_hold_exit_2_naming_the_key(tmp_path):
    # 2 learner ranks of 1.5 CPUs each cannot fit an embedded cluster of 2 CPUs: refused before any actor starts.
    out = _run(f"out_dir={tmp_path}", "ray.num_cpus=2", "learner.ranks=2", "learner.rank_num_cpus=1.5",
               "ray.placement_timeout_s=5")
    assert out.returncode == 2, out.stderr[-2000:]
    assert "learner.rank_num_cpus" in out.stderr and "Traceback" not in out.stderr
