"""A simulated two-node cluster (ray.cluster_utils.Cluster): the run's engines and learners land where its
placement config says, by resource-labelled bundles and by STRICT_SPREAD, and the placement group goes away
with the system."""

from __future__ import annotations

import socket

import pytest
import ray
from ray.cluster_utils import Cluster
from ray.util.placement_group import placement_group_table

from jobs.config import load_config
from jobs.driver.handles import RunHandles, build_handles
from jobs.models.resolve import resolve_model
from jobs.plan.layout import run_layout
from marl.tasks import get_family

pytestmark = pytest.mark.slow

SMALL = ["rollout.engines_per_role=1", "learner.ranks=1", "rollout.engine_num_cpus=0.25",
         "learner.rank_num_cpus=0.25", "data.eval_size=0", "ray.placement_timeout_s=60"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_nodes():
    # Both nodes run on this machine: each node's agent needs a port of its own (the default is fixed).
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "resources": {"inference": 4}, "dashboard_agent_listen_port": _free_port()})
    cluster.add_node(num_cpus=1, resources={"training": 4}, dashboard_agent_listen_port=_free_port())
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    nodes = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}
    try:
        yield {kind: next(i for i, r in nodes.items() if kind in r) for kind in ("inference", "training")}
    finally:
        ray.shutdown()
        cluster.shutdown()


def _node_of(actor) -> str:
    return ray.get(
        actor.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()), timeout=60
    )


def _nodes(handles: RunHandles) -> tuple[list[str], list[str]]:
    engines = {id(g): g for g in handles.engines.values()}.values()
    return ([_node_of(m) for g in engines for m in g.group._members],
            [_node_of(m) for lg in handles.learners.values() for m in lg.group._members])


def _build(*overrides: str) -> RunHandles:
    cfg = load_config("jobs/configs/tiny.yaml", [*SMALL, *overrides])
    return build_handles(run_layout(cfg), resolve_model(cfg.model.path), get_family("digit"))


def test_labelled_bundles_put_engines_and_learners_on_their_nodes(two_nodes):
    handles = _build("run_name=labels", "marl.workflow=voting", "marl.sharing=isolated",
                    "rollout.engine_resources={inference: 1}", "learner.rank_resources={training: 1}")
    pg = handles.placement.pg
    try:
        engines, learners = _nodes(handles)
        assert engines == [two_nodes["inference"]] * 2  # generator, aggregator
        assert learners == [two_nodes["training"]] * 2  # one rank per policy
    finally:
        handles.shutdown()
    assert placement_group_table(pg)["state"] == "REMOVED"


def test_strict_spread_puts_each_member_on_its_own_node(two_nodes):
    handles = _build("run_name=spread", "marl.workflow=single_agent", "ray.placement_strategy=STRICT_SPREAD")
    try:
        engines, learners = _nodes(handles)
        assert len(engines) == len(learners) == 1 and engines[0] != learners[0]
        assert set(placement_group_table(handles.placement.pg)["bundles_to_node_id"].values()) == set(
            two_nodes.values())
    finally:
        handles.shutdown()
