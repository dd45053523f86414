"""Loading the one config schema (jobs/config/schema.py): YAML + `key=value` overrides, validated once.

`load_config` merges the YAML file and the overrides onto the schema (unknown keys and wrong types fail
in OmegaConf with the key's full path), runs the value checks below (impossible values name their key),
and returns a read-only config. Each component receives only its own section. Choices are str Enums on
the schema's fields (defined beside the registries they name: advantage estimators, loss aggregations,
KL estimators, backends), bounds sit in the fields' metadata (jobs/config/field_rules.py); GRPO group
fields are read from their registry.
"""

from __future__ import annotations

import importlib.util
from typing import cast

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from jobs.config.colocation import colocate_problem
from jobs.config.field_rules import auto_rules, check_fields, choice_problem
from jobs.config.gpu_layout import layout_problem, transport_problem
from jobs.config.gpu_rules import gpu_problem
from jobs.config.guards import guards_problem
from jobs.config.policies import (
    ENGINE_KEYS,
    POLICY_KEYS,
    override_keys,
    per_policy_key,
    policy_config,
    policy_map_of,
)
from jobs.config.precision import dtype_problem
from jobs.config.schema import AlgoConfig, RolloutConfig, TrainConfig, as_node
from learners.gradients.backends import BACKENDS, capabilities
from learners.update.advantages import GROUP_FIELDS, GROUP_PRESETS
from marl.rewards import load_shaping
from marl.tasks import TASKS
from marl.tasks.data import CODE_SOURCES
from marl.tasks.rows import FILE_SUFFIXES
from marl.workflows import check_prompts, get_workflow, roles_of, workflow_own_options
from rollout.engine import ENGINES, engine_capabilities


class ConfigError(ValueError):
    """A config problem; the message names the offending key."""


def load_config(path: str | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """Schema ← YAML ← `key=value` overrides, validated, then frozen; nothing is resolved into it (`auto`
    settings are the run layout's: jobs/plan/layout.py). Raises ConfigError naming the key."""
    try:
        cfg = OmegaConf.structured(TrainConfig)
        if path:
            cfg = OmegaConf.merge(cfg, _auto_as_null(OmegaConf.load(path)))
        if overrides:
            cfg = OmegaConf.merge(cfg, _auto_as_null(OmegaConf.from_dotlist(list(overrides))))
        missing = sorted(OmegaConf.missing_keys(cfg))
        if missing:
            raise ConfigError(f"config: missing required value for {', '.join(missing)}")
    except OmegaConfBaseException as e:
        raise ConfigError(f"config: {_omegaconf_message(e)}") from None
    except FileNotFoundError:
        raise ConfigError(f"config: file not found: {path}") from None
    validate(cfg)
    OmegaConf.set_readonly(cfg, True)
    return cast(TrainConfig, cfg)  # a DictConfig typed by the schema


def _auto_as_null(node: DictConfig | ListConfig) -> DictConfig | ListConfig:
    """`auto` as the null of the tri-state keys (schema.auto_bool), wherever one sits (marl.policies too)."""
    if isinstance(node, DictConfig):
        for key, value in node.items_ex(resolve=False):
            if isinstance(value, DictConfig):
                _auto_as_null(value)
            elif key in _AUTO_KEYS and isinstance(value, str) and value.lower() == "auto":
                node[key] = None
    return node


_AUTO_KEYS = frozenset(rule.key.rpartition(".")[2] for rule in auto_rules())


# Keys that are gone, with what replaced them: a config that still sets one is told where to go.
_REPLACED = {
    "rollout.call_timeout_s": "rollout.stall_timeout_s (engines are deadlined by token progress, not by the "
                              "length of a call)",
}


def _omegaconf_message(e: OmegaConfBaseException) -> str:
    key = getattr(e, "full_key", None)
    if key in _REPLACED:
        return f"{key} was removed; use {_REPLACED[key]}"
    choice = _choice_message(e)
    if choice:
        return choice
    first = str(e).splitlines()[0] if str(e) else type(e).__name__
    return f"{key}: {first}" if key else first


def _choice_message(e: OmegaConfBaseException) -> str | None:
    """An Enum field's refusal of a value, worded as every choice check is (`<key> must be one of ...`)."""
    key = getattr(e, "full_key", None)
    return choice_problem(key, getattr(e, "value", None)) if key else None


def to_yaml(cfg: TrainConfig) -> str:
    return OmegaConf.to_yaml(cfg, resolve=True)


_GROUP_FIELDS, _GROUP_PRESETS = tuple(GROUP_FIELDS), tuple(GROUP_PRESETS)
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


def validate(cfg: TrainConfig) -> None:
    """Value checks OmegaConf's types cannot express. Raises ConfigError naming the first bad key."""
    _check_workflow(cfg)
    problem = check_fields(cfg)  # the choices and bounds the schema's fields carry
    if problem:
        raise ConfigError(f"config: {problem}")
    _check_ranges(cfg)
    _check_lengths(cfg)
    _check_task_sources(cfg)
    _check_serving(cfg)
    _check_gpu_layout(cfg)
    _check_checkpoint(cfg)
    _check_learner_options(cfg)
    _check_verl_update_details(cfg)
    _check_data_fidelity(cfg)
    _check_tracking(cfg)
    _check_role_caps(cfg)
    _check_guards(cfg)
    _check_reward_shaping(cfg)
    _check_policies(cfg)
    _check_dtype(cfg)
    _check_lora_colocate(cfg)
    _check_gpu_rules(cfg)


def _check_gpu_rules(cfg: TrainConfig) -> None:
    try:
        policy_map = policy_map_of(cfg)
    except ValueError:  # a custom map that does not fit the workflow: _check_policies names it
        return
    problem = gpu_problem(cfg, policy_map)
    if problem:
        raise ConfigError(f"config: {problem}")


def _check_lora_colocate(cfg: TrainConfig) -> None:
    problem = colocate_problem(cfg)
    if problem:
        raise ConfigError(f"config: {problem}")


def _check_gpu_layout(cfg: TrainConfig) -> None:
    try:
        problem = layout_problem(cfg)
    except ValueError as e:  # a custom map that names the wrong roles: _check_policies words it
        raise ConfigError(f"config: {e}") from None
    if problem:
        raise ConfigError(f"config: {problem}")


def _check_dtype(cfg: TrainConfig) -> None:
    """model.dtype where the run computes, for the policies that take the top level's settings
    (a policy with settings of its own was checked with them by _check_policies, its errors
    naming marl.policies.<policy>)."""
    if all(pid in cfg.marl.policies for pid in policy_map_of(cfg).policies):
        return
    problem = dtype_problem(cfg)
    if problem:
        raise ConfigError(f"config: {problem}")


def _check_policies(cfg: TrainConfig) -> None:
    """marl.policies: only policies of the resolved map, only per-policy keys, and each policy's whole config
    (the top level with its overrides) valid; errors name `marl.policies.<policy>[.<key>]`."""
    try:
        policies = policy_map_of(cfg).policies
    except ValueError as e:
        raise ConfigError(f"config: {e}") from None
    for pid in cfg.marl.policies:
        if pid not in policies:
            raise ConfigError(
                f"config: marl.policies.{pid}: no such policy; marl.sharing={cfg.marl.sharing} with "
                f"{cfg.marl.workflow} has {', '.join(policies)}"
            )
        for key in override_keys(cfg, pid):
            if not per_policy_key(key):
                raise ConfigError(
                    f"config: marl.policies.{pid}.{key} cannot be set per policy; per-policy keys: "
                    f"{', '.join(k + ('*' if k.endswith('.') else '') for k in POLICY_KEYS)}"
                )
            if cfg.rollout.lora_serving == "multi" and key.startswith(ENGINE_KEYS):
                raise ConfigError(
                    f"config: marl.policies.{pid}.{key}: rollout.lora_serving=multi serves every "
                    "policy from one engine group on one base model"
                )
        try:
            validate(policy_config(cfg, pid))
        except OmegaConfBaseException as e:
            choice = _choice_message(e)  # worded as the policy's own validate() would
            raise ConfigError(f"config: marl.policies.{pid}" + (f": {choice}" if choice else
                                                                f".{_omegaconf_message(e)}")) from None
        except ConfigError as e:
            raise ConfigError(f"config: marl.policies.{pid}: {str(e).removeprefix('config: ')}") from None


def _check_workflow(cfg: TrainConfig) -> None:
    """A built-in name, or the user's module (imported and checked against the Workflow protocol now), its
    own options (marl.options, against its OPTIONS), and the prompt set (read and checked against the
    workflows and roles it names now)."""
    try:
        get_workflow(cfg.marl.workflow)
        workflow_own_options(cfg.marl.workflow, cfg.marl.options)
        check_prompts(cfg.marl.prompts, cfg.marl.workflow)
    except ValueError as e:
        raise ConfigError(f"config: {e}") from None


def _check_reward_shaping(cfg: TrainConfig) -> None:
    """Each hook is imported now, so a typo fails here and not at the first rollout."""
    try:
        load_shaping(cfg.marl.reward_shaping, roles_of(cfg.marl.workflow))
    except ValueError as e:
        raise ConfigError(f"config: marl.reward_shaping.{e}") from None


def _check_tracking(cfg: TrainConfig) -> None:
    """Optional tracking packages are imported only when enabled; a missing one fails here, naming the key."""
    for key, module in (("tracking.mlflow.enabled", "mlflow"), ("tracking.wandb.enabled", "wandb")):
        if OmegaConf.select(as_node(cfg), key) and importlib.util.find_spec(module) is None:
            raise ConfigError(f"config: {key}=true needs the `{module}` package, which is not installed "
                              "(pip install -e '.[tracking]')")


def _check_learner_options(cfg: TrainConfig) -> None:
    roles = roles_of(cfg.marl.workflow)
    for role, coef in cfg.algo.kl_anchor_roles.items():
        if role not in roles:
            raise ConfigError(
                f"config: algo.kl_anchor_roles.{role}: {cfg.marl.workflow} has no role {role!r}; "
                f"roles: {', '.join(roles)}"
            )
        if not coef >= 0:
            raise ConfigError(f"config: algo.kl_anchor_roles.{role} must be >= 0; got {coef!r}")
    ds = cfg.learner.deepspeed
    # what it can run is its class's (learners.gradients.backends.BackendCapabilities)
    backend = cfg.learner.backend
    if cfg.learner.rank_num_gpus > 0 and not capabilities(backend).gpus:
        on_gpus = " or ".join(b for b in BACKENDS if capabilities(b).gpus)
        raise ConfigError(f"config: learner.rank_num_gpus > 0 needs a backend that trains on GPUs "
                          f"(learner.backend={on_gpus}); learner.backend={backend} trains on CPU")
    if cfg.model.dtype == "float16" and not capabilities(backend).float16:
        raise ConfigError(f"config: model.dtype=float16 needs a backend that trains in float16; "
                          f"learner.backend={backend} does not: use bfloat16 or float32")
    if cfg.rollout.one_step_off_policy and cfg.algo.old_logprobs != "rollout" and not cfg.algo.tis_cap > 0:
        # The rows were sampled by the engine one weight version behind; a ratio against the learner's own
        # recomputed logprobs would not correct for that.
        raise ConfigError("config: rollout.one_step_off_policy=true needs algo.old_logprobs=rollout or "
                          f"algo.tis_cap > 0; got algo.old_logprobs={cfg.algo.old_logprobs}, "
                          f"algo.tis_cap={cfg.algo.tis_cap}")
    if ds.zero_stage not in (2, 3):
        raise ConfigError(f"config: learner.deepspeed.zero_stage must be 2 or 3; got {ds.zero_stage}")
    if ds.offload_param and ds.zero_stage != 3:
        raise ConfigError("config: learner.deepspeed.offload_param needs learner.deepspeed.zero_stage=3")


def _check_verl_update_details(cfg: TrainConfig) -> None:
    """The dual-clip bound lies above the ratio's upper clip (verl asserts clip_ratio_c > 1); the
    log-ratio clamp is a magnitude."""
    c = cfg.algo.dual_clip_c
    if c != 0 and not c > 1:
        raise ConfigError(f"config: algo.dual_clip_c must be 0 (off) or > 1; got {c!r}")
    if not cfg.algo.log_ratio_clamp >= 0:
        raise ConfigError(
            f"config: algo.log_ratio_clamp must be >= 0 (0 = off); got {cfg.algo.log_ratio_clamp!r}"
        )
    _check_verl_minibatches(cfg.algo, cfg.algo.minibatch_ranks or max(cfg.learner.ranks, 1))
    if cfg.algo.singleton_advantage == "reward" and cfg.algo.advantage != "grpo":
        raise ConfigError(f"config: algo.singleton_advantage=reward is verl's GRPO rule; algo.advantage="
                          f"{cfg.algo.advantage} has no baseline for a one-member group")


def _check_verl_minibatches(algo: AlgoConfig, ranks: int) -> None:
    """verl's balanced order needs its in-order split; its fixed chunks split M over the ranks; its nominal
    normaliser counts rows of a mini-batch that has a size."""
    if algo.minibatch_order == "verl_balanced" and algo.minibatch_shuffle:
        raise ConfigError(
            "config: algo.minibatch_order=verl_balanced orders the rows for verl's in-order split; "
            "set algo.minibatch_shuffle=false"
        )
    if algo.minibatch_chunks == "fixed" and algo.ppo_mini_batch_size % ranks:
        raise ConfigError(f"config: algo.minibatch_chunks=fixed cuts algo.ppo_mini_batch_size="
                          f"{algo.ppo_mini_batch_size} rows over {ranks} ranks (algo.minibatch_ranks, else "
                          f"learner.ranks): it must be a multiple of them")
    rows_only = algo.loss_agg == "seq_mean_token_mean"
    if algo.loss_normalizer == "nominal" and (algo.ppo_mini_batch_size == 0 or not rows_only):
        raise ConfigError(
            "config: algo.loss_normalizer=nominal divides by algo.ppo_mini_batch_size rows: it needs "
            "algo.ppo_mini_batch_size > 0 and algo.loss_agg=seq_mean_token_mean"
        )


def _check_data_fidelity(cfg: TrainConfig) -> None:
    """The sandbox's auto worker count and per-test time are 0 (off / auto) or positive; the whole eval split
    exists only for a listing source."""
    family = TASKS[cfg.data.task]
    if cfg.data.eval_full and family.generated(family.eval_source(cfg.data.eval)):
        raise ConfigError(f"config: data.eval_full evaluates every row of a listing source; data.eval="
                          f"{family.eval_source(cfg.data.eval)} generates tasks: set data.eval_full=false")
    for key in ("data.sandbox.workers", "data.sandbox.timeout_per_test_s"):
        if OmegaConf.select(as_node(cfg), key) < 0:
            raise ConfigError(
                f"config: {key} must be >= 0 (0 = {'auto' if key.endswith('workers') else 'off'}); "
                f"got {OmegaConf.select(as_node(cfg), key)!r}"
            )


def _check_checkpoint(cfg: TrainConfig) -> None:
    ckpt = cfg.checkpoint
    if ckpt.keep_last < 1:
        raise ConfigError(f"config: checkpoint.keep_last must be >= 1; got {ckpt.keep_last}")
    if not ckpt.resume.strip():
        raise ConfigError("config: checkpoint.resume must be auto, never or a checkpoint folder; got ''")
    if cfg.cliff.action != "rollback":
        return
    # Rollback restores the best evaluated checkpoint: every evaluation must land on a kept checkpoint.
    if not (ckpt.every and cfg.eval_every and cfg.eval_every % ckpt.every == 0 and ckpt.keep_best >= 1):
        raise ConfigError(
            "config: cliff.action=rollback needs checkpoint.every > 0, eval_every a multiple of "
            f"it and checkpoint.keep_best >= 1; got checkpoint.every={ckpt.every}, "
            f"eval_every={cfg.eval_every}, checkpoint.keep_best={ckpt.keep_best}"
        )


def _check_serving(cfg: TrainConfig) -> None:
    for key in cfg.model.chat_template_kwargs:
        if key in _CHAT_TEMPLATE_ARGS:
            raise ConfigError(
                f"config: model.chat_template_kwargs.{key} is an argument the engines set "
                "themselves; this mapping takes chat template variables only (e.g. enable_thinking)"
            )
    backend = cfg.rollout.backend  # what it can serve is its class's (rollout.engine.EngineCapabilities)
    if cfg.rollout.lora_serving == "multi":
        if not cfg.model.lora.enabled:
            raise ConfigError("config: rollout.lora_serving=multi serves LoRA adapters; "
                              "set model.lora.enabled=true")
        if not engine_capabilities(backend).multi_lora:
            raise ConfigError(f"config: rollout.lora_serving=multi needs engines that serve several LoRA "
                              f"adapters; rollout.backend={backend} does not: use "
                              "rollout.lora_serving=single")
    problem = transport_problem(cfg)  # the layout's transports (jobs/config/gpu_layout.py)
    if problem:
        raise ConfigError(f"config: {problem}")
    if cfg.sync.transport == "ipc":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("config: sync.transport=ipc needs CUDA; use object_store on this machine")
    if cfg.sync.transport == "nccl":
        if not engine_capabilities(backend).weight_channel:
            receiving = " or ".join(b for b in ENGINES if engine_capabilities(b).weight_channel)
            raise ConfigError(f"config: sync.transport=nccl needs engines that receive weights over NCCL "
                              f"(rollout.backend={receiving}); got rollout.backend={backend}")


def _check_task_sources(cfg: TrainConfig) -> None:
    """Code sources need data.task=code, and the code task reads only code sources (or files of code rows);
    a generated train source needs a size; data.max_overlap is a fraction."""
    family = TASKS[cfg.data.task]
    evals = {"data.eval": family.eval_source(cfg.data.eval)} if cfg.data.eval_size else {}
    specs = {"data.train": cfg.data.train, **evals}
    for key, spec in specs.items():
        is_code = spec in CODE_SOURCES
        if cfg.data.task == "code" and not (is_code or spec.endswith(FILE_SUFFIXES)):
            raise ConfigError(f"config: {key} must be one of {', '.join(CODE_SOURCES)} or a data file when "
                              f"data.task=code; got {spec!r}")
        if cfg.data.task != "code" and is_code:
            raise ConfigError(f"config: {key}={spec} is a code source; set data.task=code")
    if cfg.data.train_size == 0 and family.generated(cfg.data.train):
        raise ConfigError(f"config: data.train_size=0 takes every row of a listing source, but data.train="
                          f"{cfg.data.train} generates tasks: set data.train_size > 0")
    if not 0.0 <= cfg.data.max_overlap <= 1.0:
        raise ConfigError(f"config: data.max_overlap is a fraction of the eval tasks, in [0, 1]; "
                          f"got {cfg.data.max_overlap}")


def _check_ranges(cfg: TrainConfig) -> None:
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
    group_by = list(cfg.algo.group_by)
    bad = [f for f in group_by if f not in _GROUP_FIELDS]
    if (bad or not group_by) and not (len(group_by) == 1 and group_by[0] in _GROUP_PRESETS):
        raise ConfigError(
            f"config: algo.group_by takes a non-empty subset of {_GROUP_FIELDS} or one preset of "
            f"{_GROUP_PRESETS} alone; got {group_by}"
        )
    if not 0 <= cfg.cliff.relative_drop <= 1:
        raise ConfigError(
            f"config: cliff.relative_drop must be in [0, 1] (0 = off); got {cfg.cliff.relative_drop}"
        )
    if cfg.marl.sharing == "custom" and not cfg.marl.policy_map:
        raise ConfigError("config: marl.policy_map must map every role when marl.sharing=custom")
    if cfg.marl.sharing != "custom" and cfg.marl.policy_map:
        raise ConfigError("config: marl.policy_map is only used with marl.sharing=custom")
    if len(cfg.learner.optim.betas) != 2 or not all(0 <= b < 1 for b in cfg.learner.optim.betas):
        raise ConfigError(
            f"config: learner.optim.betas must be two values in [0, 1); got {cfg.learner.optim.betas}"
        )
    if not 0 <= cfg.learner.optim.min_lr_ratio <= 1:
        raise ConfigError("config: learner.optim.min_lr_ratio must be in [0, 1]")


def max_response_tokens(rollout: RolloutConfig) -> int:
    """The longest response any role may write: sampling.max_new_tokens or a larger per-role cap."""
    return max([int(rollout.sampling.max_new_tokens), *map(int, rollout.role_max_new_tokens.values())])


def _check_role_caps(cfg: TrainConfig) -> None:
    roles = roles_of(cfg.marl.workflow)
    for role, cap in cfg.rollout.role_max_new_tokens.items():
        if role not in roles:
            raise ConfigError(
                f"config: rollout.role_max_new_tokens.{role}: {cfg.marl.workflow} has no role {role!r}; "
                f"its roles: {', '.join(roles)}"
            )
        if not 0 < cap <= cfg.algo.max_len:
            raise ConfigError(f"config: rollout.role_max_new_tokens.{role} must be in (0, algo.max_len = "
                              f"{cfg.algo.max_len}]; got {cap!r}")


def _check_guards(cfg: TrainConfig) -> None:
    problem = guards_problem(cfg)
    if problem:
        raise ConfigError(f"config: {problem}")


def _check_lengths(cfg: TrainConfig) -> None:
    if not 0 <= cfg.algo.max_role_drop_frac <= 1:
        raise ConfigError(
            f"config: algo.max_role_drop_frac must be in [0, 1]; got {cfg.algo.max_role_drop_frac}"
        )
    budget = cfg.learner.max_tokens_per_micro_batch
    if budget and budget < cfg.algo.max_len:
        # A row may be algo.max_len tokens long and a micro-batch holds at least one whole row.
        raise ConfigError(
            f"config: learner.max_tokens_per_micro_batch must be 0 (off) or >= algo.max_len; got "
            f"{budget} < {cfg.algo.max_len}"
        )
    if cfg.learner.padding_free and not cfg.learner.logits_chunk_tokens:
        # Packed rows are read at their loss positions through the chunked head; the full logits path pads.
        raise ConfigError("config: learner.padding_free=true needs learner.logits_chunk_tokens > 0")
    cap, response = cfg.rollout.max_prompt_tokens, max_response_tokens(cfg.rollout)
    if cap and cfg.algo.max_len < cap + response:
        # A row within both caps must fit whole: a shorter max_len would cut responses the caps admit.
        raise ConfigError(f"config: algo.max_len must be >= rollout.max_prompt_tokens + "
                          f"rollout.sampling.max_new_tokens = {cap} + {response}; got {cfg.algo.max_len}")
