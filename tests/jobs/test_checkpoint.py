"""Checkpoint layout, atomic commit, discovery, pruning and metrics truncation, with stand-in learners; and
the config checks of the checkpoint section."""

from __future__ import annotations

import json

import pytest

from jobs.config import ConfigError, load_config
from jobs.driver import run_checkpoints as ckpt
from jobs.driver.run_checkpoints import CheckpointError, Progress

TINY = "jobs/configs/tiny.yaml"


class FakeLearner:
    """Writes one file per rank, like a learner's save_state; `fail_after` raises once part is written."""

    def __init__(self, ranks: int = 2, fail_after: int | None = None):
        self.ranks, self.fail_after = ranks, fail_after

    def save(self, path: str) -> None:
        from pathlib import Path

        Path(path).mkdir(parents=True, exist_ok=True)
        for r in range(self.ranks):
            if self.fail_after is not None and r >= self.fail_after:
                raise OSError(28, "No space left on device")
            (Path(path) / f"rng_rank{r}.pt").write_bytes(b"x" * (100 + r))


def _write(root, step, acc=None, learner=None):
    progress = Progress(step=step, weight_version=step, eval_accuracy=acc)
    return ckpt.write(root, progress, {"p": learner or FakeLearner()}, "seed: 0\n")


def test_commit_layout_latest_and_manifest(tmp_path):
    folder = _write(tmp_path, 3, acc=0.5)
    assert folder == tmp_path / "step_3" and (tmp_path / "latest").read_text() == "step_3"
    manifest = ckpt.check(folder)
    assert manifest["complete"] is True and manifest["step"] == 3 and manifest["eval_accuracy"] == 0.5
    assert manifest["files"]["policies/p/rng_rank1.pt"] == 101
    assert {"driver.json", "config.yaml"} <= set(manifest["files"])
    assert ckpt.read_progress(folder).weight_version == 3
    assert not list(tmp_path.glob("*.tmp"))


def test_a_failed_write_leaves_the_previous_checkpoint_and_latest(tmp_path):
    _write(tmp_path, 1)
    with pytest.raises(
        CheckpointError, match=r"step_2 not written \(\[Errno 28\] No space left.*latest is unchanged"
    ):
        _write(tmp_path, 2, learner=FakeLearner(fail_after=1))  # rank 0's file exists, rank 1's write fails
    assert (tmp_path / "latest").read_text() == "step_1"
    assert ckpt.newest(tmp_path) == tmp_path / "step_1"
    assert not (tmp_path / "step_2").exists() and not (tmp_path / "step_2.tmp").exists()


def test_newest_skips_incomplete_and_damaged_checkpoints_with_a_warning(tmp_path, capsys):
    for step in (1, 2, 3, 4):
        _write(tmp_path, step)
    (tmp_path / "step_4" / "manifest.json").unlink()  # died before the completeness marker
    (tmp_path / "step_3" / "policies" / "p" / "rng_rank0.pt").write_bytes(b"x")  # torn file
    (tmp_path / "step_2" / "manifest.json").write_text("{not json")
    (tmp_path / "step_9.tmp").mkdir()  # a write in progress never counts
    assert ckpt.newest(tmp_path) == tmp_path / "step_1"
    out = capsys.readouterr().out
    assert "step_4 is incomplete (no manifest.json)" in out
    assert "step_3 is corrupt: policies/p/rng_rank0.pt is missing or not 100 bytes" in out
    assert "step_2 has an unreadable manifest.json" in out


def test_manifest_without_the_marker_is_incomplete(tmp_path):
    folder = _write(tmp_path, 1)
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**manifest, "complete": False}))
    with pytest.raises(CheckpointError, match="lacks the completeness marker"):
        ckpt.check(folder)
    with pytest.raises(CheckpointError, match="does not exist"):
        ckpt.check(tmp_path / "step_7")


def test_prune_keeps_the_last_and_the_best(tmp_path):
    accuracy = {1: 0.2, 2: 0.9, 3: 0.4, 4: 0.9, 5: 0.1, 6: None}
    for step, acc in accuracy.items():
        _write(tmp_path, step, acc)
        ckpt.prune(tmp_path, keep_last=2, keep_best=1)
    (tmp_path / "step_3.tmp").mkdir()  # a leftover of a killed write
    ckpt.prune(tmp_path, keep_last=2, keep_best=1)
    # The best is the earliest of the equally accurate (the tracker's peak is where it was first reached).
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_2", "step_5", "step_6"]
    assert ckpt.best(tmp_path) == tmp_path / "step_2"


def test_rewriting_a_committed_step_keeps_it(tmp_path):
    first = _write(tmp_path, 2)
    stamp = (first / "manifest.json").stat().st_mtime_ns
    assert _write(tmp_path, 2) == first and (first / "manifest.json").stat().st_mtime_ns == stamp


def test_truncate_metrics_drops_later_steps_and_torn_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": s, "reward/mean": s / 10}) for s in (0, 1, 2, 3)]
    path.write_text("\n".join(lines) + '\n{"step": 4, "rew')
    assert ckpt.truncate_metrics(path, 2) == 3
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [0, 1]
    assert ckpt.truncate_metrics(tmp_path / "absent.jsonl", 0) == 0


@pytest.mark.parametrize(("overrides", "message"), [
    (["checkpoint.every=-1"], r"checkpoint\.every must be >= 0"),
    (["checkpoint.keep_last=0"], r"checkpoint\.keep_last must be >= 1"),
    (["checkpoint.keep_best=-2"], r"checkpoint\.keep_best must be >= 0"),
    (["checkpoint.max_failures=-1"], r"checkpoint\.max_failures must be >= 0"),
    (["checkpoint.resume=''"], r"checkpoint\.resume must be auto, never or a checkpoint folder"),
    (["cliff.action=rollback"], r"cliff\.action=rollback needs checkpoint\.every > 0"),
    (["cliff.action=rollback", "checkpoint.every=2", "eval_every=3"], r"eval_every a multiple of it"),
    (["cliff.action=rollback", "checkpoint.every=2", "eval_every=4", "checkpoint.keep_best=0"],
     r"checkpoint\.keep_best >= 1"),
])
def test_checkpoint_config_is_validated(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(TINY, overrides)


def test_rollback_config_loads_when_consistent():
    cfg = load_config(TINY, ["cliff.action=rollback", "checkpoint.every=2", "eval_every=4"])
    assert cfg.checkpoint.keep_best == 1 and cfg.checkpoint.resume == "auto"
