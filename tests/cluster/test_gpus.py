"""Multi-node facts from the cluster, not the driver (cluster/gpus.py, cluster/collective.py,
cluster/driver_env.py): the GPUs and accelerator types of Ray's nodes, read into the run layout, its plan,
its `auto` checkpointing and the NCCL gate; rendezvous on Ray's node IP; the collectives' settings reach the
members. The cluster test runs a CPU head node and a worker node that declares two (fake) H100s."""

from __future__ import annotations

import socket

import pytest

from cluster import collective
from cluster.driver_env import driver_env
from cluster.gpus import MEMORY_BY_TYPE, ClusterGpus, NodeGpus, from_ray_nodes

HEAD = {"NodeManagerAddress": "10.0.0.1", "Alive": True, "Resources": {"CPU": 8.0, "node:10.0.0.1": 1.0}}
WORKER = {"NodeManagerAddress": "10.0.0.2", "Alive": True,
          "Resources": {"CPU": 16.0, "GPU": 2.0, "accelerator_type:H100": 1.0}}


def test_the_gpus_are_the_worker_nodes_not_the_head_nodes():
    gpus = from_ray_nodes([HEAD, WORKER, {**WORKER, "NodeManagerAddress": "10.0.0.3", "Alive": False}])
    assert gpus == ClusterGpus((NodeGpus("10.0.0.2", 2.0, "H100", MEMORY_BY_TYPE["H100"]),))
    assert gpus.total == 2.0 and gpus.accelerators == ("H100",) and gpus.memory_per_gpu() == 80e9
    assert from_ray_nodes([HEAD]).total == 0.0


def test_memory_is_the_smallest_gpus_and_unknown_when_any_type_is():
    mixed = from_ray_nodes([WORKER, {**WORKER, "Resources": {"GPU": 8.0, "accelerator_type:H200": 1.0}}])
    assert mixed.memory_per_gpu() == 80e9 and mixed.accelerators == ("H100", "H200")
    unknown = from_ray_nodes([WORKER, {**WORKER, "Resources": {"GPU": 1.0, "accelerator_type:A100": 1.0}}])
    assert unknown.memory_per_gpu() == 0.0  # A100 names two sizes: the plan needs ray.gpu_memory_gb


def test_the_rendezvous_host_is_rays_node_ip(monkeypatch):
    import ray

    monkeypatch.setattr(socket, "gethostbyname", lambda name: "127.0.1.1")  # a Debian-style /etc/hosts
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "10.0.0.2")
    host, port = collective.rendezvous_address()
    assert host == "10.0.0.2" and port > 0
    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # in-process members meet in one process
    assert collective.rendezvous_address()[0] == "127.0.0.1"


def test_nccl_and_gloo_settings_reach_every_member(monkeypatch):
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "eth1")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth1")
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    for cpu_only in (True, False):
        env = driver_env(cpu_only=cpu_only)
        assert {k: env[k] for k in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME",
                                    "TORCH_NCCL_ASYNC_ERROR_HANDLING")} == {
            "NCCL_SOCKET_IFNAME": "eth1", "GLOO_SOCKET_IFNAME": "eth1",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cpu_head_gpu_worker():
    """A CPU head node (the driver's) and a worker node declaring two H100s (Ray takes num_gpus and an
    accelerator_type resource on faith, so a CPU machine can stand in)."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "num_gpus": 0, "dashboard_agent_listen_port": _free_port()})
    cluster.add_node(num_cpus=1, num_gpus=2, resources={"accelerator_type:H100": 1.0},
                     dashboard_agent_listen_port=_free_port())
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    try:
        yield
    finally:
        ray.shutdown()
        cluster.shutdown()


# The paper's 4B cell (LoRA 64) on whole GPUs: its learner needs checkpointing on an 80 GB GPU at 40,960
# tokens per micro-batch.
PAPER_4B = ["model.path=builtin:qwen3-4b-shape?vocab=151936", "marl.workflow=single_agent",
            "marl.sharing=shared", "learner.backend=deepspeed", "learner.ranks=1", "learner.rank_num_gpus=1",
            "rollout.backend=vllm", "rollout.engines_per_role=1", "rollout.engine_num_gpus=1",
            "learner.max_tokens_per_micro_batch=40960", "algo.max_len=40960", "sync.transport=nccl",
            "learner.role_grad_diagnostics=false", "model.lora.enabled=true", "model.lora.rank=64"]


@pytest.mark.slow
def test_a_cpu_head_node_plans_on_its_gpu_workers(cpu_head_gpu_worker):
    import torch

    from cluster.gpus import cluster_gpus
    from jobs.config import load_config
    from jobs.plan.cluster_check import cluster_problem
    from jobs.plan.layout import run_layout
    from jobs.plan.planner import gpu_memory, make_plan

    assert not torch.cuda.is_available()  # the driver's own process sees no GPU
    gpus = cluster_gpus()
    assert gpus.total == 2.0 and gpus.accelerators == ("H100",)
    layout = run_layout(load_config("jobs/configs/tiny.yaml", PAPER_4B))
    assert layout.gpus == gpus and gpu_memory(layout) == MEMORY_BY_TYPE["H100"]
    assert layout.checkpointing == {"shared": True}  # auto, resolved against the workers' 80 GB
    assert make_plan(layout, times=False).fits() and cluster_problem(layout) is None
    # The same config planned from the driver's own devices: nothing to plan on, checkpointing off.
    local = run_layout(load_config("jobs/configs/tiny.yaml", PAPER_4B), gpus=ClusterGpus())
    assert gpu_memory(local) == 0.0 and local.checkpointing == {"shared": False}
    assert cluster_problem(local) is not None
