"""A node dies mid-run (ray.cluster_utils.Cluster, as in test_two_node.py): every engine and learner of an
isolated run is on the second node, which is removed after a checkpoint. With checkpoint.max_failures=1
the run names the lost members and their node, waits for the cluster to hold its placement group again
(the test adds a node back), and resumes from the last committed checkpoint with every step logged once.
Without a node to come back it fails within ray.placement_timeout_s, naming what it needs and what the
cluster has, and the checkpoint stays."""

from __future__ import annotations

import re
import threading
import time

import pytest
import ray
from ray.cluster_utils import Cluster

import jobs.train
from jobs.config import load_config
from jobs.driver import run_checkpoints as ckpt
from jobs.telemetry.tracking import read_metrics
from tests.ray_head import free_port

pytestmark = pytest.mark.slow

WORKER = {"num_cpus": 1, "resources": {"worker_node": 4}}  # the only node the run's members fit on
RUN = [
    "run_name=lost",
    "marl.workflow=voting",
    "marl.sharing=isolated",
    "rollout.prompts_per_step=2",
    "rollout.samples_per_prompt=2",
    "data.eval_size=0",
    "rollout.engines_per_role=1",
    "learner.ranks=1",
    "rollout.engine_num_cpus=0.25",
    "learner.rank_num_cpus=0.25",
    "rollout.engine_resources={worker_node: 1}",
    "learner.rank_resources={worker_node: 1}",
    "steps=5",
    "checkpoint.every=2",
    "checkpoint.max_failures=1",
]


@pytest.fixture
def cluster():
    # Nodes are declared dead after two missed 0.5 s health checks (the default takes ~15 s).
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "dashboard_agent_listen_port": free_port(),
        "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 2,
                           "health_check_timeout_ms": 500}})
    c.worker = c.add_node(**WORKER, dashboard_agent_listen_port=free_port())
    c.wait_for_nodes()
    ray.init(address=c.address)
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


class RemoveNodeAfter:
    """Removes the worker node (no graceful exit) after step `at`, once; records when."""

    def __init__(self, cluster: Cluster, at: int):
        self.cluster, self.at, self.removed_at = cluster, at, 0.0
        self.steps: list = []

    def on_step(self, step, metrics, checkpoint):
        self.steps.append((step, time.monotonic()))
        if step == self.at and not self.removed_at:
            self.node = self.cluster.worker.node_id
            self.cluster.remove_node(self.cluster.worker, allow_graceful=False)
            self.removed_at = time.monotonic()


def test_a_lost_node_comes_back_and_the_run_resumes_from_its_checkpoint(
    cluster, tmp_path, monkeypatch, capsys
):
    restarting, restart = threading.Event(), jobs.train._restart_point

    def restart_and_tell(*args):
        out = restart(*args)
        restarting.set()
        return out

    monkeypatch.setattr(jobs.train, "_restart_point", restart_and_tell)
    remove = RemoveNodeAfter(cluster, at=2)  # steps 0-2 done, step_2 committed after step 1
    cfg = load_config("jobs/configs/tiny.yaml", [*RUN, f"out_dir={tmp_path}", "ray.placement_timeout_s=60"])
    # The driver runs in a thread: Ray adds nodes from the main thread only, once the run waits for one.
    result: dict = {}
    driver = threading.Thread(
        target=lambda: result.update(summary=jobs.train.train(cfg, callbacks=(remove,)))
    )
    driver.start()
    assert restarting.wait(timeout=300), "the run never restarted"
    time.sleep(3)  # the node comes back a while after the run started waiting for it
    cluster.add_node(**WORKER, dashboard_agent_listen_port=free_port())
    driver.join(timeout=300)
    summary = result["summary"]
    out = capsys.readouterr().out
    # The first call to fail names its member. Which one is timing: the dead node's workers may answer a step
    # more before they notice their raylet is gone, so it can be an engine's or a learner's call, or the
    # engine group finding that a member's bundle lost its node.
    assert re.search(r"training failure 1/1: lost:(engine|learner):(generator|aggregator):0[ .]", out), out
    members = ", ".join(f"{m} on node {remove.node}" for m in (
        "lost:engine:generator:0", "lost:engine:aggregator:0", "lost:learner:generator:0",
        "lost:learner:aggregator:0"))
    assert f"lost with their node: {members}; system torn down, restarting from " \
           f"{tmp_path / 'lost' / 'checkpoints' / 'step_2'} once the cluster holds the run" in out
    assert f"resumed from {tmp_path / 'lost' / 'checkpoints' / 'step_2'} at step 2" in out
    assert summary["train/failures"] == 1.0 and summary["train/steps_lost"] == 1.0
    assert [r["step"] for r in read_metrics(tmp_path / "lost")] == [0, 1, 2, 3, 4, 5]
    back = next(t for s, t in remove.steps if t > remove.removed_at)  # the first step finished after the loss
    print(
        f"node loss: recovered (next step done) {back - remove.removed_at:.1f}s after the node was removed; "
        f"steps lost {summary['train/steps_lost']:.0f}"
    )


def test_without_a_node_to_come_back_the_run_fails_within_its_deadline_and_keeps_the_checkpoint(
    cluster, tmp_path
):
    remove = RemoveNodeAfter(cluster, at=2)
    cfg = load_config("jobs/configs/tiny.yaml", [*RUN, f"out_dir={tmp_path}", "ray.placement_timeout_s=10"])
    with pytest.raises(jobs.train.PlacementError) as info:
        jobs.train.train(cfg, callbacks=(remove,))
    failed_in = time.monotonic() - remove.removed_at
    message = str(info.value)
    assert (
        "the cluster cannot hold placement group 'lost:placement' (4 bundles, strategy PACK) within 10s"
        in message
    )
    assert "worker_node: needs 4, cluster has 0 (0 free); asked by lost:engine:generator (1 x 1)" in message
    step_2 = tmp_path / "lost" / "checkpoints" / "step_2"
    assert f"after training failure 1; the last checkpoint, {step_2}, is kept" in message
    assert ckpt.newest(step_2.parent) == step_2
    assert failed_in < 10 + 30  # the placement deadline, plus detecting the loss and tearing down
