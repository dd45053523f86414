"""The whole held-out split at the end of a run (jobs/driver/full_eval.py, data.eval_full): the final
weights, then the peak checkpoint's unless the final weights are the peak; the split is loaded whole
and the key checked at load."""

from __future__ import annotations

import json

import pytest

from jobs.config import ConfigError, load_config
from jobs.driver import run_checkpoints as ckpt
from jobs.driver.full_eval import full_evaluation
from jobs.driver.run_data import load_run_data
from marl.types import Task

TASKS = [Task(task_id=f"t{i}", prompt=f"p{i}", answer="1") for i in range(7)]


def _checkpoints(root, accuracies):
    for step, accuracy in accuracies.items():
        ckpt.write(root, ckpt.Progress(step=step, eval_accuracy=accuracy), {}, "")


def _run(root, final_on_draw):
    served, restored = ["final"], []

    def evaluate(tasks):
        assert tasks == TASKS
        return {"final": 0.25, "step_10": 0.5, "step_20": 0.75}[served[-1]]

    def restore(folder):
        restored.append(folder.name)
        served.append(folder.name)

    return full_evaluation(TASKS, evaluate, 30, final_on_draw, root, restore), restored


def test_the_peak_checkpoint_is_restored_and_evaluated_whole(tmp_path):
    _checkpoints(tmp_path, {10: 0.4, 20: 0.6, 25: None})
    metrics, restored = _run(tmp_path, final_on_draw=0.5)
    assert restored == ["step_20"]  # the best on the draw; an unevaluated checkpoint never counts
    assert {k: v for k, v in metrics.items() if k != "time/eval_full_s"} == {
        "eval/full/accuracy": 0.25, "eval/full/peak_accuracy": 0.75, "eval/full/peak_step": 20.0,
        "eval/full/tasks": 7.0}
    assert metrics["time/eval_full_s"] >= 0


@pytest.mark.parametrize("accuracies", [{10: 0.4, 20: 0.6}, {}])
def test_final_weights_at_or_above_every_checkpoint_are_the_peak(tmp_path, accuracies):
    _checkpoints(tmp_path, accuracies)
    metrics, restored = _run(tmp_path, final_on_draw=0.6)
    assert restored == []
    assert metrics["eval/full/peak_accuracy"] == metrics["eval/full/accuracy"] == 0.25
    assert metrics["eval/full/peak_step"] == 30.0


def test_the_whole_split_is_loaded_beside_the_draw(tmp_path):
    rows = "".join(json.dumps({"prompt": f"Held out {i}?", "answer": str(i)}) + "\n" for i in range(9))
    (tmp_path / "eval.jsonl").write_text(rows)
    (tmp_path / "train.jsonl").write_text(json.dumps({"prompt": "Train?", "answer": "1"}) + "\n")
    base = ["model.path=x", "data.task=math", f"data.train={tmp_path / 'train.jsonl'}",
            f"data.eval={tmp_path / 'eval.jsonl'}", "data.eval_size=3"]
    data = load_run_data(load_config(None, [*base, "data.eval_full=true"]))
    assert len(data.eval) == 3 and len(data.full_eval) == 9
    assert {t.task_id for t in data.eval} <= {t.task_id for t in data.full_eval}
    assert "the whole eval split (9 tasks)" in data.summary
    assert load_run_data(load_config(None, base)).full_eval == []
    with pytest.raises(ConfigError, match="data.eval_full"):
        load_config(None, [*base, "data.eval=digit", "data.eval_full=true"])


@pytest.mark.slow
def test_a_run_ends_with_the_whole_split_evaluated(ray_cluster, tmp_path):
    from jobs.telemetry.tracking import read_metrics
    from jobs.train import train

    rows = "".join(
        json.dumps({"prompt": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n" for i in range(5)
    )
    (tmp_path / "eval.jsonl").write_text(rows)
    cfg = load_config("jobs/configs/tiny.yaml", [
        f"out_dir={tmp_path}", "steps=2", "eval_every=1", "checkpoint.every=1", "rollout.engines_per_role=0",
        "learner.ranks=0", "rollout.prompts_per_step=2", "rollout.samples_per_prompt=2", "data.max_overlap=1",
        f"data.eval={tmp_path / 'eval.jsonl'}", "data.eval_size=2", "data.eval_full=true"])
    summary = train(cfg)
    last = read_metrics(tmp_path / "tiny")[-1]
    assert last["step"] == 2 and last["eval/full/tasks"] == 5.0
    assert 0.0 <= last["eval/full/accuracy"] <= 1.0 and last["eval/full/peak_step"] in (1.0, 2.0)
    assert summary["eval/full/accuracy"] == last["eval/full/accuracy"]
