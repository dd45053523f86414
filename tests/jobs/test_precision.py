"""model.dtype=bfloat16 where the run computes on CPU: refused at config load on a CPU without bf16
instructions (naming model.dtype and the missing flags), allowed on one with them, on GPU placements, per
policy, and with model.allow_emulated_bf16."""

from __future__ import annotations

import pytest

import jobs.config.precision
from cluster.cpu import has_bf16, read_cpuinfo
from jobs.config import ConfigError, load_config
from jobs.config.precision import cpu_parts, dtype_problem
from tests.cluster.test_cpu import SAPPHIRE_RAPIDS, ZEN3

TINY = "jobs/configs/tiny.yaml"
BF16 = "model.dtype=bfloat16"
REFUSAL = (
    r"model\.dtype=bfloat16 on CPU needs avx512_bf16 or amx_bf16 in /proc/cpuinfo flags; this CPU has neither"
)
GPU_RUN = [
    "learner.backend=deepspeed",
    "learner.ranks=1",
    "learner.rank_num_gpus=0.5",
    "rollout.backend=vllm",
    "rollout.engines_per_role=1",
    "rollout.engine_num_gpus=0.25",
    "rollout.vllm.kv_cache_gb=0",
]


@pytest.fixture
def no_bf16_cpu(monkeypatch):
    monkeypatch.setattr(jobs.config.precision, "read_cpuinfo", lambda: ZEN3)


@pytest.fixture
def bf16_cpu(monkeypatch):
    monkeypatch.setattr(jobs.config.precision, "read_cpuinfo", lambda: SAPPHIRE_RAPIDS)


def test_this_machine_refuses_bf16_on_cpu_unless_its_cpu_has_the_instructions():
    if has_bf16(read_cpuinfo()):
        assert load_config(TINY, [BF16]).model.dtype == "bfloat16"
    else:
        with pytest.raises(ConfigError, match=REFUSAL):
            load_config(TINY, [BF16])


def test_the_refusal_names_the_key_the_flags_and_what_runs_on_cpu(no_bf16_cpu):
    with pytest.raises(ConfigError) as e:
        load_config(TINY, [BF16])
    assert str(e.value) == (
        "config: model.dtype=bfloat16 on CPU needs avx512_bf16 or amx_bf16 in /proc/cpuinfo flags; this CPU "
        "has "
        "neither: use float32 (on CPU here: the learner (learner.backend=torch), the engines "
        "(rollout.backend=hf)), "
        "or set model.allow_emulated_bf16=true to run bf16 in software (slow; for numerics checks)"
    )


def test_a_cpu_with_bf16_instructions_and_the_explicit_override_load(bf16_cpu):
    assert load_config(TINY, [BF16]).model.dtype == "bfloat16"


def test_emulated_bf16_is_an_explicit_choice(no_bf16_cpu):
    cfg = load_config(TINY, [BF16, "model.allow_emulated_bf16=true"])
    assert cfg.model.dtype == "bfloat16" and cfg.model.allow_emulated_bf16
    assert load_config(TINY, ["model.dtype=float32"]).model.allow_emulated_bf16 is False


def test_only_cpu_placement_is_refused(no_bf16_cpu):
    assert load_config(TINY, [BF16, *GPU_RUN]).model.dtype == "bfloat16"  # every part on a GPU
    with pytest.raises(ConfigError, match=r"on CPU here: the engines \(rollout.engine_num_gpus=0\)\)"):
        load_config(TINY, [BF16, *GPU_RUN, "rollout.engine_num_gpus=0"])
    with pytest.raises(ConfigError, match=r"on CPU here: the learner \(learner.rank_num_gpus=0\)\)"):
        load_config(TINY, [BF16, *GPU_RUN, "learner.rank_num_gpus=0"])


def test_in_process_members_compute_where_the_driver_does(bf16_cpu):
    in_process = [*GPU_RUN, "learner.ranks=0", "rollout.engines_per_role=0"]
    cfg = load_config(TINY, in_process)
    assert cpu_parts(cfg, cuda=lambda: True) == []
    assert cpu_parts(cfg, cuda=lambda: False) == ["the learner (learner.rank_num_gpus=0)",
                                                  "the engines (rollout.engine_num_gpus=0)"]
    bf16 = load_config(TINY, [*in_process, BF16])
    assert dtype_problem(bf16, cpuinfo=ZEN3, cuda=lambda: True) is None
    assert dtype_problem(bf16, cpuinfo=ZEN3, cuda=lambda: False).startswith("model.dtype=bfloat16 on CPU")
    assert dtype_problem(bf16, cpuinfo=SAPPHIRE_RAPIDS, cuda=lambda: False) is None
    assert dtype_problem(cfg, cpuinfo=ZEN3, cuda=lambda: False) is None  # float32


def test_a_policys_own_dtype_is_checked_with_its_own_placement(no_bf16_cpu):
    with pytest.raises(ConfigError, match=rf"^config: marl\.policies\.aggregator: {REFUSAL}"):
        load_config(TINY, ["marl.policies.aggregator.model.dtype=bfloat16"])
    # bf16 on the policy whose parts are on GPUs; the top level's float32 for the other one on CPU
    on_gpu = [f"marl.policies.aggregator.{k}" for k in ("model.dtype=bfloat16", "learner.rank_num_gpus=0.5",
                                                        "rollout.engine_num_gpus=0.25")]
    cfg = load_config(TINY, [*GPU_RUN, "learner.rank_num_gpus=0", "rollout.engine_num_gpus=0", *on_gpu])
    assert cfg.marl.policies.aggregator.model.dtype == "bfloat16"
    # a top-level bf16 that every policy replaces is nobody's dtype
    every = [f"marl.policies.{p}.model.dtype=float32" for p in ("generator", "aggregator")]
    assert load_config(TINY, [BF16, *every]).model.dtype == "bfloat16"

