"""The config schema: the run-level sections (data, marl, cliff, checkpoint, sync, tracking, ray and the
top-level keys), each an OmegaConf structured dataclass with defaults and the reason behind each knob, and
`TrainConfig`, which composes them with the sections declared beside their readers (learners/config.py:
model, learner, algo; rollout/config.py: rollout; marl/workflows/options.py: the workflow settings).
jobs.config loads, validates and freezes it."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, cast

from omegaconf import MISSING, DictConfig

from learners.config import AlgoConfig, LearnerConfig, ModelConfig
from marl.field_rules import Rule, at_least, interval, non_negative, positive
from marl.policy_map import Sharing
from marl.tasks import TASKS
from marl.tasks.data import CODE_SOURCES
from marl.tasks.math import AnswerFallback
from marl.tasks.rows import FILE_SUFFIXES
from marl.tasks.sandbox.limits import SandboxConfig
from marl.workflows.options import WorkflowSettings
from rollout.config import RolloutConfig

# Bounds and choices live on the fields they constrain (marl/field_rules.py), a section's rules over several
# of its fields in its `RULES`: jobs.config checks both (a bad value is an error naming its key) and the
# config reference lists them. Choices are str Enums, defined beside the registry they name or the layer that
# reads them (learners, rollout, marl); the ones below are the driver's.
# OmegaConf checks an Enum field's value at load; YAML and overrides keep the plain strings, and a member
# compares equal to its string.


def as_node(cfg: TrainConfig) -> DictConfig:
    """The loaded config as what it is at run time, a DictConfig shaped by the
    schema, for OmegaConf's own API."""
    return cast(DictConfig, cfg)


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


def _eval_source(data: DataConfig) -> str:
    """data.eval as the family reads it: "" is its own eval split."""
    return TASKS[data.task].eval_source(data.eval)


def _source_problem(data: DataConfig, prefix: str) -> str | None:
    """Code sources need data.task=code, and the code task reads only code sources (or files of code rows)."""
    specs = {"train": data.train, **({"eval": _eval_source(data)} if data.eval_size else {})}
    for key, spec in specs.items():
        is_code = spec in CODE_SOURCES
        if data.task == "code" and not (is_code or spec.endswith(FILE_SUFFIXES)):
            return (f"{prefix}{key} must be one of {', '.join(CODE_SOURCES)} or a data file when "
                    f"{prefix}task=code; got {spec!r}")
        if data.task != "code" and is_code:
            return f"{prefix}{key}={spec} is a code source; set {prefix}task=code"
    return None


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
    max_overlap: float = interval(0.0, 0, 1)
    # math only: "none" (strict, as the paper: the last \boxed{} or nothing) or "last_number" (lenient, for
    # small models: then GSM8K's "#### N", then the last number in the text)
    answer_fallback: AnswerFallback = AnswerFallback.none
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)

    RULES: ClassVar[tuple[Rule[DataConfig], ...]] = (
        Rule(("eval_full", "eval"), "{p}eval_full evaluates every row of a listing source; set "
             "{p}eval_full=false for a generated {p}eval",
             lambda d: not (d.eval_full and TASKS[d.task].generated(_eval_source(d))),
             lambda d: f"{_eval_source(d)!r}"),
        Rule(("train_size", "train"), "{p}train_size=0 takes every row of a listing source: a generated "
             "{p}train needs {p}train_size > 0",
             lambda d: not (d.train_size == 0 and TASKS[d.task].generated(d.train)),
             lambda d: f"{d.train!r}"),
        Rule(("task", "train", "eval"), f"{{p}}train and {{p}}eval (with {{p}}eval_size > 0) are code "
             f"sources ({', '.join(CODE_SOURCES)}) or data files when {{p}}task=code, and only then code "
             "sources",
             lambda d: _source_problem(d, "") is None, message=lambda d, p: _source_problem(d, p) or ""),
    )


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
    # engine_num_gpus,engine_resources,vllm.kv_cache_gb,vllm.gpu_memory_utilization}
    # (jobs/config/policies.py).
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

    RULES: ClassVar[tuple[Rule[MarlConfig], ...]] = (
        Rule(("policy_map", "sharing"), "{p}policy_map must map every role when {p}sharing=custom",
             lambda m: m.sharing != "custom" or bool(m.policy_map)),
        Rule(("policy_map", "sharing"), "{p}policy_map is only used with {p}sharing=custom",
             lambda m: m.sharing == "custom" or not m.policy_map),
    )


@dataclass
class CliffConfig:
    # A terminal cliff: held-out accuracy (every `eval_every` steps) at least `drop` below its running peak,
    # or (relative_drop > 0) at or below (1 - relative_drop) x the peak, for `window` consecutive evaluations.
    # action: warn (log and continue) | stop (end the run cleanly) | rollback (restore the best checkpoint's
    # learner state, resync engines, continue).
    drop: float = positive(0.1)
    # fraction of the peak (0.5: fell to half of it); flags low-accuracy runs; 0 = off
    relative_drop: float = interval(0.0, 0, 1)
    window: int = positive(2)
    action: CliffAction = CliffAction.warn


@dataclass
class CheckpointConfig:
    # Written every `every` steps (0 = off) and on a graceful stop, into `dir` ("" =
    # <out_dir>/<run_name>/ checkpoints); after each commit only the last `keep_last` and the `keep_best`
    # best by held-out accuracy stay.
    every: int = non_negative(0)
    dir: str = ""
    keep_last: int = at_least(2, 1)
    keep_best: int = non_negative(1)
    resume: str = "auto"  # auto (newest complete checkpoint in dir, if any) | never | a checkpoint folder
    # member failures (dead/hung learner or engine) survived by restarting from the last one
    max_failures: int = non_negative(0)

    RULES: ClassVar[tuple[Rule[CheckpointConfig], ...]] = (
        Rule(("resume",), "{p}resume must be auto, never or a checkpoint folder",
             lambda c: bool(c.resume.strip()), lambda c: repr(c.resume)),
    )


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


def _installed_when_enabled(sink: str) -> Callable[[TrackingConfig], bool]:
    """The rule of tracking.<sink>.enabled: off, or its package importable."""
    return lambda t: not getattr(t, sink).enabled or importlib.util.find_spec(sink) is not None


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

    # Optional tracking packages are imported only when enabled; a missing one fails at load, naming the key.
    RULES: ClassVar[tuple[Rule[TrackingConfig], ...]] = tuple(
        Rule((f"{sink}.enabled",), f"{{p}}{sink}.enabled=true needs the `{sink}` package, which is not "
             "installed (pip install -e '.[tracking]')", _installed_when_enabled(sink))
        for sink in ("mlflow", "wandb"))


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
