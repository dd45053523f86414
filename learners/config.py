"""The learner's config sections, declared beside the code that reads them: `model` (what a learner loads:
dtype, LoRA), `learner` (its backend, ranks, micro-batches, optimizer, DeepSpeed, diagnostics) and `algo`
(the update rule). Each is a plain dataclass with its bounds in field metadata (marl/field_rules.py), its
derived properties, and its single-section rules in `RULES`; jobs/config/schema.py composes them into the one
config, config load checks them and the config reference lists them. A `LearnerSpec` carries them to the
ranks as instances of these classes (`as_section`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, TypeVar, cast

from omegaconf import MISSING, DictConfig, OmegaConf

from learners.choices import Schedule, ScheduleUnit
from learners.gradients.backends import BACKENDS
from learners.update.advantages import GROUP_FIELDS, GROUP_PRESETS, AdvantageEstimator, SingletonAdvantage
from learners.update.balance import MinibatchOrder
from learners.update.losses import KlEstimator, LossAggregation
from learners.update.ppo_plan import LossNormalizer, MinibatchChunks
from marl.dtypes import Dtype
from marl.field_rules import Rule, auto_bool, count_or, interval, non_negative, positive

T = TypeVar("T")


class OldLogprobs(StrEnum):
    """`algo.old_logprobs`: the PPO ratio's denominator, the learner's
    recomputed log-probs or the engines'."""

    recompute = "recompute"
    rollout = "rollout"


def as_section(section: object, cls: type[T]) -> T:
    """`section` as an instance of its class `cls` (a loaded config's section is a read-only DictConfig
    shaped by it): what crosses to the ranks, with the class's derived properties."""
    if isinstance(section, cls):
        return section
    return cast(T, OmegaConf.to_object(cast(DictConfig, section)))


# Arguments of `apply_chat_template` itself (and the template's own `messages`): the engines set these, so
# model.chat_template_kwargs holds template variables only (enable_thinking, ...).
_CHAT_TEMPLATE_ARGS = (
    "conversation",
    "messages",
    "tools",
    "documents",
    "chat_template",
    "add_generation_prompt",
    "continue_final_message",
    "tokenize",
    "padding",
    "truncation",
    "max_length",
    "return_tensors",
    "return_dict",
    "return_assistant_tokens_mask",
    "tokenizer_kwargs",
)



@dataclass
class LoraConfig:
    enabled: bool = False
    rank: int = positive(64)
    alpha: int = positive(32)
    dropout: float = 0.0
    target_modules: str = "all-linear"



@dataclass
class ModelConfig:
    # An HF model folder, or `builtin:tiny` / `builtin:smollm2-135m-instruct` (built offline, cached).
    path: str = MISSING
    # float32 | bfloat16 | float16: what the engines serve and sync. bfloat16 on a GPU-less part
    # (jobs/config/precision.py) needs a CPU with bf16 instructions (avx512_bf16 or amx_bf16); there the torch
    # learner keeps fp32 master weights and optimizer state and computes under bf16 autocast.
    dtype: Dtype = Dtype.float32
    # Allow bfloat16 on CPU parts whose CPU lacks bf16 instructions: PyTorch and vLLM then run it in software,
    # correct but slower than float32 (for checking bf16 numerics on any machine). Top level only.
    allow_emulated_bf16: bool = False
    lora: LoraConfig = field(default_factory=LoraConfig)
    # Extra variables of the tokenizer's chat template, for every engine's prompt rendering (the learner
    # trains on the token ids the engine rendered), e.g. {enable_thinking: false}: Qwen3 with thinking off.
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)

    RULES: ClassVar[tuple[Rule[ModelConfig], ...]] = (
        Rule(("chat_template_kwargs",), "{p}chat_template_kwargs takes chat template variables only (e.g. "
             "enable_thinking), no argument the engines set themselves ("
             + ", ".join(_CHAT_TEMPLATE_ARGS) + ")",
             lambda m: not set(m.chat_template_kwargs) & set(_CHAT_TEMPLATE_ARGS),
             message=lambda m, p: next(
                 f"{p}chat_template_kwargs.{k} is an argument the engines set themselves; this mapping takes "
                 "chat template variables only (e.g. enable_thinking)"
                 for k in m.chat_template_kwargs if k in _CHAT_TEMPLATE_ARGS)),
    )



@dataclass
class OptimConfig:
    lr: float = positive(2e-5)
    warmup_steps: int = non_negative(15)
    schedule: Schedule = Schedule.cosine  # cosine | constant
    min_lr_ratio: float = interval(0.0, 0, 1)
    weight_decay: float = non_negative(0.0)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    grad_clip: float = non_negative(1.0)
    # What warmup_steps and the cosine decay count: step = training steps (every policy's schedule advances
    # once per step, whatever its optimizer steps); optimizer_step = each optimizer step advances it, over the
    # same total (a policy taking K mini-batches per step runs its schedule K times faster); update_call = one
    # scheduler driven by every policy's update call, as verl steps its scheduler once per update_actor call
    # and the paper's stack calls update_actor once per role under isolated policies [R], from one actor [I]:
    # with P policies, policy p (its position in the policy map; the stack's order is its roles' first rows in
    # the step's batch) updates at training step t with the schedule at t·P + p, so each schedule runs P times
    # faster (isolated orch_workers: 3x; shared: 1x, the same as step).
    schedule_unit: ScheduleUnit = ScheduleUnit.step
    # true: verl's warmup, lr 0 at step 0 rising linearly to the full lr at step warmup_steps
    # (torch_functional.get_cosine_schedule_with_warmup, init_lr_ratio 0: factor s / warmup); false: step 0
    # already trains at lr / warmup_steps and the full lr comes at step warmup_steps - 1.
    warmup_start_zero: bool = False
    # true: the cosine reaches min_lr_ratio at the run's last step and stays there. false: verl's cosine,
    # decaying over steps - warmup_steps (min_lr_ratio one step past the last) and not clamped, so a schedule
    # run past its end (schedule_unit=optimizer_step or update_call) climbs back towards the full lr, reaching
    # it again at warmup + 2·(steps - warmup): one candidate explanation for late isolated-policy cliffs [I].
    cosine_clamp: bool = True

    RULES: ClassVar[tuple[Rule[OptimConfig], ...]] = (
        Rule(("betas",), "{p}betas must be two values in [0, 1)",
             lambda o: len(o.betas) == 2 and all(0 <= b < 1 for b in o.betas), lambda o: str(list(o.betas))),
    )



@dataclass
class DeepSpeedConfig:
    # learner.backend=deepspeed only. ZeRO stage 2 (gradients and optimizer states partitioned) or 3 (weights
    # too); offloading moves optimizer states (and, stage 3 only, weights) to CPU memory.
    zero_stage: int = 2
    offload_optimizer: bool = False
    offload_param: bool = False

    RULES: ClassVar[tuple[Rule[DeepSpeedConfig], ...]] = (
        Rule(("zero_stage",), "{p}zero_stage must be 2 or 3", lambda d: d.zero_stage in (2, 3),
             lambda d: str(d.zero_stage)),
        Rule(("offload_param", "zero_stage"), "{p}offload_param needs {p}zero_stage=3",
             lambda d: not d.offload_param or d.zero_stage == 3),
    )



@dataclass
class DiagnosticsConfig:
    # The update's no-grad diagnostics: the per-role entropy and engine gap of rows skipped for a zero
    # advantage (one forward over them) and update/policy_move (one forward over the trained rows once the
    # weights moved) each measure a seeded sample of at most this many rows per policy and step, stratified
    # per role (every role gets at least one row), weighted so that their means stay unbiased estimates of
    # the all-rows value (learners/diagnostic_sample.py); update/diag_rows/<policy> and
    # update/policy_move_rows/<policy> count the rows measured. `all` = every row (each forward over all of
    # them); 0 = off (no such forward: entropy and engine gap cover the trained rows only, no policy
    # movement). They never change the weights.
    sample_rows: str = count_or("8", ("all",))



@dataclass
class LearnerConfig:
    backend: str = BACKENDS.field("torch")  # torch | deepspeed, or a module path declaring BACKEND
    ranks: int = non_negative(0)  # data-parallel ranks per policy; 0 = one in-process learner
    rank_num_cpus: float = non_negative(0.5)
    # per learner rank; its placement-group bundle holds exactly this
    rank_num_gpus: float = non_negative(0.0)
    rank_resources: dict[str, float] = field(default_factory=dict)  # custom Ray resources per learner rank
    # per actor; 0 = its CPUs (engine_num_cpus / rank_num_cpus, floored, >= 1)
    torch_threads: int = non_negative(0)
    micro_batch_size: int = positive(16)
    # auto (null) | true | false. auto: on when the planner (jobs/plan/planner.py) finds the learner's
    # activations at its token budget would not fit its GPU without it; resolved into the run's layout
    # (RunLayout.checkpointing), off on CPU-only runs, where nothing is planned. Recomputing each layer in the
    # backward costs one more forward pass.
    gradient_checkpointing: bool | None = auto_bool()
    # Per-role gradient norms, shares and cosines: one extra [roles x params] buffer and one backward per
    # role's rows (no extra forward); turn off for very large full fine-tuning.
    role_grad_diagnostics: bool = True
    # Log-probs and entropy go through the LM head this many loss positions at a time
    # (learners/compute/logprob_head.py), so no [rows, length, vocabulary] tensor exists: with Qwen3's
    # 151,936-token vocabulary a [512, V] fp32 chunk is 0.31 GB and forward holds two (where 4 x 1,024 tokens
    # unchunked peaked at 9.8 GB). Backward recomputes each chunk's logits (one more head matmul). 0 = the
    # model's own full logits (for comparison).
    logits_chunk_tokens: int = non_negative(512)
    # Micro-batches by token budget: rows are packed longest first into micro-batches of at most this
    # many tokens (rows x widest row, padding included: what memory sees), balanced, so memory is
    # planned from tokens, never from a row count (learners/update/micro_batches.py); it must hold
    # algo.max_len. 0 = micro_batch_size rows.
    max_tokens_per_micro_batch: int = non_negative(0)
    # A micro-batch's rows end to end in one row, position ids restarting per row, no padding
    # computed (learners/compute/padding_free.py): flash-attention 2 (loaded for it on a GPU with
    # flash_attn) runs it as varlen;
    # other attentions are exact but mask an [N, N] block, so it saves no memory
    # there. Needs logits_chunk_tokens.
    padding_free: bool = False
    update_timeout_s: float = positive(1800.0)
    # A run of this many consecutive optimizer steps of one policy that did not apply (an inf or NaN
    # gradient norm: DeepSpeed's "OVERFLOW! Skipping step", or the torch backend's own skip) stops the run
    # with an error naming the policy (exit 4), after the step's metrics are logged; every such step is
    # counted in update/skipped_steps/<policy> and update/nonfinite_steps/<policy> either way. 0 = never stop.
    max_consecutive_skipped_steps: int = non_negative(5)
    # Policies update at once (true), one after another (false), or auto (null): at once unless CPU learners
    # would need more threads than the node has cores (jobs/driver/updates.py).
    concurrent_updates: bool | None = auto_bool()
    optim: OptimConfig = field(default_factory=OptimConfig)
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)
    # update/policy_move/<policy>: mean |Δ log-prob| per response token of a step's rows, after the update
    # against before it (learners/policy_move.py): one extra no-grad forward over the step's rows.
    policy_move: bool = True
    diagnostics: DiagnosticsConfig = field(default_factory=DiagnosticsConfig)
    # Isolated LoRA policies colocated on one base (learners/gradients/colocated.py): one learner group holds
    # the base model once and every policy's adapter, each with its own optimizer, LR schedule and gradients,
    # where separate learners hold R copies of the base (8 GB each for a 4B model in bf16). Results equal
    # separate learners'; the policies' updates run in turn on the shared ranks. Needs model.lora.enabled,
    # marl.sharing=isolated and the torch backend or DeepSpeed ZeRO-2 (one engine per policy; ZeRO-3
    # partitions the shared base); every policy shares the base and the ranks (jobs/config/colocation.py:
    # colocate_problem).
    lora_colocate: bool = False

    RULES: ClassVar[tuple[Rule[LearnerConfig], ...]] = (
        # Packed rows are read at their loss positions through the chunked head; the full logits path pads.
        Rule(("padding_free", "logits_chunk_tokens"), "{p}padding_free=true needs {p}logits_chunk_tokens > 0",
             lambda s: not s.padding_free or s.logits_chunk_tokens > 0),
        Rule(("rank_num_gpus", "backend"), "{p}rank_num_gpus > 0 needs a backend that trains on GPUs "
             "(its capabilities: learners/gradients/backends.py)",
             lambda s: not s.rank_num_gpus > 0 or _trains_on_gpus(s.backend),
             message=lambda s, p: f"{p}rank_num_gpus > 0 needs a backend that trains on GPUs "
                                  f"({_gpu_backends(p)}); {p}backend={s.backend} trains on CPU"),
    )



@dataclass
class AlgoConfig:
    advantage: AdvantageEstimator = AdvantageEstimator.grpo  # grpo | rloo
    # GRPO groups: fields of the key (task, agent, role, round) or one preset alone: [paper] (per prompt, one
    # group per voting generator slot, one pooled `worker` group, one per eval_opt role across rounds).
    group_by: list[str] = field(default_factory=lambda: ["task", "agent"])
    norm_std: bool = True
    # A GRPO group of one member (an orch_workers group left with one worker, a prompt with one
    # sample): zero = no advantage (nothing to compare with); reward = verl's GRPO, which takes its
    # mean as 0 and its std as 1, so
    # A = r / (1 + 1e-6) (A = r without norm_std). grpo only.
    singleton_advantage: SingletonAdvantage = SingletonAdvantage.zero
    clip_low: float = interval(0.2, 0, 1, open_high=True)
    clip_high: float = non_negative(0.28)
    loss_agg: LossAggregation = LossAggregation.token_mean  # token_mean | seq_mean_token_mean
    kl_coef: float = non_negative(0.0)
    kl_estimator: KlEstimator = KlEstimator.k3
    # training row cap (prompt + response); a longer row loses its response's tail
    max_len: int = positive(2048)
    # A role that loses more than this fraction of its rows to the length caps in one step stops the run
    # (learners.batch.RoleDropError) instead of training on the other roles alone; 1 = never stop.
    max_role_drop_frac: float = interval(0.05, 0, 1)
    tis_cap: float = non_negative(0.0)  # truncated importance-sampling correction cap; 0 = off
    # PPO mini-batches (verl semantics, learners/update/ppo_plan.py): a policy's rows of one step are
    # shuffled (seeded) and split into mini-batches of this many rows (samples), each one optimizer
    # step, for ppo_epochs passes.
    # Each isolated policy splits its own rows, so a role with K parallel agents takes K times the steps.
    # 0 = the whole batch is one mini-batch (one optimizer step per epoch).
    ppo_mini_batch_size: int = non_negative(0)
    ppo_epochs: int = positive(1)
    # The PPO ratio's denominator: recompute = one no-grad pass of the learner before the first optimizer step
    # (the policy that is being improved); rollout = the engines' sampled logprobs (the behaviour policy).
    old_logprobs: OldLogprobs = OldLogprobs.recompute
    # Without a KL term a zero-advantage row has zero gradient and is skipped before the forward
    # pass (the update is the same). false: every row goes through the learner, a fixed amount
    # of work per step (benchmarks).
    skip_zero_advantage: bool = True
    # Mitigations (each ablatable): equal weight per role's mean loss (shared policies); divide a role's loss
    # by its number of parallel agent instances, and count its rows once in the mini-batch size, so a role of
    # K parallel agents takes the optimizer steps of one (isolated policies too: learners/update/ppo_plan.py).
    role_balance: bool = False
    parallel_agent_norm: bool = False
    # Per-role KL anchor: role -> extra KL coefficient toward the reference on that role's tokens only
    # (on top of kl_coef), to hold back one drifting role without slowing the others. {} = off.
    kl_anchor_roles: dict[str, float] = field(default_factory=dict)
    # verl 0.6.1's update details (the paper's stack), each off by default. dual_clip_c: dual-clip PPO for
    # negative advantages, the loss of a token with A < 0 capped at -A·c however far its ratio runs above c
    # (verl core_algos.compute_policy_loss_vanilla, clip_ratio_c, 3.0 by default there; must be > 1). 0 = off.
    dual_clip_c: float = 0.0
    # Clamp of log(π/π_old) to [-c, c] before exp, against overflow on rows far off-policy (verl clamps the
    # same negative_approx_kl at ±20). 0 = off.
    log_ratio_clamp: float = non_negative(0.0)
    # true: each rank shuffles its rows (seeded per step, rank and epoch) before
    # cutting them into mini-batches.
    # false: verl's in-order split (dp_actor.update_policy: data.split(ppo_mini_batch_size), no
    # shuffle), the rows in the order the batch holds them (episodes in order, turns in order);
    # the chunk sizes are the same.
    minibatch_shuffle: bool = True
    # The rows' order before the per-policy split. given: the episodes' (episodes in order, turns in order).
    # verl_balanced: verl's _balance_batch over the whole step's batch (trainer.balance_batch, the
    # paper's stack): rows partitioned over minibatch_ranks ranks by workload 24576·L + L²
    # (Karmarkar–Karp), each part sorted light-heavy-light, parts in rank order
    # (learners/update/balance.py); with the in-order split (minibatch_shuffle false, required)
    # mini-batches are length-stratified, and which roles share an optimizer step changes.
    minibatch_order: MinibatchOrder = MinibatchOrder.given
    # The data-parallel ranks W the rows are balanced over and cut into mini-batches as (each a contiguous
    # shard split on its own, mini-batch k the union of their chunk k), whatever the learner's own ranks: the
    # paper's stack ran W = 2 (2 GPUs). 0 = learner.ranks.
    minibatch_ranks: int = non_negative(0)
    # even: ceil(B / M) mini-batches of even size. fixed: verl's data.split, per rank chunks of M / W rows and
    # a remainder (M a multiple of W), so a batch that is not a multiple of M ends with a partial mini-batch.
    minibatch_chunks: MinibatchChunks = MinibatchChunks.even
    # actual: a mini-batch's loss divided by its own rows (seq_mean_token_mean) or tokens. nominal: by M
    # rows, as verl scales each micro-batch's loss by rows / ppo_mini_batch_size, so a partial
    # mini-batch is down-weighted (needs loss_agg=seq_mean_token_mean and ppo_mini_batch_size > 0).
    # Equal when B is a multiple of M.
    loss_normalizer: LossNormalizer = LossNormalizer.actual
    # Skip an optimizer step (and an optimizer-step schedule's advance; a per-training-step schedule advances
    # as always) whose mini-batch has no row with a non-zero advantage on any rank, and no KL term: its
    # gradient is zero, yet AdamW would still move the weights on its momentum. Counted in
    # update/skipped_steps/<policy>.
    skip_empty_optimizer_steps: bool = False

    @property
    def uses_kl(self) -> bool:
        """A KL term on some role's tokens (kl_coef, or a role's anchor): the reference model is needed."""
        return self.kl_coef > 0 or any(v > 0 for v in self.kl_anchor_roles.values())

    RULES: ClassVar[tuple[Rule[AlgoConfig], ...]] = (
        Rule(("group_by",), f"{{p}}group_by takes a non-empty subset of {tuple(GROUP_FIELDS)} or one "
             f"preset of {tuple(GROUP_PRESETS)} alone", lambda a: _groups_ok(list(a.group_by)),
             lambda a: str(list(a.group_by))),
        Rule(("kl_anchor_roles",), "{p}kl_anchor_roles.<role> must be >= 0",
             lambda a: all(v >= 0 for v in a.kl_anchor_roles.values()),
             message=lambda a, p: next(f"{p}kl_anchor_roles.{role} must be >= 0; got {v!r}"
                                       for role, v in a.kl_anchor_roles.items() if not v >= 0)),
        # verl asserts clip_ratio_c > 1: the dual-clip bound lies above the ratio's upper clip.
        Rule(("dual_clip_c",), "{p}dual_clip_c must be 0 (off) or > 1",
             lambda a: a.dual_clip_c == 0 or a.dual_clip_c > 1, lambda a: repr(a.dual_clip_c)),
        Rule(("singleton_advantage", "advantage"), "{p}singleton_advantage=reward is verl's GRPO rule: it "
             "needs {p}advantage=grpo (another estimator has no baseline for a one-member group)",
             lambda a: a.singleton_advantage != "reward" or a.advantage == "grpo",
             lambda a: str(a.advantage)),
        Rule(("minibatch_order", "minibatch_shuffle"), "{p}minibatch_order=verl_balanced orders the rows for "
             "verl's in-order split; set {p}minibatch_shuffle=false",
             lambda a: not (a.minibatch_order == "verl_balanced" and a.minibatch_shuffle)),
        Rule(("loss_normalizer", "ppo_mini_batch_size", "loss_agg"), "{p}loss_normalizer=nominal divides by "
             "{p}ppo_mini_batch_size rows: it needs {p}ppo_mini_batch_size > 0 and "
             "{p}loss_agg=seq_mean_token_mean",
             lambda a: a.loss_normalizer != "nominal"
             or (a.ppo_mini_batch_size > 0 and a.loss_agg == "seq_mean_token_mean")),
    )


def _groups_ok(group_by: list[str]) -> bool:
    fields_only = bool(group_by) and all(f in GROUP_FIELDS for f in group_by)
    return fields_only or (len(group_by) == 1 and group_by[0] in GROUP_PRESETS)


def _trains_on_gpus(backend: str) -> bool:
    from learners.gradients.backends import capabilities  # the registry imports the config's choices

    return capabilities(backend).gpus


def _gpu_backends(prefix: str) -> str:
    from learners.gradients.backends import BACKENDS

    return " or ".join(f"{prefix}backend={b}" for b in BACKENDS if _trains_on_gpus(b))
