"""A run's placement from its config: the bundles of every engine and learner rank, a cluster too small for
them failing before any actor starts (naming the resource and the config keys), and the run's actors using
exactly their bundles until shutdown releases the placement group."""

from __future__ import annotations

import time

import pytest
import ray
from ray.util.placement_group import placement_group_table

from cluster.placement import PlacementError
from jobs.config import load_config
from jobs.driver.handles import build_handles
from jobs.driver.resources import build_placement
from jobs.models.resolve import resolve_model
from jobs.plan.layout import run_layout
from marl.tasks import get_family

TINY = "jobs/configs/tiny.yaml"


def _demands(*overrides: str) -> dict[str, tuple[int, dict]]:
    cfg = load_config(TINY, ["run_name=r", *overrides])
    return {d.name: (d.n, dict(d.resources)) for d in run_layout(cfg).demands}


def test_bundles_follow_workflow_sharing_and_resources():
    engine, learner = {"CPU": 0.5, "GPU": 1.0}, {"CPU": 2.0, "GPU": 0.5, "trainer": 1.0}
    res = ["rollout.engine_num_gpus=1", "learner.backend=deepspeed", "learner.rank_num_cpus=2",
           "learner.rank_num_gpus=0.5", "learner.rank_resources={trainer: 1}"]
    assert _demands("marl.workflow=voting", "marl.sharing=isolated", "rollout.engines_per_role=2",
                    "learner.ranks=3", *res) == {
        "r:engine:generator": (2, engine), "r:engine:aggregator": (2, engine),
        "r:learner:generator": (3, learner), "r:learner:aggregator": (3, learner)}
    shared = _demands("marl.workflow=eval_opt", "marl.sharing=shared", *res)
    assert shared == {"r:engine:generator": (1, engine), "r:engine:evaluator": (1, engine),
                      "r:learner:shared": (1, learner)}
    assert all(n == 0 for n, _ in _demands("rollout.engines_per_role=0", "learner.ranks=0").values())


def test_a_cluster_too_small_fails_before_any_actor_starts(ray_cluster):
    cfg = load_config(TINY, ["run_name=toobig", "rollout.engine_num_gpus=1", "ray.placement_timeout_s=1"])
    with pytest.raises(PlacementError) as err:
        build_handles(run_layout(cfg), "unused-model-path", get_family("digit"))
    msg = str(err.value)
    assert "GPU: needs 2, cluster has 0" in msg and "toobig:engine:generator (1 x 1)" in msg
    assert "rollout.engine_num_gpus" in msg
    assert not [n for n in ray.util.list_named_actors() if n.startswith("toobig:")]
    assert all(
        v["state"] == "REMOVED" for v in placement_group_table().values() if v["name"].startswith("toobig")
    )


def test_run_actors_fill_their_bundles_until_shutdown_releases_them(ray_cluster):
    cfg = load_config(TINY, ["run_name=placed", "marl.workflow=single_agent", "rollout.engine_num_cpus=0.25",
                             "learner.rank_num_cpus=0.75", "ray.placement_strategy=STRICT_PACK"])
    handles = build_handles(run_layout(cfg), resolve_model(cfg.model.path), get_family("digit"))
    pg = handles.placement.pg
    try:
        assert pg.bundle_specs == [{"CPU": 0.25}, {"CPU": 0.75}]  # the solver's engine, then its learner rank
        # Ray accounts bundle i as CPU_group_<i>_<id>: once the run's actors are up they hold all of both.
        keys = [f"CPU_group_{i}_{pg.id.hex()}" for i in range(2)]
        end = time.monotonic() + 180  # actor creation (model load) and the resource view are asynchronous
        while not all(k in ray.cluster_resources() for k in keys) and time.monotonic() < end:
            time.sleep(0.2)
        assert [ray.cluster_resources().get(k) for k in keys] == [0.25, 0.75]
        while any(ray.available_resources().get(k, 0.0) for k in keys) and time.monotonic() < end:
            time.sleep(0.2)
        assert [ray.available_resources().get(k, 0.0) for k in keys] == [0.0, 0.0]
    finally:
        handles.shutdown()
    assert placement_group_table(pg)["state"] == "REMOVED"
    end = time.monotonic() + 60  # ray.kill is asynchronous
    while [n for n in ray.util.list_named_actors() if n.startswith("placed:")] and time.monotonic() < end:
        time.sleep(0.1)
    assert not [n for n in ray.util.list_named_actors() if n.startswith("placed:")]
    assert (
        build_placement(run_layout(load_config(TINY, ["rollout.engines_per_role=0", "learner.ranks=0"])))
        is None
    )
