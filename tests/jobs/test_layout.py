"""The run layout (jobs/plan/layout.py) is built once per run: preparing the run and building its system
in-process (N = 0 groups, tiny models) construct one RunLayout, one engine map and each policy's config once,
and the system holds the layout's own objects."""

from __future__ import annotations

from collections import Counter

import pytest

from jobs.config import load_config, policies
from jobs.driver.assets import prepare
from jobs.driver.handles import build_handles
from jobs.driver.resources import trial_bundles
from jobs.plan.layout import RunLayout, run_layout
from marl.engine_map import EngineMap

TINY = "jobs/configs/tiny.yaml"


@pytest.fixture
def counted(monkeypatch) -> Counter:
    """How often a RunLayout, an engine map and a policy's own config are made from here on."""
    counts: Counter = Counter()

    def counting(name, make):
        def wrapper(*args, **kwargs):
            counts[name] += 1
            return make(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(RunLayout, "__init__", counting("layout", RunLayout.__init__))
    # bound to the class: the wrapper stands in for the classmethod as a plain function
    build = EngineMap.build
    monkeypatch.setattr(EngineMap, "build", counting("engine_map", build))
    monkeypatch.setattr(policies, "policy_config", counting("policy_config", policies.policy_config))
    return counts


def test_a_run_builds_its_layout_once(tmp_path, counted):
    cfg = load_config(TINY, [f"out_dir={tmp_path}", "marl.policies.aggregator.learner.optim.lr=5e-4",
                             "rollout.engines_per_role=0", "learner.ranks=0", "data.eval_size=2"])
    assert not counted  # loading builds no layout: it resolves nothing
    assets = prepare(cfg)
    handles = build_handles(assets.layout, assets.model_paths, assets.family)
    try:
        assert counted == {"layout": 1, "engine_map": 1, "policy_config": 2}  # voting, isolated: two policies
        assert handles.policy_map is assets.layout.policy_map
        assert set(handles.learners) == set(assets.layout.configs) == {"generator", "aggregator"}
    finally:
        handles.shutdown()


def test_the_layout_holds_each_policys_config_and_every_groups_demand():
    cfg = load_config(TINY, ["marl.policies.aggregator.learner.ranks=2", "rollout.engine_scope=policy"])
    layout = run_layout(cfg)
    assert layout.configs["aggregator"].learner.ranks == 2 and layout.configs["generator"] is cfg
    assert [(d.name, d.n) for d in layout.demands] == [
        ("tiny:engine:generator", 1), ("tiny:engine:aggregator", 1),
        ("tiny:learner:generator", 1), ("tiny:learner:aggregator", 2)]
    assert layout.learner_groups == {
        "generator": "tiny:learner:generator",
        "aggregator": "tiny:learner:aggregator",
    }
    # A trial's request is its driver's bundle, then the same demands, member by member.
    assert len(trial_bundles(layout, {"CPU": 1.0})) == 1 + 1 + 1 + 1 + 2
