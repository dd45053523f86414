"""`ray job submit` against a real Ray head on loopback, as docs/clusters.md documents it: the tiny job
succeeds with a workflow from a file in the working dir (and, resubmitted after its driver was killed, with a
built-in one), a broken config fails with the config message in the job's logs, and `ray job stop` ends a
running job with none of its actors or its placement group left alive."""

from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest

from tests.ray_head import Head, start_head

pytestmark = pytest.mark.slow

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


@pytest.fixture(scope="module")
def head():
    h = start_head()
    try:
        yield h
    finally:
        h.close()


def _submit(head: Head, job_id: str, *overrides: str) -> None:
    end = time.monotonic() + 120
    while True:
        out = head.ray("job", "submit", "--address", head.dashboard, "--submission-id", job_id, "--no-wait",
                       "--working-dir", ".", "--runtime-env", "jobs/runtime_env.yaml", "--",
                       "python", "-m", "jobs.train", "--config", "jobs/configs/tiny.yaml", *overrides)
        # The head's dashboard answers before its job agent is up: that one refusal is worth a retry.
        if out.returncode == 0 or "No available agent" not in out.stderr or time.monotonic() > end:
            break
        time.sleep(2)
    assert out.returncode == 0, out.stderr


def _status(head: Head, job_id: str) -> str:
    out = head.ray("job", "status", "--address", head.dashboard, job_id, timeout=60)
    text = out.stdout + out.stderr  # the CLI writes its status lines through its logger (stderr)
    final = re.search(rf"Job '{job_id}' (succeeded|failed|was stopped)", text)
    if final:
        return {"succeeded": "SUCCEEDED", "failed": "FAILED", "was stopped": "STOPPED"}[final.group(1)]
    other = re.search(rf"Status for job '{job_id}': (\w+)", text)
    return other.group(1) if other else "UNKNOWN"


def _logs(head: Head, job_id: str) -> str:
    return head.ray("job", "logs", "--address", head.dashboard, job_id, timeout=60).stdout


def _wait(head: Head, job_id: str, until, deadline_s: float) -> str:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        status = _status(head, job_id)
        if until(status):
            return status
        time.sleep(2)
    raise TimeoutError(f"job {job_id}: still {status} after {deadline_s}s\n{_logs(head, job_id)[-3000:]}")


def _alive(head: Head, kind: str, prefix: str) -> list[str]:
    out = head.ray("list", kind, "--address", head.address, "--format", "json", "--limit", "1000", timeout=60)
    assert out.returncode == 0, out.stderr
    return [
        r["name"]
        for r in json.loads(out.stdout)
        if (r.get("name") or "").startswith(prefix)
        and r["state"] in ("ALIVE", "CREATED", "PENDING", "RESCHEDULING", "DEPENDENCIES_UNREADY")
    ]


def test_broken_config_fails_with_its_message(head):
    _submit(head, "tiny_bad", "learner.optim.lr=abc")
    assert _wait(head, "tiny_bad", lambda s: s in TERMINAL, 180) == "FAILED"
    assert "learner.optim.lr" in _logs(head, "tiny_bad")


def test_a_user_workflow_travels_and_a_stopped_job_leaves_no_actors_or_placement_group(head, tmp_path):
    """`marl.workflow=examples/debate.py` is read from the job's working_dir copy (its cwd on the cluster) and
    trains both its roles; `ray job stop` then releases every actor and the placement group. (One job for
    both: each costs a working_dir upload and a run's start. A submitted run that ends by itself is the
    resubmission's below; the export at a run's end is tests/jobs/test_policies.py's.)"""
    _submit(head, "tiny_stop", f"out_dir={tmp_path}", "run_name=jobstop", "steps=500", "data.eval_size=2",
            "marl.workflow=examples/debate.py", "marl.max_rounds=1")
    metrics, end = tmp_path / "jobstop" / "metrics.jsonl", time.monotonic() + 300
    # Debate, isolated: two engines and two learner ranks, all inside the run's placement group.
    while len(_alive(head, "actors", "jobstop:")) < 4 or not metrics.exists() or not metrics.read_text():
        assert time.monotonic() < end and _status(head, "tiny_stop") not in TERMINAL, _logs(head, "tiny_stop")
        time.sleep(1)
    first = json.loads(metrics.read_text().splitlines()[0])
    assert first["batch/rows/debater"] > 0 and first["batch/rows/judge"] > 0
    assert "[jobstop] policies ['debater', 'judge']" in _logs(head, "tiny_stop")
    assert _alive(head, "placement-groups", "jobstop:") == ["jobstop:placement"]
    assert head.ray("job", "stop", "--address", head.dashboard, "tiny_stop", timeout=120).returncode == 0
    assert _wait(head, "tiny_stop", lambda s: s in TERMINAL, 120) == "STOPPED"
    end = time.monotonic() + 60
    while left := _alive(head, "actors", "jobstop:") + _alive(head, "placement-groups", "jobstop:"):
        assert time.monotonic() < end, f"still alive after the job stopped: {left}"
        time.sleep(1)


def _driver_pid(head: Head, job_id: str) -> int | None:
    out = head.ray("list", "jobs", "--address", head.address, "--format", "json", timeout=60)
    for job in json.loads(out.stdout or "[]"):
        if job.get("submission_id") == job_id and (job.get("driver_info") or {}).get("pid"):
            return int(job["driver_info"]["pid"])
    return None


def test_resubmitting_after_a_sigkilled_driver_resumes_from_the_last_checkpoint(head, tmp_path):
    steps = 24  # tiny steps take well under a second: leave the kill a wide margin before the run's end
    run = (
        f"out_dir={tmp_path}",
        "run_name=jobkill",
        f"steps={steps}",
        "checkpoint.every=1",
        "data.eval_size=0",
        "marl.workflow=single_agent",
        "marl.sharing=shared",
    )
    _submit(head, "tiny_kill", *run)
    metrics, end = tmp_path / "jobkill" / "metrics.jsonl", time.monotonic() + 300
    # The driver's pid first (a CLI call of its own, seconds), so nothing slow sits
    # between step 3 and the kill.
    while (pid := _driver_pid(head, "tiny_kill")) is None:
        assert time.monotonic() < end and _status(head, "tiny_kill") not in TERMINAL, _logs(head, "tiny_kill")
        time.sleep(0.5)
    while not metrics.exists() or len(metrics.read_text().splitlines()) < 3:
        assert time.monotonic() < end, _logs(head, "tiny_kill")
        os.kill(pid, 0)  # raises if the driver is gone before its third step
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)  # no cleanup runs in the driver
    killed_after = len(metrics.read_text().splitlines())
    assert killed_after < steps, f"the run was done ({killed_after} rows) before its driver was killed"
    assert _wait(head, "tiny_kill", lambda s: s in TERMINAL, 120) == "FAILED"
    end = time.monotonic() + 60
    while left := _alive(head, "actors", "jobkill:") + _alive(head, "placement-groups", "jobkill:"):
        assert time.monotonic() < end, f"still alive after the driver died: {left}"
        time.sleep(1)
    newest = (tmp_path / "jobkill" / "checkpoints" / "latest").read_text()
    _submit(head, "tiny_kill_again", *run)
    assert _wait(head, "tiny_kill_again", lambda s: s in TERMINAL, 300) == "SUCCEEDED", _logs(
        head, "tiny_kill_again"
    )
    assert f"resumed from {tmp_path / 'jobkill' / 'checkpoints' / newest} at step" in _logs(
        head, "tiny_kill_again"
    )
    logged = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert logged == list(range(steps + 1))  # steps 0..steps-1 and the final eval row, each once
