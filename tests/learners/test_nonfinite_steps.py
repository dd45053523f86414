"""Optimizer steps that did not apply are counted and visible: the torch backend skips a step whose gradient
norm is inf or NaN (as DeepSpeed skips an overflowed one) and leaves the weights as they were; the learner
counts it in update/nonfinite_steps/<policy> (and update/skipped_steps/<policy>) and the run of consecutive
ones, the driver stops the run at learner.max_consecutive_skipped_steps, and every sink shows the inf norm as
a flagged value."""

from __future__ import annotations

import math

import pytest
import torch

from jobs.driver.updates import SkippedStepsError, check_skipped_steps
from jobs.telemetry.tracking import NONFINITE_SENTINEL, RunLog, _scalars, nonfinite_flags
from learners.rank_metrics import merge_rank_metrics
from tests.builders import rows_batch
from tests.learners.test_learner import ROWS, make_learner, model_path, update  # noqa: F401


def _weights(learner) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in learner.model.state_dict().items()}


@pytest.mark.parametrize("role_grads", ["true", "false"])
def test_a_non_finite_gradient_is_skipped_and_counted(make_learner, role_grads):  # noqa: F811
    learner = make_learner(f"learner.role_grad_diagnostics={role_grads}")
    before = _weights(learner)
    param = next(p for p in learner.model.parameters() if p.requires_grad)
    hook = param.register_hook(lambda g: torch.full_like(g, float("inf")))  # a gradient that overflowed
    first = merge_rank_metrics([update(learner, rows_batch(ROWS))], "p")
    second = merge_rank_metrics([update(learner, rows_batch(ROWS))], "p")
    after = _weights(learner)
    assert all(torch.equal(before[k], after[k]) for k in before)  # no NaN written, nothing moved
    assert math.isinf(second["grad/norm/p"])
    assert (first["update/nonfinite_steps/p"], first["update/nonfinite_run/p"]) == (1.0, 1.0)
    assert (second["update/nonfinite_steps/p"], second["update/nonfinite_run/p"]) == (1.0, 2.0)
    assert second["update/skipped_steps/p"] == 1.0 and second["optim/steps/p"] == 1.0
    hook.remove()
    third = merge_rank_metrics([update(learner, rows_batch(ROWS))], "p")
    assert third["update/nonfinite_steps/p"] == 0.0 and third["update/nonfinite_run/p"] == 0.0
    assert math.isfinite(third["grad/norm/p"])
    assert any(not torch.equal(before[k], v) for k, v in _weights(learner).items())  # it trains again


def test_the_run_stops_after_the_configured_run_of_skipped_steps():
    metrics = {"update/nonfinite_run/p": 5.0, "grad/norm/p": float("inf"), "update/nonfinite_run/q": 0.0}
    with pytest.raises(SkippedStepsError, match=r"policy 'p': its last 5 optimizer steps did not apply .*"
                                                r"learner\.max_consecutive_skipped_steps=5"):
        check_skipped_steps(metrics, 5, step=7)
    check_skipped_steps(metrics, 6, step=7)  # not yet
    check_skipped_steps(metrics, 0, step=7)  # 0: never stop


def test_inf_and_nan_norms_reach_every_sink_flagged():
    metrics = {"grad/norm/p": float("inf"), "last/grad/norm/p": float("nan"), "eval/accuracy": float("nan"),
               "loss/p": -float("inf"), "reward/mean": 0.5}
    assert nonfinite_flags(metrics) == {"grad/norm/p/nonfinite": 1.0, "last/grad/norm/p/nonfinite": 2.0,
                                        "loss/p/nonfinite": 1.0}
    # TensorBoard, MLflow and W&B take these: the sentinel of each one's sign, undefined NaNs left out
    assert _scalars(metrics) == {"grad/norm/p": NONFINITE_SENTINEL, "last/grad/norm/p": NONFINITE_SENTINEL,
                                 "loss/p": -NONFINITE_SENTINEL, "reward/mean": 0.5}


def test_the_run_log_hands_the_flags_to_every_sink_and_keeps_the_value_in_its_file(tmp_path):
    class Sink:
        rows: list[dict] = []

        def on_step(self, step, metrics, checkpoint=None):
            self.rows.append(dict(metrics))

        def close(self):
            pass

    sink = Sink()
    log = RunLog(tmp_path, tensorboard=True, sinks=(sink,))
    log.log(0, {"grad/norm/p": float("inf"), "reward/mean": 0.5})
    log.close()
    assert sink.rows[0]["grad/norm/p/nonfinite"] == 1.0 and math.isinf(sink.rows[0]["grad/norm/p"])
    line = (tmp_path / "metrics.jsonl").read_text()
    assert '"grad/norm/p": Infinity' in line and '"grad/norm/p/nonfinite": 1.0' in line


def test_the_dashboard_records_the_sentinel(monkeypatch):
    from cluster.ray_metrics import MetricSpec, RayMetricsSink

    sink = RayMetricsSink([MetricSpec("grad/norm/{policy}", "marl_grad_norm"),
                           MetricSpec("eval/accuracy", "marl_eval_accuracy")])
    recorded = []
    monkeypatch.setattr(sink, "_record", lambda spec, value, tags: recorded.append((spec.name, value)))
    sink.on_step(0, {"grad/norm/p": float("inf"), "eval/accuracy": float("nan")})
    assert recorded == [("marl_grad_norm", NONFINITE_SENTINEL)]  # an undefined NaN stays out
