"""Loading the one config schema (jobs/config/schema.py): YAML + `key=value` overrides, validated once.

`load_config` merges the YAML file and the overrides onto the schema (unknown keys and wrong types fail
in OmegaConf with the key's full path), runs the value checks (impossible values name their key), and
returns a read-only config. Each component receives only its own section. A section's own checks are
declared with it (choices as str Enums beside the registries they name, bounds in field metadata, rules
over several of its fields in its class's RULES: jobs/config/field_rules.py runs them); this module holds
the rules that span sections: CROSS_RULES, and the checks that import or read something (workflows, hooks,
guards, per-policy configs, GPU layouts).
"""

from __future__ import annotations

from typing import cast

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from jobs.config.colocation import colocate_problem
from jobs.config.field_rules import auto_rules, check_fields, check_sections, choice_problem
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
from jobs.config.schema import TrainConfig
from learners.gradients.backends import capabilities
from marl.field_rules import Rule
from marl.rewards import load_shaping
from marl.workflows import check_prompts, get_workflow, roles_of, workflow_own_options
from rollout.config import RolloutConfig
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
    """`auto` as the null of the tri-state keys (marl.field_rules.auto_bool), wherever one sits
    (marl.policies too)."""
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
    # vLLM's own settings became their section, as DeepSpeed's are learner.deepspeed.*
    **{f"rollout.{old}": f"rollout.vllm.{new}" for old, new in (
        ("kv_cache_gb", "kv_cache_gb"), ("gpu_memory_utilization", "gpu_memory_utilization"),
        ("max_model_len", "max_model_len"), ("vllm_sync_path", "sync_path"))},
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


def validate(cfg: TrainConfig) -> None:
    """Value checks OmegaConf's types cannot express: the sections' own (their fields' bounds and choices,
    their declared rules), then the rules that span sections. Raises ConfigError naming the first bad key."""
    _check_workflow(cfg)
    for check in (check_fields, check_sections, _cross_problem):
        problem = check(cfg)
        if problem:
            raise ConfigError(f"config: {problem}")
    _check_sync(cfg)
    _check_gpu_layout(cfg)
    _check_kl_anchor_roles(cfg)
    _check_role_caps(cfg)
    _check_guards(cfg)
    _check_reward_shaping(cfg)
    _check_policies(cfg)
    _check_dtype(cfg)
    _check_lora_colocate(cfg)
    _check_gpu_rules(cfg)


def _rollback_ok(cfg: TrainConfig) -> bool:
    """Rollback restores the best evaluated checkpoint: every evaluation must land on a kept checkpoint."""
    ckpt = cfg.checkpoint
    return cfg.cliff.action != "rollback" or bool(
        ckpt.every and cfg.eval_every and cfg.eval_every % ckpt.every == 0 and ckpt.keep_best >= 1)


def _minibatch_ranks(cfg: TrainConfig) -> int:
    return cfg.algo.minibatch_ranks or max(cfg.learner.ranks, 1)


# The rules that span sections (each section's own are its class's RULES), checked in this order after them
# and listed by the config reference under every key they name.
CROSS_RULES: tuple[Rule[TrainConfig], ...] = (
    # A row may be algo.max_len tokens long and a micro-batch holds at least one whole row.
    Rule(("learner.max_tokens_per_micro_batch", "algo.max_len"),
         "learner.max_tokens_per_micro_batch must be 0 (off) or >= algo.max_len",
         lambda c: not c.learner.max_tokens_per_micro_batch
         or c.learner.max_tokens_per_micro_batch >= c.algo.max_len,
         lambda c: f"{c.learner.max_tokens_per_micro_batch} < {c.algo.max_len}"),
    # A row within both caps must fit whole: a shorter max_len would cut responses the caps admit.
    Rule(("algo.max_len", "rollout.max_prompt_tokens"), "algo.max_len must be >= rollout.max_prompt_tokens + "
         "the largest response cap (rollout.sampling.max_new_tokens, rollout.role_max_new_tokens)",
         lambda c: not c.rollout.max_prompt_tokens
         or c.algo.max_len >= c.rollout.max_prompt_tokens + max_response_tokens(c.rollout),
         lambda c: f"{c.algo.max_len} < {c.rollout.max_prompt_tokens} + {max_response_tokens(c.rollout)}"),
    Rule(("cliff.action", "checkpoint.every", "eval_every", "checkpoint.keep_best"),
         "cliff.action=rollback needs checkpoint.every > 0, eval_every a multiple of it and "
         "checkpoint.keep_best >= 1", _rollback_ok,
         lambda c: f"checkpoint.every={c.checkpoint.every}, eval_every={c.eval_every}, "
                   f"checkpoint.keep_best={c.checkpoint.keep_best}"),
    # The rows were sampled by the engine one weight version behind; a ratio against the learner's own
    # recomputed logprobs would not correct for that.
    Rule(("rollout.one_step_off_policy", "algo.old_logprobs", "algo.tis_cap"),
         "rollout.one_step_off_policy=true needs algo.old_logprobs=rollout or algo.tis_cap > 0",
         lambda c: not c.rollout.one_step_off_policy or c.algo.old_logprobs == "rollout"
         or c.algo.tis_cap > 0,
         lambda c: f"algo.old_logprobs={c.algo.old_logprobs}, algo.tis_cap={c.algo.tis_cap}"),
    Rule(("model.dtype", "learner.backend"), "model.dtype=float16 needs a backend that trains in float16 "
         "(learner.backend)",
         lambda c: c.model.dtype != "float16" or capabilities(c.learner.backend).float16,
         message=lambda c, _: f"model.dtype=float16 needs a backend that trains in float16; learner.backend="
                              f"{c.learner.backend} does not: use bfloat16 or float32"),
    Rule(("algo.minibatch_chunks", "algo.ppo_mini_batch_size", "algo.minibatch_ranks", "learner.ranks"),
         "algo.minibatch_chunks=fixed cuts algo.ppo_mini_batch_size rows over the ranks "
         "(algo.minibatch_ranks, else learner.ranks): it must be a multiple of them",
         lambda c: c.algo.minibatch_chunks != "fixed"
         or c.algo.ppo_mini_batch_size % _minibatch_ranks(c) == 0,
         lambda c: f"{c.algo.ppo_mini_batch_size} rows over {_minibatch_ranks(c)} ranks"),
    Rule(("rollout.lora_serving", "model.lora.enabled"), "rollout.lora_serving=multi serves LoRA adapters; "
         "set model.lora.enabled=true",
         lambda c: c.rollout.lora_serving != "multi" or c.model.lora.enabled),
)


def _cross_problem(cfg: TrainConfig) -> str | None:
    return next((p for rule in CROSS_RULES if (p := rule.problem(cfg, "")) is not None), None)


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


def _check_kl_anchor_roles(cfg: TrainConfig) -> None:
    roles = roles_of(cfg.marl.workflow)
    for role in cfg.algo.kl_anchor_roles:
        if role not in roles:
            raise ConfigError(
                f"config: algo.kl_anchor_roles.{role}: {cfg.marl.workflow} has no role {role!r}; "
                f"roles: {', '.join(roles)}"
            )


def _check_sync(cfg: TrainConfig) -> None:
    """The weight sync's transport against the layout, the machine and the engines that receive it."""
    backend = cfg.rollout.backend
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
