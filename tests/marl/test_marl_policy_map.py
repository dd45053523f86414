"""PolicyMap over real workflow roles: shared, isolated, custom."""

from __future__ import annotations

import pytest

from marl.policy_map import SHARED_POLICY_ID, PolicyMap
from marl.workflows import roles_of


def test_shared_routes_every_role_to_one_policy():
    pm = PolicyMap.build("shared", roles_of("orch_workers"))
    assert pm.policies == [SHARED_POLICY_ID]
    assert pm["worker"] == pm["synthesizer"] == SHARED_POLICY_ID


def test_isolated_gives_each_role_its_own_policy():
    pm = PolicyMap.build("isolated", roles_of("voting"))
    assert pm.policies == ["generator", "aggregator"]
    assert pm.roles_of("generator") == ["generator"]


def test_custom_groups_roles_and_rejects_missing_or_unknown():
    roles = roles_of("orch_workers")
    pm = PolicyMap.build(
        "custom", roles, {"orchestrator": "planner", "worker": "solver", "synthesizer": "planner"}
    )
    assert pm.policies == ["planner", "solver"]
    assert pm.roles_of("planner") == ["orchestrator", "synthesizer"]
    with pytest.raises(ValueError, match="missing \\['synthesizer'\\]"):
        PolicyMap.build("custom", roles, {"orchestrator": "a", "worker": "b"})
    with pytest.raises(ValueError, match="unknown \\['judge'\\]"):
        PolicyMap.build(
            "custom", roles, {"orchestrator": "a", "worker": "b", "synthesizer": "c", "judge": "d"}
        )
    with pytest.raises(KeyError):
        pm["judge"]
    with pytest.raises(ValueError, match="marl.sharing"):
        PolicyMap.build("partial", roles)
