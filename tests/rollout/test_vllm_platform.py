"""The vLLM engine's options by platform (rollout/vllm/platform.py) and the KV-cache setting as the engine and
the planner both resolve it (rollout/config.py kv_cache_bytes): pure, no vllm import."""

from __future__ import annotations

import pytest

from jobs.config import load_config
from jobs.plan.layout import run_layout
from jobs.plan.planner import make_plan
from jobs.plan.rollout_estimate import ENGINE_RESERVE
from learners.compute.memory import GIB
from rollout.config import CPU_KV_CACHE_GB, kv_cache_bytes
from rollout.vllm.platform import Platform, engine_options
from rollout.vllm.support import memory_kwargs


def test_the_cpu_builds_restrictions_stay_on_cpu():
    cpu, cuda = engine_options(Platform.cpu), engine_options(Platform.cuda)
    assert cpu.llm_kwargs["enable_chunked_prefill"] is False and cpu.llm_kwargs["enforce_eager"] is True
    # on CUDA: chunked prefill and CUDA graphs (vLLM warns chunked prefill off "may crash")
    assert cuda.llm_kwargs["enable_chunked_prefill"] is True and cuda.llm_kwargs["enforce_eager"] is False
    assert cpu.llm_kwargs["distributed_executor_backend"] == cuda.llm_kwargs["distributed_executor_backend"]


@pytest.mark.parametrize("platform", list(Platform))
def test_the_model_runner_is_chosen_explicitly_on_every_platform(platform):
    # vLLM 0.32 would pick V2 on CUDA by itself; every worker-side path here runs on V1
    assert engine_options(platform).env == {"VLLM_USE_V2_MODEL_RUNNER": "0"}


def test_an_unset_kv_cache_is_the_cpu_default_on_cpu_and_the_utilization_on_gpu():
    assert kv_cache_bytes(None, on_gpu=False) == int(CPU_KV_CACHE_GB * GIB)
    assert kv_cache_bytes(None, on_gpu=True) is None  # vLLM sizes it from gpu_memory_utilization
    assert kv_cache_bytes(2.0, on_gpu=True) == kv_cache_bytes(2.0, on_gpu=False) == 2 * GIB
    assert kv_cache_bytes(0.0, on_gpu=True) is None
    with pytest.raises(ValueError, match="rollout.vllm.kv_cache_gb=0"):
        kv_cache_bytes(0.0, on_gpu=False)


def test_the_engines_memory_arguments_follow_the_resolution():
    gpu = memory_kwargs(None, 0.85, 0, on_gpu=True)
    assert gpu == {"gpu_memory_utilization": 0.85}  # nothing overrides the utilization
    assert memory_kwargs(None, 0.85, 4096, on_gpu=False) == {
        "gpu_memory_utilization": 0.85, "kv_cache_memory_bytes": GIB, "max_model_len": 4096}
    assert memory_kwargs(3.0, 0.85, 0, on_gpu=True)["kv_cache_memory_bytes"] == 3 * GIB


GPU_ENGINE = ["model.path=builtin:qwen3-0.6b-shape?vocab=151936", "marl.workflow=single_agent",
              "marl.sharing=shared", "rollout.engines_per_role=1", "rollout.engine_num_gpus=1",
              "learner.ranks=1", "learner.rank_num_gpus=1", "learner.backend=deepspeed",
              "rollout.vllm.gpu_memory_utilization=0.5",
              "ray.gpu_memory_gb=80", "learner.gradient_checkpointing=true"]


def _engine_share(*overrides: str) -> float:
    cfg = load_config("jobs/configs/tiny.yaml", [*GPU_ENGINE, *overrides])
    return next(m.peak for m in make_plan(run_layout(cfg), times=False).members if m.engine is not None)


def test_the_planner_sizes_an_engine_as_the_engine_sizes_itself():
    assert load_config("jobs/configs/tiny.yaml").rollout.vllm.kv_cache_gb is None  # auto by default
    assert _engine_share() == pytest.approx(0.5 * 80 * GIB)  # unset: the utilization's share of the GPU
    weights = 2.0 * 0.6e9  # bf16 weights of the 0.6B shape, about
    share = _engine_share("rollout.vllm.kv_cache_gb=4")  # set: the KV cache vLLM reserves, weights, reserve
    assert share == pytest.approx(4 * GIB + weights + ENGINE_RESERVE, rel=0.05)
