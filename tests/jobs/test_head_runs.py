"""`jobs.train` beside and on a real `ray start` head on loopback (tests/ray_head.py): with no address the run
starts its own cluster and says that a head exists; `ray.address=auto` joins that head; a stale marker file is
reported as such, and joining it fails with exit code 2; a SIGKILLed driver's actors die with it, and the same
command resumes from its last committed checkpoint with every step logged once."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from ray.util.state import list_actors, list_placement_groups

from jobs.telemetry.tracking import read_metrics
from tests.ray_head import ROOT, free_port, start_head

pytestmark = pytest.mark.slow

FAST = ["marl.workflow=single_agent", "marl.sharing=shared", "rollout.prompts_per_step=2",
        "rollout.samples_per_prompt=2", "data.eval_size=2", "ray.num_cpus=2"]
LIVE = (
    "ALIVE",
    "PENDING_CREATION",
    "RESTARTING",
    "DEPENDENCIES_UNREADY",
    "CREATED",
    "PENDING",
    "RESCHEDULING",
)


@pytest.fixture(scope="module")
def head():
    # RAY_TMPDIR of the drivers: the head's marker is theirs
    root = Path("/tmp") / f"rh_{uuid.uuid4().hex[:6]}"
    h = start_head(tmp=root / "ray")
    try:
        yield h
    finally:
        h.close()
        shutil.rmtree(root, ignore_errors=True)  # the drivers' embedded clusters wrote here too


def _env(head, tmpdir: Path) -> dict[str, str]:
    return {**head.env, "RAY_TMPDIR": str(tmpdir)}


def _train(env: dict[str, str], *overrides: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jobs.train", "--config", "jobs/configs/tiny.yaml", *FAST,
                           *overrides], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def _alive(head, prefix: str) -> list[str]:
    """The head's live actors and placement groups of one run, through the state API."""
    actors = list_actors(address=head.dashboard, limit=1000, raise_on_missing_output=False)
    groups = list_placement_groups(address=head.dashboard, limit=1000, raise_on_missing_output=False)
    return sorted(
        [a.name for a in actors if (a.name or "").startswith(prefix) and a.state in LIVE]
        + [f"pg {g.name}" for g in groups if (g.name or "").startswith(prefix) and g.state != "REMOVED"]
    )


def test_without_an_address_the_run_starts_its_own_cluster_and_says_a_head_exists(head, tmp_path):
    out = _train(_env(head, head.tmp.parent), f"out_dir={tmp_path}", "run_name=emb", "steps=1",
                 "rollout.engines_per_role=1", "learner.ranks=1")
    assert out.returncode == 0, out.stderr[-3000:]
    recorded = head.marker.read_text().strip()
    assert (
        f"ray: starting an embedded cluster (2 CPUs; no ray.address or RAY_ADDRESS); a `ray start` cluster "
        f"runs at {recorded} ({head.marker}): ray.address=auto joins it"
    ) in out.stdout
    jobs = head.ray("list", "jobs", "--address", head.address, "--format", "json")
    assert "run_name=emb" not in jobs.stdout, "the run's driver joined the head"


def test_address_auto_joins_the_head(head, tmp_path):
    out = _train(_env(head, head.tmp.parent), f"out_dir={tmp_path}", "run_name=joined", "steps=1",
                 "ray.address=auto", "rollout.engines_per_role=1", "learner.ranks=1")
    assert out.returncode == 0, out.stderr[-3000:]
    recorded = head.marker.read_text().strip()
    assert (f"ray: joining the cluster at {recorded} (from the `ray start` marker file {head.marker})"
            in out.stdout)
    jobs = head.ray("list", "jobs", "--address", head.address, "--format", "json")
    assert "run_name=joined" in jobs.stdout, jobs.stdout[-2000:]


@pytest.fixture
def short_tmp():
    """A RAY_TMPDIR short enough for the socket paths of a cluster started under it (at most 107 bytes)."""
    path = Path("/tmp") / f"rs_{uuid.uuid4().hex[:6]}"
    path.mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_stale_marker_is_named_and_joining_it_fails_fast_with_exit_2(short_tmp, tmp_path):
    tmpdir = short_tmp
    (tmpdir / "ray").mkdir(parents=True)
    marker, dead = tmpdir / "ray" / "ray_current_cluster", f"127.0.0.1:{free_port()}"
    marker.write_text(dead)
    env = {**os.environ, "RAY_TMPDIR": str(tmpdir)}
    env.pop("RAY_ADDRESS", None)
    out = _train(env, f"out_dir={tmp_path}", "steps=1", "rollout.engines_per_role=0", "learner.ranks=0")
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"{marker} names {dead}, which does not answer (a head gone without `ray stop`)" in out.stdout
    t0 = time.monotonic()
    out = _train(env, f"out_dir={tmp_path}", "steps=1", "ray.address=auto", "ray.connect_timeout_s=3")
    assert out.returncode == 2, out.stderr[-3000:]
    assert (
        f"ray: no Ray cluster answers at {dead} (from the `ray start` marker file {marker}) within 3s "
        "(ray.connect_timeout_s); its head died without `ray stop`: run `ray stop` or delete the marker file"
        in out.stderr
    )
    assert time.monotonic() - t0 < 60  # python start-up, the model check, then the 3 s deadline


_PAUSE_AFTER = """
import sys, time
from pathlib import Path
import jobs.train as t

class PauseAfter:  # the run goes quiet after step `at` (its actors alive, mid-run), to be SIGKILLed there
    def on_step(self, step, metrics, checkpoint):
        if step == {at}:
            Path("{flag}").write_text("paused")
            time.sleep(600)

train = t.train
t.train = lambda cfg, callbacks=(): train(cfg, (*callbacks, PauseAfter()))
sys.exit(t.main(sys.argv[1:]))
"""


def test_a_sigkilled_driver_takes_its_actors_along_and_the_same_command_resumes(head, tmp_path):
    run = [
        "--config",
        "jobs/configs/tiny.yaml",
        *FAST,
        f"out_dir={tmp_path}",
        "run_name=drv",
        "steps=6",
        f"ray.address={head.address}",
        "rollout.engines_per_role=1",
        "learner.ranks=1",
        "checkpoint.every=3",
    ]
    flag = tmp_path / "paused"
    driver = subprocess.Popen(
        [sys.executable, "-c", _PAUSE_AFTER.format(at=3, flag=flag), *run],
        env=head.env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        end = time.monotonic() + 300
        while not flag.exists():
            assert driver.poll() is None and time.monotonic() < end, driver.stdout.read()[-3000:]
            time.sleep(0.2)
        # Steps 0..3 are logged and step_3 is the last committed checkpoint; the actors are alive.
        assert [r["step"] for r in read_metrics(tmp_path / "drv")] == [0, 1, 2, 3]
        assert _alive(head, "drv:") == ["drv:engine:solver:0", "drv:learner:shared:0", "pg drv:placement"]
        driver.send_signal(signal.SIGKILL)
        assert driver.wait(timeout=30) == -signal.SIGKILL
    finally:
        driver.kill()
    killed = time.monotonic()
    while left := _alive(head, "drv:"):
        assert time.monotonic() < killed + 60, f"still alive 60 s after the driver died: {left}"
        time.sleep(0.5)
    print(
        f"the dead driver's actors and placement group were gone {time.monotonic() - killed:.1f}s after "
        "SIGKILL"
    )
    out = subprocess.run(
        [sys.executable, "-m", "jobs.train", *run],
        env=head.env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    ckpt = tmp_path / "drv" / "checkpoints" / "step_3"
    assert (f"resumed from {ckpt} at step 3 (weight version 3; 1 metric lines of later steps dropped)"
            in out.stdout)
    assert [r["step"] for r in read_metrics(tmp_path / "drv")] == [0, 1, 2, 3, 4, 5, 6]
    assert _alive(head, "drv:") == []
