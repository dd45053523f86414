"""The planner reads each workflow's declared turn shape (marl/workflows/turns.py): the built-ins' as they
were planned before, a user workflow's as a function of its own options (tests/jobs/relay_workflow.py), one
declaring none as each of its agents once; a shape naming a role the workflow lacks is a config error."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.config import ConfigError, load_config
from jobs.plan.layout import run_layout
from jobs.plan.planner import make_plan, role_turns, step_seconds_at
from marl.workflows import turn_shape, workflow_options
from marl.workflows.turns import TurnShape

TINY = "jobs/configs/tiny.yaml"
RELAY = "tests/jobs/relay_workflow.py"
GPU = ["model.path=builtin:qwen3-0.6b-shape?vocab=151936", "learner.backend=deepspeed",
       "rollout.engines_per_role=1", "learner.rank_num_gpus=0.5", "rollout.engine_num_gpus=0.5",
       "learner.ranks=1", "ray.gpu_memory_gb=80"]


def turns(*overrides: str) -> tuple[dict[str, int], int]:
    return role_turns(run_layout(load_config(TINY, list(overrides))))


@pytest.mark.parametrize(("workflow", "expected"), [
    ("single_agent", ({"solver": 1}, 1)),
    ("voting", ({"generator": 3, "aggregator": 1}, 2)),
    ("orch_workers", ({"orchestrator": 1, "worker": 3, "synthesizer": 1}, 3)),
    ("eval_opt", ({"generator": 3, "evaluator": 3}, 6)),
])
def test_the_builtin_workflows_declare_the_shapes_they_were_planned_with(workflow, expected):
    assert turns(f"marl.workflow={workflow}", "marl.num_generators=3", "marl.max_rounds=3",
                 "marl.max_strategies=3") == expected


def test_the_planner_reads_a_user_workflows_shape_from_its_options():
    assert turns(f"marl.workflow={RELAY}") == ({"runner": 6, "coach": 1}, 7)  # 2 laps x 3 rounds
    assert turns(f"marl.workflow={RELAY}", "marl.options.laps=4", "marl.max_rounds=1") == (
        {"runner": 4, "coach": 1}, 5)
    # More runner turns: more rows for the runner's policy to train on, and a longer rollout.
    layouts = [run_layout(load_config(TINY, [*GPU, f"marl.workflow={RELAY}", f"marl.options.laps={n}"]))
               for n in (1, 8)]
    short, long = (step_seconds_at(layout, make_plan(layout).members, 1.0) for layout in layouts)
    assert long > short


def test_a_workflow_declaring_no_shape_is_each_agent_once(tmp_path):
    plain = tmp_path / "plain.py"
    plain.write_text("ROLES = ('a', 'b')\n\ndef agents(opts):\n    return ['a0', 'a1', 'b']\n\n"
                     "async def run(task, client, family, opts, sample_index):\n    pass\n")
    assert turn_shape(str(plain), workflow_options(str(plain), load_config(TINY).marl)) == TurnShape(
        {"a": 2, "b": 1}, 3)


def test_a_shape_of_another_role_or_no_shape_is_a_config_error(tmp_path):
    stray = tmp_path / "stray.py"
    stray.write_text(Path(RELAY).read_text().replace('"coach": 1', '"judge": 1'))
    with pytest.raises(ConfigError, match=r"turn_shape\(\) counts turns of \['judge'\], which are not in"):
        load_config(TINY, [f"marl.workflow={stray}"])
    odd = tmp_path / "odd.py"
    odd.write_text(Path(RELAY).read_text().replace("return TurnShape({", "return ({"))
    with pytest.raises(ConfigError, match="turn_shape\\(\\) must return a marl.workflows.turns.TurnShape"):
        load_config(TINY, [f"marl.workflow={odd}"])


def test_a_turn_shape_is_checked_where_it_is_built():
    with pytest.raises(ValueError, match="sequential >= 1"):
        TurnShape({"solver": 1}, 0)
    with pytest.raises(ValueError, match="3 turns one after another, but 2 turns in all"):
        TurnShape({"solver": 2}, 3)
