"""Per-policy settings (`marl.policies`): a policy's own model, optimizer, micro-batch size, ranks and
resources over the top-level sections it otherwise inherits.

`marl.policies.<policy>` holds overrides shaped like the top-level sections (`model.path`, `learner.optim.lr`,
`rollout.engine_num_gpus`, ...) for a policy of the resolved policy map, whatever `marl.sharing` produced it.
`policy_config(cfg, policy)` is the whole config as that policy sees it; each component of the policy (its
learner group, its engine groups, their placement bundles) is built from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

from omegaconf import DictConfig, OmegaConf

from jobs.config.schema import TrainConfig, as_node
from marl.engine_map import EngineMap
from marl.policy_map import PolicyMap
from marl.workflows import roles_of

# What a policy may set for itself: these keys and everything under the ones ending in `.`.
POLICY_KEYS = (
    "model.path",
    "model.dtype",
    "model.lora.",
    "model.chat_template_kwargs.",
    "learner.optim.",
    "learner.micro_batch_size",
    "learner.ranks",
    "learner.rank_num_cpus",
    "learner.rank_num_gpus",
    "learner.rank_resources.",
    "learner.gradient_checkpointing",
    # A policy on another model has another vocabulary and row lengths: its own head chunks and token budget.
    "learner.logits_chunk_tokens",
    "learner.max_tokens_per_micro_batch",
    "learner.padding_free",
    "rollout.engines_per_role",
    "rollout.engine_num_cpus",
    "rollout.engine_num_gpus",
    "rollout.engine_resources.",
    "rollout.vllm.kv_cache_gb",
    "rollout.vllm.gpu_memory_utilization",
)
# Under multi-LoRA serving one engine group serves every policy as an adapter on one base model.
ENGINE_KEYS = ("model.path", "model.dtype", "model.lora.enabled", "model.chat_template_kwargs.", "rollout.")


def policy_map_of(cfg: TrainConfig) -> PolicyMap:
    """The run's role -> policy map (ValueError on a custom map that does not name exactly the roles)."""
    custom = OmegaConf.to_container(cfg.marl.policy_map)
    roles = list(roles_of(cfg.marl.workflow))
    return PolicyMap.build(cfg.marl.sharing, roles, custom)  # type: ignore[arg-type]


def engine_map_of(cfg: TrainConfig, policy_map: PolicyMap) -> EngineMap:
    """The run's role -> engine group map, with every group's name
    (rollout.engine_scope, rollout.lora_serving)."""
    node = as_node(cfg)
    return EngineMap.build(
        policy_map,
        cfg.run_name,
        OmegaConf.select(node, "rollout.engine_scope", default="role"),
        OmegaConf.select(node, "rollout.lora_serving", default="single") == "multi",
    )


def override_keys(cfg: TrainConfig, policy_id: str) -> list[str]:
    """The dotted keys policy `policy_id` sets for itself (leaves; a mapping value counts as its leaves)."""
    over = cfg.marl.policies.get(policy_id)
    return _leaves(OmegaConf.to_container(over)) if over is not None else []


def _leaves(tree: object, prefix: str = "") -> list[str]:
    if not isinstance(tree, Mapping) or not tree:
        return [prefix.rstrip(".")]
    return [leaf for k, v in tree.items() for leaf in _leaves(v, f"{prefix}{k}.")]


def per_policy_key(key: str) -> bool:
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in POLICY_KEYS)


def policy_config(cfg: TrainConfig, policy_id: str) -> TrainConfig:
    """The whole config with `marl.policies.<policy_id>` merged over it (and no `marl.policies` of its own);
    `cfg` itself for a policy without overrides. Read-only like `cfg`. OmegaConf errors name the key."""
    over = cfg.marl.policies.get(policy_id)
    if not over:
        return cfg
    merged = OmegaConf.merge(cfg, over)
    assert isinstance(merged, DictConfig)
    readonly = OmegaConf.is_readonly(as_node(cfg))
    OmegaConf.set_readonly(merged, False)
    merged.marl.policies = {}
    OmegaConf.set_readonly(merged, readonly)
    return cast(TrainConfig, merged)


def policy_configs(cfg: TrainConfig, policy_map: PolicyMap) -> dict[str, TrainConfig]:
    return {pid: policy_config(cfg, pid) for pid in policy_map.policies}

