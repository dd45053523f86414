"""Concurrent or sequential policy updates: the auto rule, and both orders giving the same metrics."""

from types import SimpleNamespace

import pytest

from jobs.driver.updates import run_concurrently


def learner(**kw):
    base = {"concurrent_updates": None, "rank_num_gpus": 0.0, "ranks": 1, "rank_num_cpus": 1.0,
            "torch_threads": 0}
    return SimpleNamespace(**{**base, **kw})


@pytest.mark.parametrize("kw,policies,cores,expected", [
    ({}, 2, 2, True),  # two 1-thread ranks on two cores
    ({"rank_num_cpus": 2.0}, 2, 2, False),  # two 2-thread ranks would share two cores: in turn
    ({"rank_num_cpus": 2.0}, 1, 2, True),
    ({"torch_threads": 4}, 1, 2, False),
    ({"ranks": 0}, 2, 8, False),  # in-process learners each use every core of the process
    ({"ranks": 0}, 1, 8, True),
    ({"rank_num_gpus": 1.0, "rank_num_cpus": 8.0}, 3, 2, True),  # GPU learners: always at once
    ({"concurrent_updates": True, "rank_num_cpus": 8.0}, 3, 2, True),
    ({"concurrent_updates": False}, 1, 64, False),
])
def test_auto_rule(kw, policies, cores, expected):
    assert run_concurrently(learner(**kw), policies, cores) is expected


@pytest.mark.slow  # two whole steps of two policies: ~20 s
def test_in_turn_and_at_once_give_the_same_step(ray_cluster, tmp_path):
    from jobs.config import load_config
    from jobs.telemetry.tracking import read_metrics
    from jobs.train import train

    rows = {}
    for mode in ("true", "false"):
        out = tmp_path / mode
        train(
            load_config(
                "jobs/configs/tiny.yaml",
                [
                    f"out_dir={out}",
                    "rollout.engines_per_role=0",
                    "learner.ranks=0",
                    "steps=2",
                    "eval_every=0",
                    "tracking.tensorboard=false",
                    "tracking.ray_metrics=false",
                    f"learner.concurrent_updates={mode}",
                ],
            )
        )
        rows[mode] = [r for r in read_metrics(out / "tiny") if "time/step_s" in r]
    for at_once, in_turn in zip(rows["true"], rows["false"], strict=True):
        keys = [k for k in at_once if k.startswith(("loss/", "grad/norm/", "reward/mean"))]
        assert keys and {k: in_turn[k] for k in keys} == pytest.approx(
            {k: at_once[k] for k in keys}, rel=1e-6
        )
