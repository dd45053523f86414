"""The config section an engine group reads, as a Protocol: jobs/config/schema.py's RolloutConfig satisfies it
(mypy checks it where an EngineGroup is built); rollout cannot import jobs, so the contract is stated here, on
the side that reads it. Also the choices of the keys only the engines interpret."""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol

from rollout.engine import EngineBackendName


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
    backend: EngineBackendName
    engines_per_role: int
    engine_num_cpus: float
    torch_threads: int
    max_batch_size: int
    stall_timeout_s: float
    start_timeout_s: float
    replace_dead_engines: bool
    kv_cache_gb: float
    gpu_memory_utilization: float
    max_model_len: int
    vllm_sync_path: VllmSyncPath
    layout: GpuLayout
