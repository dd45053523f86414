"""GPU layouts refused at load (jobs/config/gpu_rules.py), naming the key, exit 2, before any actor starts:
an engine of several GPUs (no tensor parallelism), NCCL between in-process members, between a member without
a GPU and one with, and between members that may share one GPU; the channel's backend is decided once; and
the cluster gate (jobs/plan/cluster_check.py) on the GPUs the cluster's nodes have."""

from __future__ import annotations

import pytest

from cluster.gpus import ClusterGpus, NodeGpus
from jobs.config import ConfigError, load_config
from jobs.config.gpu_rules import channel_backend
from jobs.plan.cluster_check import cluster_problem, refuse_on_cluster
from jobs.plan.layout import run_layout
from jobs.train import main

TINY = "jobs/configs/tiny.yaml"
PAPER = "jobs/configs/sweeps/paper_base.yaml"
# Whole GPUs for learner rank 0 and one engine per role: an NCCL channel that can work.
WHOLE = ["learner.backend=deepspeed", "learner.ranks=1", "learner.rank_num_gpus=1",
         "rollout.engines_per_role=1", "rollout.engine_num_gpus=1", "marl.workflow=single_agent",
         "marl.sharing=shared", "sync.transport=nccl", "rollout.backend=vllm"]


def test_an_engine_of_several_gpus_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"rollout\.engine_num_gpus=2: .*tensor parallelism is not "
                                          r"implemented"):
        load_config(TINY, ["rollout.engines_per_role=1", "rollout.engine_num_gpus=2"])
    with pytest.raises(ConfigError, match=r"marl\.policies\.generator: rollout\.engine_num_gpus=4"):
        load_config(TINY, ["rollout.engines_per_role=1", "marl.policies.generator.rollout.engine_num_gpus=4"])
    assert main(["--config", TINY, "rollout.engines_per_role=1", "rollout.engine_num_gpus=2"]) == 2


def test_nccl_between_in_process_members_is_refused():
    with pytest.raises(ConfigError, match=r"sync\.transport=nccl joins actors .*engines_per_role=0"):
        load_config(TINY, [*WHOLE, "rollout.engines_per_role=0"])


@pytest.mark.parametrize("cpu_side", ["rollout.engine_num_gpus=0", "learner.rank_num_gpus=0"])
def test_nccl_with_an_end_on_cpu_is_refused_as_mismatched_backends(cpu_side):
    """A member without a GPU would build gloo against the others' NCCL: a hang until the timeout."""
    overrides = [*WHOLE, cpu_side] + (["learner.backend=torch"] if "rank" in cpu_side else [])
    with pytest.raises(ConfigError, match=r"needs a GPU on both ends .*" + cpu_side.replace(".", r"\.")):
        load_config(TINY, overrides)


def test_nccl_between_members_on_gpu_fractions_is_refused():
    """paper_base.yaml's former layout, an engine at 0.5 GPU beside a learner rank at 0.5 (now colocated,
    refused with NCCL by jobs/config/gpu_layout.py): NCCL refuses two ranks on one device."""
    with pytest.raises(ConfigError, match=r"may share one GPU: rollout\.engine_num_gpus=0\.5 and "
                                          r"learner\.rank_num_gpus=0\.5"):
        load_config(TINY, [*WHOLE, "rollout.engine_num_gpus=0.5", "learner.rank_num_gpus=0.5"])
    with pytest.raises(ConfigError, match=r"sync\.transport=nccl cannot run under rollout\.layout=colocated"):
        load_config(PAPER, ["sync.transport=nccl"])
    # one fractional engine beside a whole-GPU rank cannot share a device with another channel member
    assert load_config(TINY, [*WHOLE, "rollout.engine_num_gpus=0.5"]).sync.transport == "nccl"
    with pytest.raises(ConfigError, match="may share one GPU"):  # two engines of one channel on fractions
        load_config(TINY, [*WHOLE, "rollout.engine_num_gpus=0.5", "rollout.engines_per_role=2"])


def test_nccl_on_whole_gpus_loads_and_the_backend_is_one_decision():
    assert load_config(TINY, WHOLE).sync.transport == "nccl"
    assert channel_backend("nccl") == "nccl"
    assert channel_backend("object_store") == "gloo"


def test_the_cluster_gate_reads_the_clusters_gpus_not_the_drivers():
    cfg = load_config(TINY, WHOLE)
    none = run_layout(cfg, gpus=ClusterGpus())  # a cluster of CPU nodes only
    assert "the cluster's nodes have none" in (cluster_problem(none) or "")
    with pytest.raises(ConfigError, match=r"sync\.transport=nccl needs GPUs"):
        refuse_on_cluster(none)
    workers = ClusterGpus((NodeGpus("10.0.0.2", 2.0, "H100", 80e9),))  # a CPU head, one GPU worker node
    assert cluster_problem(run_layout(cfg, gpus=workers)) is None
    refuse_on_cluster(run_layout(cfg, gpus=workers))
