"""cliff.action=rollback: a flagged cliff restores the most accurate checkpoint's learner state, the engines
serve it before the next rollout, and the run goes on (held-out accuracy is scripted)."""

from __future__ import annotations

import pyarrow.parquet as pq
import torch

import jobs.driver.loop
from jobs.config import load_config
from jobs.telemetry.tracking import read_metrics
from jobs.train import train

TINY = "jobs/configs/tiny.yaml"
ROLLBACK = [
    "cliff.action=rollback",
    "cliff.drop=0.2",
    "cliff.window=1",
    "eval_every=1",
    "checkpoint.every=1",
    "checkpoint.keep_last=2",
    "checkpoint.keep_best=1",
    "learner.ranks=0",
    "rollout.engines_per_role=0",
    "marl.workflow=single_agent",
    "marl.sharing=shared",
    "rollout.prompts_per_step=2",
    "ray.num_cpus=2",
]


# The runs ask for ray.num_cpus=2: the `ray_cluster` fixture (tests/conftest.py)
# starts a cluster of that size.
RAY_CPUS = 2


def _scripted(monkeypatch, accuracies: list[float]) -> None:
    left = list(accuracies)
    monkeypatch.setattr(jobs.driver.loop, "timed_evaluate",
                        lambda system, cfg, tasks, run_dir, steps_done: {"eval/accuracy": left.pop(0),
                                                                           "time/eval_s": 0.0})


def _state(root, step):
    folder = root / f"step_{step}" / "policies" / "shared"
    return (torch.load(folder / "model.pt", weights_only=False)["weights"],
            torch.load(folder / "optimizer.pt", weights_only=False)["state"])


def test_rollback_restores_the_best_checkpoint_and_goes_on(ray_cluster, tmp_path, monkeypatch):
    # before, after steps 1..4, final: the drop at step 2 (0.6 -> 0.3) is the cliff.
    _scripted(monkeypatch, [0.1, 0.6, 0.3, 0.55, 0.5, 0.5])
    summary = train(load_config(TINY, [f"out_dir={tmp_path}", "steps=5", *ROLLBACK]))
    rows = {r["step"]: r for r in read_metrics(tmp_path / "tiny")}
    assert rows[1]["cliff/rollback_to_step"] == 1.0 and rows[1]["cliff/evals_below"] == 0.0
    assert not any("cliff/rollback_to_step" in rows[s] for s in (0, 2, 3))
    assert summary["train/rollbacks"] == 1.0 and rows[5]["eval/accuracy"] == 0.5
    # Step 2's checkpoint was taken after the rollback: it holds step 1's weights and optimizer moments.
    root = tmp_path / "tiny" / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_1", "step_4", "step_5"]


def test_rolled_back_state_is_what_the_learners_and_engines_hold(ray_cluster, tmp_path, monkeypatch):
    _scripted(monkeypatch, [0.1, 0.6, 0.3, 0.5])
    train(load_config(TINY, [f"out_dir={tmp_path}", "steps=3", *ROLLBACK, "checkpoint.keep_last=3"]))
    root = tmp_path / "tiny" / "checkpoints"
    (w1, opt1), (w2, opt2) = _state(root, 1), _state(root, 2)
    assert all(torch.equal(w1[k], w2[k]) for k in w1)
    assert all(torch.equal(opt1[i]["exp_avg_sq"], opt2[i]["exp_avg_sq"]) for i in opt1)
    # Versions: 2 after step 2's update, 3 for the rolled-back weights, which step 3's rollout was served.
    versions = pq.read_table(tmp_path / "tiny" / "rollouts" / "step_000002.parquet")["version"].to_pylist()
    assert set(versions) == {3}


def test_a_persistent_drop_cannot_roll_back_forever(ray_cluster, tmp_path, monkeypatch):
    # The window restarts after each rollback and the step budget is not rewound: the run ends on time.
    _scripted(monkeypatch, [0.1, 0.6, 0.3, 0.3, 0.3, 0.3])
    summary = train(load_config(TINY, [f"out_dir={tmp_path}", "steps=5", *ROLLBACK]))
    rows = read_metrics(tmp_path / "tiny")
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4, 5]
    assert [r.get("cliff/rollback_to_step") for r in rows[:4]] == [None, 1.0, 1.0, 1.0]
    assert summary["train/rollbacks"] == 3.0
