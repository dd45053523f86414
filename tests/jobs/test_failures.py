"""Failures: a learner rank killed mid-run (restart from the last checkpoint), a checkpoint write that fails
or is SIGKILLed half-way (the previous checkpoint and `latest` survive), bad checkpoint and model paths, and
no actor or placement group of the run outliving it."""

from __future__ import annotations

import errno
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray

import learners.state.state_io
from cluster.group import GroupError
from cluster.stop import StopRequested
from jobs.config import load_config
from jobs.driver import run_checkpoints as ckpt
from jobs.driver.assets import InputError
from jobs.telemetry.tracking import read_metrics
from jobs.train import main, train

TINY = "jobs/configs/tiny.yaml"
ROOT = Path(__file__).resolve().parents[2]
FAST = ["marl.workflow=single_agent", "marl.sharing=shared", "rollout.prompts_per_step=2",
        "rollout.samples_per_prompt=2", "data.eval_size=2", "ray.num_cpus=2"]


def _cfg(tmp_path: Path, *overrides: str):
    return load_config(TINY, [f"out_dir={tmp_path}", *FAST, *overrides])


def _leftovers(run_name: str, deadline_s: float = 20.0) -> list[str]:
    """Named actors and live placement groups of the run, polled until none or the deadline (ray.kill and
    placement-group removal are asynchronous). GCS tables, not the state API: that needs a dashboard."""
    end = time.monotonic() + deadline_s
    while True:
        actors = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                  if a["name"].startswith(f"{run_name}:")]
        groups = [f"pg {g['name']}" for g in ray.util.placement_group_table().values()
                  if g["name"].startswith(f"{run_name}:") and g["state"] != "REMOVED"]
        if not actors + groups or time.monotonic() > end:
            return actors + groups
        time.sleep(0.2)


class KillLearner:
    """Kills policy `pid`'s rank 0 actor once, after step `at` (so the next update finds it dead)."""

    def __init__(self, pid: str, at: int):
        self.pid, self.at, self.done = pid, at, False

    def on_step(self, step, metrics, checkpoint):
        if step == self.at and not self.done:
            self.done = True
            ray.kill(ray.get_actor(f"tiny:learner:{self.pid}:0"), no_restart=True)


@pytest.mark.slow
def test_killed_learner_rank_restarts_from_the_last_checkpoint(ray_cluster, tmp_path, capsys):
    cfg = _cfg(tmp_path, "steps=5", "learner.ranks=1", "rollout.engines_per_role=0", "checkpoint.every=2",
               "checkpoint.max_failures=1")
    summary = train(cfg, callbacks=(KillLearner("shared", at=2),))  # 3 steps done, checkpoint at 2
    out = capsys.readouterr().out
    assert "training failure 1/1: tiny:learner:shared:0.update failed" in out
    assert f"restarting from {tmp_path / 'tiny' / 'checkpoints' / 'step_2'}" in out
    assert summary["train/failures"] == 1.0 and summary["train/steps_lost"] == 1.0
    assert [r["step"] for r in read_metrics(tmp_path / "tiny")] == [0, 1, 2, 3, 4, 5]  # step 2 rerun once
    assert _leftovers("tiny") == []


@pytest.mark.slow  # Ray actors: ~15 s to start under light load, up to a minute on a busy 2-core machine
@pytest.mark.parametrize("ending", ["end", "stop", "failure"])
def test_nothing_of_the_run_outlives_it(ray_cluster, tmp_path, ending):
    cfg = _cfg(tmp_path, "steps=2", "learner.ranks=1", "rollout.engines_per_role=1", "checkpoint.every=1")
    if ending == "end":
        train(cfg)
    elif ending == "stop":
        with pytest.raises(StopRequested):
            train(cfg, callbacks=(StopAt(0),))
    else:  # max_failures=0: the first failure ends the run, naming the policy and the rank
        with pytest.raises(GroupError, match=r"tiny:learner:shared:0\.update failed"):
            train(cfg, callbacks=(KillLearner("shared", at=0),))
    assert _leftovers("tiny") == []


class StopAt:
    def __init__(self, at: int):
        self.at = at

    def on_step(self, step, metrics, checkpoint):
        if step == self.at:
            raise StopRequested("test stop")


def test_failed_checkpoint_write_keeps_latest_and_resume_works(ray_cluster, tmp_path, monkeypatch):
    cfg = _cfg(tmp_path, "steps=3", "checkpoint.every=1", "learner.ranks=0", "rollout.engines_per_role=0")
    real = learners.state.state_io.write_fsynced

    def disk_full_at_step_2(file, obj):  # the model file of step 2 is written, then the disk is full
        if "step_2.tmp" in str(file) and file.name != "model.pt":
            raise OSError(errno.ENOSPC, "No space left on device")
        real(file, obj)

    monkeypatch.setattr(learners.state.state_io, "write_fsynced", disk_full_at_step_2)
    with pytest.raises(ckpt.CheckpointError, match=r"step_2 not written .*No space left on device"):
        train(cfg)
    root = tmp_path / "tiny" / "checkpoints"
    assert (root / "latest").read_text() == "step_1" and ckpt.newest(root) == root / "step_1"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_1"]
    monkeypatch.setattr(learners.state.state_io, "write_fsynced", real)
    train(cfg)
    assert [r["step"] for r in read_metrics(tmp_path / "tiny")] == [0, 1, 2, 3]
    assert (root / "latest").read_text() == "step_3"


_WRITER = """
import sys, time
from pathlib import Path
from jobs.driver import run_checkpoints as ckpt

class Stalls:
    def save(self, path):
        Path(path).mkdir(parents=True)
        (Path(path) / "model.pt").write_bytes(b"partial")
        print("partial", flush=True)
        time.sleep(600)

ckpt.write(Path(sys.argv[1]), ckpt.Progress(step=2), {"p": Stalls()}, "")
"""


def test_sigkill_during_a_checkpoint_write_leaves_the_previous_one(tmp_path):
    root = tmp_path / "ckpt"
    ckpt.write(root, ckpt.Progress(step=1), {}, "seed: 0\n")
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(root)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "partial"  # the write is under way, files half there
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        proc.kill()
    assert (root / "step_2.tmp" / "policies" / "p" / "model.pt").exists()
    assert (root / "latest").read_text() == "step_1" and ckpt.newest(root) == root / "step_1"
    # The next write of the same step starts clean and commits.
    assert ckpt.write(root, ckpt.Progress(step=2), {}, "") == root / "step_2"
    assert not (root / "step_2.tmp").exists() and ckpt.newest(root) == root / "step_2"


@pytest.fixture(scope="module")
def good_checkpoint(ray_cluster, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("good")
    train(_cfg(out, "steps=1", "checkpoint.every=1", "learner.ranks=0", "rollout.engines_per_role=0"))
    return out / "tiny" / "checkpoints" / "step_1"


def _damaged(good: Path, tmp_path: Path, how: str) -> Path:
    copy = tmp_path / "copy" / "step_1"
    shutil.copytree(good, copy)
    if how == "no-manifest":
        (copy / "manifest.json").unlink()
    elif how == "torn":
        (copy / "policies" / "shared" / "optimizer.pt").write_bytes(b"torn")
    elif how == "garbage-same-size":
        path = copy / "policies" / "shared" / "model.pt"
        path.write_bytes(b"\0" * path.stat().st_size)
    return copy


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("absent", r"checkpoint\.resume: checkpoint .*copy/absent does not exist"),
        ("no-manifest", r"checkpoint\.resume: checkpoint .*step_1 is incomplete \(no manifest\.json\)"),
        (
            "torn",
            r"checkpoint\.resume: checkpoint .*step_1 is corrupt: policies/shared/optimizer\.pt is missing "
            r"or not",
        ),
        (
            "garbage-same-size",
            r"checkpoint .*step_1 cannot be restored: .*checkpoint file unreadable: .*model\.pt",
        ),
    ],
)
def test_bad_resume_path_is_a_clear_input_error(good_checkpoint, tmp_path, how, message):
    path = tmp_path / "copy" / "absent" if how == "absent" else _damaged(good_checkpoint, tmp_path, how)
    with pytest.raises(InputError, match=message):
        train(
            _cfg(
                tmp_path,
                "steps=2",
                f"checkpoint.resume={path}",
                "learner.ranks=0",
                "rollout.engines_per_role=0",
            )
        )


def test_auto_resume_skips_a_damaged_newest_checkpoint(good_checkpoint, tmp_path, capsys):
    root = tmp_path / "tiny" / "checkpoints"
    shutil.copytree(good_checkpoint, root / "step_1")
    shutil.copytree(good_checkpoint, root / "step_2")
    (root / "step_2" / "manifest.json").write_text("{")
    train(_cfg(tmp_path, "steps=2", "learner.ranks=0", "rollout.engines_per_role=0"))
    out = capsys.readouterr().out
    assert "warning: skipping checkpoint" in out and "step_2 has an unreadable manifest.json" in out
    assert f"resumed from {root / 'step_1'} at step 1" in out


def test_corrupt_model_folder_and_missing_checkpoint_exit_3(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama"})[:-3])
    assert main(["--config", TINY, f"out_dir={tmp_path}", f"model.path={model}"]) == 3
    assert f"input error: model.path={str(model)!r} cannot be loaded" in capsys.readouterr().err
    assert main(["--config", TINY, f"out_dir={tmp_path}", f"checkpoint.resume={tmp_path}/nope"]) == 3
    assert f"checkpoint.resume: checkpoint {tmp_path}/nope does not exist" in capsys.readouterr().err
