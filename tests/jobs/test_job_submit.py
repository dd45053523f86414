"""`ray job submit` against a real Ray head on loopback, as README documents it: the tiny job succeeds (also with
a workflow from a file in the working dir), a broken config fails with the config message in the job's logs,
and `ray job stop` ends a running job with none of its actors or its placement group left alive."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HeadExited(RuntimeError):
    """`ray start` ended before its head answered."""


class Head:
    """A Ray head this test started (its own session, so every process of it can be ended by group id)."""

    def __init__(self, tmp: Path):
        tmp.mkdir(parents=True, exist_ok=True)
        self.tmp = tmp
        self.log = tmp.parent / f"{tmp.name}.log"  # outside the temp dir: Ray may clear that one
        self.port, self.dash = _free_port(), _free_port()
        self.address, self.dashboard = f"127.0.0.1:{self.port}", f"http://127.0.0.1:{self.dash}"
        # Token auth is on whenever ~/.ray/auth_token exists (any earlier ray.init writes it): this cluster
        # and every client of it run without. The job's `python` is the first on this PATH: the project's.
        self.env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PATH": f"{BIN}:{os.environ['PATH']}",
                    "MARL_CACHE": os.environ.get("MARL_CACHE", str(ROOT / ".cache" / "marl"))}
        self.env.pop("RAY_ADDRESS", None)
        # Every fixed default port gets a free one: other Ray clusters on this machine may hold the defaults.
        ports = [f"--{flag}={_free_port()}" for flag in (
            "dashboard-agent-listen-port", "dashboard-agent-grpc-port", "metrics-export-port",
            "runtime-env-agent-port", "ray-client-server-port", "node-manager-port", "object-manager-port")]
        with self.log.open("wb") as out:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(
                [str(BIN / "ray"), "start", "--head", "--block", f"--port={self.port}", "--num-cpus=2",
                 "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={self.dash}",
                 *ports, f"--temp-dir={tmp}", "--disable-usage-stats"],
                env=self.env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def ray(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "ray"), *args], env=self.env, cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout)

    def wait_up(self, deadline_s: float = 120) -> None:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise HeadExited(f"ray start exited with {self.proc.returncode}:\n{self.log_tail()}")
            if self.ray("job", "list", "--address", self.dashboard, timeout=30).returncode == 0:
                return
            time.sleep(1)
        raise TimeoutError("the Ray head did not come up")

    def stop(self) -> None:
        """End every process of the head's session (never `ray stop`: it ends every Ray on the machine)."""
        for sig, wait_s in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                continue
        try:  # the head's children share its process group: take any straggler too
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def close(self) -> None:
        """Stop the head and remove its files."""
        self.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.log.unlink(missing_ok=True)


def _start_head(attempts: int = 3) -> Head:
    """A head that answers. Ports are picked free, then released before `ray start` binds them: another process
    may take one in between, and `ray start` then exits. Such a start is retried with fresh ports; the last
    failure is raised with its log."""
    for attempt in range(1, attempts + 1):
        h = Head(Path("/tmp") / f"rayjob_{uuid.uuid4().hex[:6]}")  # short: Ray's socket paths have a length limit
        try:
            h.wait_up()
            return h
        except BaseException as e:
            h.close()
            if not isinstance(e, HeadExited) or attempt == attempts:
                raise
            print(f"ray start failed (attempt {attempt}), retrying with fresh ports: {e}", file=sys.stderr)
    raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def head():
    h = _start_head()
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
    return [r["name"] for r in json.loads(out.stdout)
            if (r.get("name") or "").startswith(prefix) and r["state"] in ("ALIVE", "CREATED", "PENDING",
                                                                           "RESCHEDULING", "DEPENDENCIES_UNREADY")]


def test_tiny_job_succeeds(head, tmp_path):
    _submit(head, "tiny_ok", f"out_dir={tmp_path}", "run_name=jobok", "steps=1", "data.eval_size=2")
    assert _wait(head, "tiny_ok", lambda s: s in TERMINAL, 300) == "SUCCEEDED", _logs(head, "tiny_ok")[-3000:]
    logs = _logs(head, "tiny_ok")
    assert "[jobok] held-out accuracy" in logs
    assert (tmp_path / "jobok" / "metrics.jsonl").exists()


def test_user_workflow_file_travels_with_the_working_dir(head, tmp_path):
    """`marl.workflow=examples/debate.py` is read from the job's working_dir copy (its cwd on the cluster)."""
    _submit(head, "tiny_debate", f"out_dir={tmp_path}", "run_name=jobdebate", "steps=1", "data.eval_size=2",
            "marl.workflow=examples/debate.py", "marl.max_rounds=1")
    status = _wait(head, "tiny_debate", lambda s: s in TERMINAL, 300)
    assert status == "SUCCEEDED", _logs(head, "tiny_debate")[-3000:]
    first = json.loads((tmp_path / "jobdebate" / "metrics.jsonl").read_text().splitlines()[0])
    assert first["batch/rows/debater"] > 0 and first["batch/rows/judge"] > 0
    assert (tmp_path / "jobdebate" / "export" / "judge" / "config.json").exists()


def test_broken_config_fails_with_its_message(head):
    _submit(head, "tiny_bad", "learner.optim.lr=abc")
    assert _wait(head, "tiny_bad", lambda s: s in TERMINAL, 180) == "FAILED"
    assert "learner.optim.lr" in _logs(head, "tiny_bad")


def test_stopped_job_leaves_no_actors_or_placement_group(head, tmp_path):
    _submit(head, "tiny_stop", f"out_dir={tmp_path}", "run_name=jobstop", "steps=500", "data.eval_size=0")
    end = time.monotonic() + 300
    # Voting, isolated: two engines and two learner ranks, all inside the run's placement group.
    while len(_alive(head, "actors", "jobstop:")) < 4:
        assert time.monotonic() < end and _status(head, "tiny_stop") not in TERMINAL, _logs(head, "tiny_stop")
        time.sleep(1)
    assert _alive(head, "placement-groups", "jobstop:") == ["jobstop:placement"]
    assert head.ray("job", "stop", "--address", head.dashboard, "tiny_stop", timeout=120).returncode == 0
    assert _wait(head, "tiny_stop", lambda s: s in TERMINAL, 120) == "STOPPED"
    end = time.monotonic() + 60
    while left := _alive(head, "actors", "jobstop:") + _alive(head, "placement-groups", "jobstop:"):
        assert time.monotonic() < end, f"still alive after the job stopped: {left}"
        time.sleep(1)
