"""Workflow semantics with a scripted client: turn order, agents, rounds, fallbacks and failures."""

from __future__ import annotations

import asyncio

import pytest
from marl_scripted import ScriptedClient

from marl.episode import run_episode
from marl.tasks import MathFamily
from marl.types import Task
from marl.workflows import WORKFLOWS, get_workflow, roles_of
from marl.workflows.common import WorkflowOptions, parse_choice, parse_strategies, parse_verdict

TASK = Task(task_id="t0", prompt="What is 6 * 7?", answer="42")
MATH = MathFamily()
OPTS = WorkflowOptions()


def run(workflow: str, client: ScriptedClient, opts: WorkflowOptions = OPTS, shaping=None):
    return asyncio.run(run_episode(workflow, TASK, client, MATH, opts, sample_index=3, shaping=shaping))


def test_registry_roles_and_unknown_name():
    assert set(WORKFLOWS) == {"single_agent", "eval_opt", "voting", "orch_workers"}
    assert roles_of("voting") == ("generator", "aggregator")
    assert roles_of("orch_workers") == ("orchestrator", "worker", "synthesizer")
    with pytest.raises(ValueError, match="marl.workflow"):
        get_workflow("debate")
    assert get_workflow("voting").agents(WorkflowOptions(num_generators=2)) == [
        "generator0",
        "generator1",
        "aggregator",
    ]


def test_options_are_validated():
    with pytest.raises(ValueError, match="marl.max_rounds"):
        WorkflowOptions(max_rounds=0)


def test_single_agent():
    client = ScriptedClient({"solver": "6*7 = \\boxed{42}"})
    ep = run("single_agent", client)
    assert [(t.role, t.agent, t.round) for t in ep.turns] == [("solver", "solver", 0)]
    assert ep.final_answer == "42" and ep.reward == 1.0 and ep.sample_index == 3
    assert "\\boxed{}" in ep.turns[0].messages[-1]["content"]  # the family's instruction


def test_eval_opt_stops_on_correct():
    client = ScriptedClient({"generator": "\\boxed{42}", "evaluator": "Looks right. \\boxed{correct}"})
    ep = run("eval_opt", client)
    assert [(t.agent, t.round) for t in ep.turns] == [("generator", 0), ("evaluator", 0)]
    assert ep.final_answer == "42" and ep.reward == 1.0 and ep.parse_failures == {}


def test_eval_opt_runs_max_rounds_on_incorrect_and_feeds_back():
    client = ScriptedClient(
        {
            "generator": ["\\boxed{41}", "\\boxed{40}", "\\boxed{43}"],
            "evaluator": [
                "Off by one, multiply again. \\boxed{Incorrect}",
                "Still wrong. \\boxed{Incorrect}",
            ],
        }
    )
    ep = run("eval_opt", client, WorkflowOptions(max_rounds=3))
    assert [(t.role, t.round) for t in ep.turns] == [
        ("generator", 0),
        ("evaluator", 0),
        ("generator", 1),
        ("evaluator", 1),
        ("generator", 2),
        ("evaluator", 2),
    ]
    assert ep.final_answer == "43" and ep.reward == 0.0
    gen0, gen1 = ep.turns[0], ep.turns[2]
    assert len(gen0.messages) == 2  # a snapshot: later history does not rewrite it
    assert [m["role"] for m in gen1.messages] == ["system", "user", "assistant", "user"]
    assert gen1.messages[2]["content"] == "\\boxed{41}"
    assert "Off by one" in gen1.messages[3]["content"]
    eval1 = ep.turns[3]
    assert "\\boxed{40}" in eval1.messages[-1]["content"] and len(eval1.messages) == 4


def test_eval_opt_correct_in_second_round():
    client = ScriptedClient(
        {"generator": ["\\boxed{41}", "\\boxed{42}"], "evaluator": ["\\boxed{Incorrect}", "\\boxed{Correct}"]}
    )
    ep = run("eval_opt", client)
    assert len(ep.turns) == 4 and ep.final_answer == "42" and ep.reward == 1.0


def test_eval_opt_unparsable_verdict_counts_and_continues():
    client = ScriptedClient({"generator": "\\boxed{42}", "evaluator": ["I am not sure.", "\\boxed{Correct}"]})
    ep = run("eval_opt", client)
    assert ep.parse_failures == {"evaluator": 1}
    assert len(ep.turns) == 4


def test_voting_parallel_identical_prompts_and_boxed_choice():
    gens = {f"generator{i}": f"\\boxed{{{40 + i}}}" for i in range(3)}
    client = ScriptedClient({**gens, "aggregator": "Response 2 is right: \\boxed{2}"}, barrier=list(gens))
    ep = run("voting", client)
    assert [t.agent for t in ep.turns] == ["generator0", "generator1", "generator2", "aggregator"]
    assert {t.role for t in ep.turns[:3]} == {"generator"}
    assert ep.turns[0].messages == ep.turns[1].messages == ep.turns[2].messages
    agg_prompt = ep.turns[3].messages[-1]["content"]
    assert "Response 1:\n\\boxed{40}" in agg_prompt and "Response 3:\n\\boxed{42}" in agg_prompt
    assert ep.final_answer == "41" and ep.parse_failures == {}


@pytest.mark.parametrize(
    ("aggregator", "answer"),
    [("I pick the third one, 3.", "42"), ("None of them, 12 and 0 are wrong.", "40")],
)
def test_voting_fallbacks_count_parse_failures(aggregator, answer):
    gens = {f"generator{i}": f"\\boxed{{{40 + i}}}" for i in range(3)}
    ep = run("voting", ScriptedClient({**gens, "aggregator": aggregator}))
    assert ep.final_answer == answer
    assert ep.parse_failures == {"aggregator": 1}


def test_orch_workers_two_strategies():
    plan = "STRATEGY 1: Repeated addition.\nstrategy 2: Use 6*7 = 6*(5+2)."
    client = ScriptedClient(
        {
            "orchestrator": plan,
            "worker0": "\\boxed{42}",
            "worker1": "\\boxed{42}",
            "synthesizer": "Both agree: \\boxed{42}",
        },
        barrier=["worker0", "worker1"],
    )
    ep = run("orch_workers", client)
    assert [(t.role, t.agent) for t in ep.turns] == [
        ("orchestrator", "orchestrator"),
        ("worker", "worker0"),
        ("worker", "worker1"),
        ("synthesizer", "synthesizer"),
    ]
    assert "Repeated addition." in ep.turns[1].messages[-1]["content"]
    assert "6*(5+2)" in ep.turns[2].messages[-1]["content"]
    assert "Solution 2" in ep.turns[3].messages[-1]["content"]
    assert ep.final_answer == "42" and ep.reward == 1.0 and ep.failure is None


def test_orch_workers_too_many_strategies():
    plan = "\n".join(f"STRATEGY {i}: idea {i}" for i in range(1, 5))
    client = ScriptedClient({"orchestrator": plan})
    ep = run("orch_workers", client)
    assert ep.failure == "too_many_strategies" and ep.reward == 0.0
    assert client.agents() == ["orchestrator"] and ep.turns[0].reward == 0.0


def test_orch_workers_unparsable_plan():
    ep = run("orch_workers", ScriptedClient({"orchestrator": "Just compute it: \\boxed{42}"}))
    assert ep.failure == "unparsable_plan" and ep.reward == 0.0
    assert ep.parse_failures == {"orchestrator": 1} and len(ep.turns) == 1


def test_parse_strategies_variants():
    text = "Plan:\n**Strategy 1:** Draw it.\n- strategy 2) Factor\n  the expression.\n\nStrategy 3 is prose"
    assert parse_strategies(text) == ["Draw it.", "Factor the expression."]
    assert parse_strategies("STRATEGY 1:\nWork backwards.") == ["Work backwards."]
    assert parse_strategies("no plan here") == []


def test_parse_verdict_and_choice():
    assert parse_verdict("\\boxed{Incorrect} ... actually \\boxed{Correct}") is True
    assert parse_verdict("\\boxed{\\text{Incorrect}}.") is False
    assert parse_verdict("\\boxed{maybe}") is None and parse_verdict("Correct") is None
    assert parse_choice("\\boxed{Response 3}", 3) == 3
    assert parse_choice("\\boxed{4}", 3) is None
