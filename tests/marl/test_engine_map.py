"""EngineMap: which engine group serves each role, and every group's name, for the three layouts (one group
per role, per policy, one multi-LoRA group) under shared and isolated policy maps."""

from __future__ import annotations

import pytest

from marl.engine_map import EngineGroupSpec, EngineMap
from marl.names import group_name
from marl.policy_map import PolicyMap

ROLES = ["generator", "aggregator"]


def _layout(engine_map: EngineMap) -> list[tuple[str, str, dict[str, str], str | None]]:
    return [(g.key, g.name, dict(g.policy_of), g.policy) for g in engine_map.groups]


@pytest.mark.parametrize("sharing", ["shared", "isolated"])
def test_role_scope_is_one_group_per_role_on_its_policy(sharing):
    pm = PolicyMap.build(sharing, ROLES)
    pid = {"shared": lambda r: "shared", "isolated": lambda r: r}[sharing]
    assert _layout(EngineMap.build(pm, "run")) == [
        (r, f"run:engine:{r}", {r: pid(r)}, pid(r)) for r in ROLES
    ]


def test_policy_scope_shared_is_one_group_for_every_role():
    engine_map = EngineMap.build(PolicyMap.shared(ROLES), "run", scope="policy")
    assert _layout(engine_map) == [
        ("shared", "run:engine:shared", {"generator": "shared", "aggregator": "shared"}, "shared")
    ]


def test_policy_scope_isolated_is_one_group_per_policy():
    engine_map = EngineMap.build(PolicyMap.isolated(ROLES), "run", scope="policy")
    assert _layout(engine_map) == [
        ("generator", "run:engine:generator", {"generator": "generator"}, "generator"),
        ("aggregator", "run:engine:aggregator", {"aggregator": "aggregator"}, "aggregator"),
    ]


def test_policy_scope_groups_the_roles_of_a_custom_policy():
    pm = PolicyMap.custom(["orchestrator", "worker", "synthesizer"],
                          {"orchestrator": "plan", "worker": "solve", "synthesizer": "plan"})
    engine_map = EngineMap.build(pm, "run", scope="policy")
    assert [(g.key, g.roles) for g in engine_map.groups] == [("plan", ["orchestrator", "synthesizer"]),
                                                            ("solve", ["worker"])]


@pytest.mark.parametrize(("sharing", "policies"), [("shared", ["shared"]), ("isolated", ROLES)])
@pytest.mark.parametrize("scope", ["role", "policy"])
def test_multi_lora_is_one_group_for_every_role_whatever_the_scope(sharing, policies, scope):
    pm = PolicyMap.build(sharing, ROLES)
    (group,) = EngineMap.build(pm, "run", scope=scope, multi_lora=True).groups
    assert (group.key, group.name, group.roles, group.policies) == (
        "lora",
        "run:engine:lora",
        ROLES,
        policies,
    )
    assert group.multi_lora and group.policy is None  # the top-level settings, every policy as an adapter
    assert dict(group.policy_of) == {r: pm[r] for r in ROLES}


def test_names_come_from_one_builder():
    assert group_name("run", "learner", "shared") == "run:learner:shared"
    assert EngineMap.build(PolicyMap.shared(ROLES), "r1").groups[0].name == group_name(
        "r1", "engine", "generator"
    )


def test_unknown_scope_and_a_mixed_group_are_errors():
    with pytest.raises(ValueError, match="rollout.engine_scope"):
        EngineMap.build(PolicyMap.shared(ROLES), "run", scope="node")
    with pytest.raises(ValueError, match="several policies"):
        EngineGroupSpec("g", "run:engine:g", (("generator", "a"), ("aggregator", "b")))
