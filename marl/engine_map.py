"""Role → engine group: which group of inference engines serves each role, and the name of every group.

Built once from the policy map (pure, beside it): one group per role (`rollout.engine_scope=role`), one per
policy (`policy`), or one group serving every policy as LoRA adapters on one base model
(`rollout.lora_serving=multi`). The run's placement demands, the System and each EngineGroup read the same
map, so a group always finds the placement bundles reserved under its name (marl.names.group_name).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from marl.names import group_name
from marl.policy_map import PolicyMap

MULTI_LORA_KEY = "lora"  # the one engine group of multi-LoRA serving
ENGINE_SCOPES = ("role", "policy")


class EngineScope(StrEnum):
    """`rollout.engine_scope`: the names of ENGINE_SCOPES (the config schema's type for the key)."""

    role = "role"
    policy = "policy"


class LoraServing(StrEnum):
    """`rollout.lora_serving`: single (engines serve merged weights) or multi
    (EngineMap.build's multi_lora)."""

    single = "single"
    multi = "multi"


@dataclass(frozen=True)
class EngineGroupSpec:
    """One engine group: its `key` (a role, a policy, or "lora"), its `name`, the roles it serves with their
    policies, and whether it serves them as LoRA adapters on one base model (then any number of policies)."""

    key: str
    name: str
    policy_of: tuple[tuple[str, str], ...]  # (role, policy) of every role it serves
    multi_lora: bool = False

    def __post_init__(self) -> None:
        if not self.multi_lora and len(self.policies) != 1:
            raise ValueError(f"engine group {self.key!r} would serve several policies {self.policies} "
                             "without multi-LoRA")

    @property
    def roles(self) -> list[str]:
        return [r for r, _ in self.policy_of]

    @property
    def policies(self) -> list[str]:
        """Policy ids in first-appearance order."""
        return list(dict.fromkeys(p for _, p in self.policy_of))

    @property
    def policy(self) -> str | None:
        """The policy whose settings (model, engine resources) the group takes; None under multi-LoRA, whose
        group takes the top-level ones."""
        return None if self.multi_lora else self.policies[0]


@dataclass(frozen=True)
class EngineMap:
    """Every engine group of a run, in build order; each role is served by exactly one."""

    groups: tuple[EngineGroupSpec, ...]

    @classmethod
    def build(
        cls, policy_map: PolicyMap, run_name: str, scope: str = "role", multi_lora: bool = False
    ) -> EngineMap:
        """`scope`: rollout.engine_scope (role | policy); `multi_lora`: rollout.lora_serving=multi (one group
        for every role, whatever the scope)."""
        if scope not in ENGINE_SCOPES:
            raise ValueError(f"rollout.engine_scope must be one of {list(ENGINE_SCOPES)}, got {scope!r}")
        if multi_lora:
            keyed = {MULTI_LORA_KEY: policy_map.roles}
        elif scope == "policy":
            keyed = {pid: policy_map.roles_of(pid) for pid in policy_map.policies}
        else:
            keyed = {role: [role] for role in policy_map.roles}
        return cls(
            tuple(
                EngineGroupSpec(
                    key,
                    group_name(run_name, "engine", key),
                    tuple((r, policy_map[r]) for r in roles),
                    multi_lora,
                )
                for key, roles in keyed.items()
            )
        )
