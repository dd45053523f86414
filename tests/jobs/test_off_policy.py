"""rollout.one_step_off_policy: step t+1's episodes are collected during step t's update, by the weights of
before it; a resumed run collects the prompts the interrupted one had prefetched again."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from cluster.stop import StopRequested
from jobs.config import load_config
from jobs.telemetry.tracking import read_metrics
from jobs.train import train

IN_PROCESS = ("rollout.engines_per_role=0", "learner.ranks=0", "rollout.prompts_per_step=2",
              "rollout.samples_per_prompt=2", "data.eval_size=0", "marl.workflow=single_agent")


# The behaviour policy is the engine one version behind: the ratio is taken against its logprobs.
OFF_POLICY = ("rollout.one_step_off_policy=true", "algo.old_logprobs=rollout")


def _train(out: Path, *overrides: str, callbacks=()) -> list[dict]:
    """The run's step rows (the final evaluation's row left out)."""
    train(
        load_config("jobs/configs/tiny.yaml", [f"out_dir={out}", *IN_PROCESS, *overrides]),
        callbacks=callbacks,
    )
    return [r for r in read_metrics(out / "tiny") if "time/step_s" in r]


class StopAfter:
    """Stops the run (as SIGTERM would) once step `n - 1` is done; the prefetched
    episodes of step n are lost."""

    def __init__(self, n: int):
        self.n = n

    def on_step(self, step, metrics, checkpoint):  # noqa: ARG002 - StepCallback signature
        if step + 1 == self.n:
            raise StopRequested


def _column(out: Path, step: int, name: str) -> list:
    return pq.read_table(out / "tiny" / "rollouts" / f"step_{step:06d}.parquet")[name].to_pylist()


def test_each_batch_comes_from_the_weights_before_the_previous_update(ray_cluster, tmp_path):
    rows = _train(tmp_path, "steps=3", *OFF_POLICY)
    assert [r["rollout/off_policy_steps"] for r in rows] == [0.0, 1.0, 1.0]
    # Step 0 collects its own batch and prefetches step 1's; the last step has nothing to prefetch.
    assert rows[0]["time/rollout_s"] > 0 and [r["time/prefetch_s"] > 0 for r in rows] == [True, True, False]
    assert rows[1]["time/rollout_s"] < rows[0]["time/rollout_s"] and rows[1]["time/generate_s"] == 0.0
    # The engines held version 0 while step 0's update ran, version 1 during step 1's.
    assert [set(_column(tmp_path, s, "version")) for s in range(3)] == [{0}, {0}, {1}]


def test_off_policy_sees_the_same_prompts_as_on_policy(ray_cluster, tmp_path):
    """Only when the episodes are collected changes: the prompts and sampling seeds per step are the same."""
    on = _train(tmp_path / "on", "steps=3")
    off = _train(tmp_path / "off", "steps=3", *OFF_POLICY)
    assert [r["rollout/off_policy_steps"] for r in on] == [0.0, 0.0, 0.0] and len(off) == 3
    for step in range(3):
        assert _column(tmp_path / "on", step, "task_id") == _column(tmp_path / "off", step, "task_id")


@pytest.mark.parametrize("stop_after", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_a_resumed_run_collects_the_prefetched_prompts_again(ray_cluster, tmp_path, stop_after):
    whole = tmp_path / "whole"
    _train(whole, "steps=3", *OFF_POLICY)
    parts = tmp_path / "parts"
    with pytest.raises(StopRequested):
        _train(parts, "steps=3", *OFF_POLICY, "checkpoint.every=1",
               callbacks=(StopAfter(stop_after),))
    rows = _train(parts, "steps=3", *OFF_POLICY, "checkpoint.every=1")
    assert [r["step"] for r in rows] == [0, 1, 2]
    # The first step after the resume collects synchronously, with the restored weights.
    assert rows[stop_after]["rollout/off_policy_steps"] == 0.0
    for step in range(3):
        assert _column(parts, step, "task_id") == _column(whole, step, "task_id")
