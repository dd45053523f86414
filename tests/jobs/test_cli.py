"""The driver as users run it: exit codes. (SIGTERM, what `ray job stop` sends, stops a run in
tests/jobs/test_resume.py, which then resumes it.)"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.mark.slow  # a CLI process with its own Ray cluster: ~20 s
def test_resources_the_cluster_cannot_hold_exit_2_naming_the_key(tmp_path):
    # 2 learner ranks of 1.5 CPUs each cannot fit an embedded cluster of 2 CPUs:
    # refused before any actor starts.
    out = _run(f"out_dir={tmp_path}", "ray.num_cpus=2", "learner.ranks=2", "learner.rank_num_cpus=1.5",
               "ray.placement_timeout_s=5")
    assert out.returncode == 2, out.stderr[-2000:]
    assert "learner.rank_num_cpus" in out.stderr and "Traceback" not in out.stderr


def test_a_role_losing_its_rows_to_the_prompt_cap_stops_the_run_naming_it(tmp_path):
    # Tiny voting: generator prompts are ~130 tokens, the aggregator's (which quote three answers) ~290.
    out = _run(
        f"out_dir={tmp_path}",
        "steps=2",
        "data.eval_size=0",
        "ray.num_cpus=2",
        "rollout.engines_per_role=0",
        "learner.ranks=0",
        "rollout.prompts_per_step=2",
        "rollout.samples_per_prompt=2",
        "rollout.max_prompt_tokens=200",
        timeout=300,
    )
    assert out.returncode == 4, out.stderr[-2000:]
    assert re.search(r"role 'aggregator' lost (\d+) of \1 rows to length caps in step 0 "
                     r"\(algo.max_role_drop_frac=0.05\)", out.stderr), out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    metrics = tmp_path / "tiny" / "metrics.jsonl"
    # stopped before step 0's update was logged
    assert not metrics.exists() or not metrics.read_text().strip()
