"""The config sections a learner reads, as Protocols: `LearnerSpec` carries them to the ranks, typed, and
every learner module takes the one it needs. jobs/config/schema.py's dataclasses (ModelConfig,
LearnerConfig, AlgoConfig, ...)
satisfy them, which mypy checks where a LearnerSpec is built; learners cannot import jobs, so the
contract is stated here, on the side that reads it. Also the choices of the keys whose values
only the learners interpret."""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol

from learners.choices import Schedule, ScheduleUnit
from learners.update.advantages import AdvantageEstimator
from learners.update.losses import KlEstimator, LossAggregation
from learners.update.ppo_plan import LossNormalizer, MinibatchChunks
from marl.dtypes import Dtype


class OldLogprobs(StrEnum):
    """`algo.old_logprobs`: the PPO ratio's denominator, the learner's
    recomputed log-probs or the engines'."""

    recompute = "recompute"
    rollout = "rollout"


class LoraSection(Protocol):
    enabled: bool
    rank: int
    alpha: int
    dropout: float
    target_modules: str


class ModelSection(Protocol):
    dtype: Dtype

    @property
    def lora(self) -> LoraSection: ...


class OptimSection(Protocol):
    lr: float
    warmup_steps: int
    schedule: Schedule
    min_lr_ratio: float
    weight_decay: float
    betas: list[float]
    grad_clip: float
    schedule_unit: ScheduleUnit
    warmup_start_zero: bool
    cosine_clamp: bool


class DeepSpeedSection(Protocol):
    zero_stage: int
    offload_optimizer: bool
    offload_param: bool


class DiagnosticsSection(Protocol):
    sample_rows: str


class LearnerSection(Protocol):
    backend: str
    ranks: int
    rank_num_cpus: float
    rank_num_gpus: float
    rank_resources: dict[str, float]
    torch_threads: int
    micro_batch_size: int
    gradient_checkpointing: bool | None  # None: auto (resolved in the run's layout: LearnerSpec)
    role_grad_diagnostics: bool
    logits_chunk_tokens: int
    max_tokens_per_micro_batch: int
    padding_free: bool
    update_timeout_s: float
    policy_move: bool
    lora_colocate: bool

    @property
    def optim(self) -> OptimSection: ...

    @property
    def deepspeed(self) -> DeepSpeedSection: ...

    @property
    def diagnostics(self) -> DiagnosticsSection: ...


class AlgoSection(Protocol):
    advantage: AdvantageEstimator
    group_by: list[str]
    norm_std: bool
    clip_low: float
    clip_high: float
    loss_agg: LossAggregation
    kl_coef: float
    kl_estimator: KlEstimator
    max_len: int
    max_role_drop_frac: float
    tis_cap: float
    ppo_mini_batch_size: int
    ppo_epochs: int
    old_logprobs: OldLogprobs
    skip_zero_advantage: bool
    role_balance: bool
    parallel_agent_norm: bool
    kl_anchor_roles: dict[str, float]
    dual_clip_c: float
    log_ratio_clamp: float
    minibatch_shuffle: bool
    minibatch_ranks: int
    minibatch_chunks: MinibatchChunks
    loss_normalizer: LossNormalizer
    skip_empty_optimizer_steps: bool
