"""The config section an engine group reads, as a Protocol: jobs/config/schema.py's RolloutConfig satisfies it
(mypy checks it where an EngineGroup is built); rollout cannot import jobs, so the contract is stated here, on
the side that reads it. Also the choices of the keys only the engines interpret."""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol

GIB = 2**30
# `rollout.kv_cache_gb` unset on a CPU engine: vLLM's CPU backend would otherwise reserve most of the machine.
CPU_KV_CACHE_GB = 1.0


class VllmSyncPath(StrEnum):
    """`rollout.vllm_sync_path`: how a vLLM engine takes new weights (in place, or vLLM's reload_weights)."""

    fast = "fast"
    reload = "reload"


class GpuLayout(StrEnum):
    """`rollout.layout`: where engines and learner ranks run. separate: each on GPUs (or GPU fractions) of its
    own, all resident at once; colocated: the paper's hybrid engine, one engine per GPU of the trial and one
    rank of each learner group on the same GPU, taking turns (engines asleep during the update, the
    learners' optimizer states offloaded during the rollout: jobs/driver/phases.py)."""

    separate = "separate"
    colocated = "colocated"


class RolloutSection(Protocol):
    backend: str
    engines_per_role: int
    engine_num_cpus: float
    torch_threads: int
    max_batch_size: int
    stall_timeout_s: float
    start_timeout_s: float
    replace_dead_engines: bool
    kv_cache_gb: float | None
    gpu_memory_utilization: float
    max_model_len: int
    vllm_sync_path: VllmSyncPath
    layout: GpuLayout


def kv_cache_bytes(kv_cache_gb: float | None, on_gpu: bool) -> int | None:
    """The KV cache one vLLM engine reserves, in bytes, or None: vLLM sizes it from
    `rollout.gpu_memory_utilization` (GPU only). The engine (rollout/vllm/support.py) and the planner
    (jobs/plan/planner.py) both read `rollout.kv_cache_gb` through this, so they plan what runs.
    Unset: CPU_KV_CACHE_GB on CPU, the utilization on GPU; > 0: that many GiB on either (on GPU it
    overrides the utilization, as vLLM's kv_cache_memory_bytes does); 0: the utilization (GPU only)."""
    if kv_cache_gb is None:
        return None if on_gpu else int(CPU_KV_CACHE_GB * GIB)
    if kv_cache_gb > 0:
        return int(kv_cache_gb * GIB)
    if on_gpu:
        return None
    raise ValueError("rollout.kv_cache_gb=0 sizes the KV cache by rollout.gpu_memory_utilization, which only "
                     "a GPU engine can; set it > 0 (or leave it unset) for vLLM engines on CPU")
