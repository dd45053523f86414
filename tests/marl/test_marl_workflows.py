"""Workflow semantics with a scripted client: turn order, agents, rounds, fallbacks and failures."""

from __future__ import annotations

import asyncio

import pytest
from marl_scripted import ScriptedClient

from marl.episode import run_episode
from marl.episode_metrics import choice_metrics
from marl.tasks import MathFamily
from marl.tasks.code import CodeFamily
from marl.types import Task
from marl.workflows import WORKFLOWS, get_workflow, roles_of
from marl.workflows.common import WorkflowOptions, parse_choice, parse_plan, parse_verdict
from marl.workflows.voting import candidate_order

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
    with pytest.raises(ValueError, match="marl.prompts"):
        WorkflowOptions(prompts="fancy")


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


def test_voting_shuffled_candidates_map_the_choice_back_to_its_generator():
    gens = {f"generator{i}": f"\\boxed{{{40 + i}}}" for i in range(3)}
    opts = WorkflowOptions(shuffle_candidates=True)
    orders = {tuple(candidate_order(Task(f"t{i}", "", ""), s, 3, True)) for i in range(8) for s in range(8)}
    assert len(orders) == 6  # every permutation of 3 is drawn over 64 (task, sample) pairs
    assert candidate_order(TASK, 3, 3, False) == [0, 1, 2]
    for pick in (1, 2, 3):
        ep = run("voting", ScriptedClient({**gens, "aggregator": f"\\boxed{{{pick}}}"}), opts)
        shown = ep.score_info["shown"]
        assert sorted(shown) == [0, 1, 2] and shown == candidate_order(TASK, 3, 3, True)  # seeded: same again
        prompt = ep.turns[3].messages[-1]["content"]
        for position, generator in enumerate(shown, start=1):
            assert f"Response {position}:\n\\boxed{{{40 + generator}}}" in prompt
        assert ep.final_answer == str(40 + shown[pick - 1]) and ep.score_info["choice"] == pick
    ep = run("voting", ScriptedClient({**gens, "aggregator": "\\boxed{2}"}))  # default: the generators' order
    assert ep.final_answer == "41" and ep.score_info["choice"] == 2 and "shown" not in ep.score_info


def test_choice_metrics_count_the_first_position_picked():
    gens = {f"generator{i}": f"\\boxed{{{40 + i}}}" for i in range(3)}
    picks = ["\\boxed{1}", "\\boxed{3}", "no idea", "\\boxed{2}"]  # "no idea" falls back to response 1
    episodes = [run("voting", ScriptedClient({**gens, "aggregator": a})) for a in picks]
    metrics = choice_metrics(episodes, MATH)
    assert metrics["choice/first/aggregator"] == 0.5
    assert metrics["choice/available/aggregator"] == 4 and metrics["choice/accuracy/aggregator"] == 0.25
    assert choice_metrics([run("single_agent", ScriptedClient({"solver": "\\boxed{42}"}))], MATH) == {}


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
    assert ep.score_info["plan_format"] == "strategy"  # how the parser read the plan (the gate's criterion)


def test_orch_workers_too_many_strategies():
    plan = "\n".join(f"STRATEGY {i}: idea {i}" for i in range(1, 5))
    client = ScriptedClient({"orchestrator": plan})
    ep = run("orch_workers", client)
    assert ep.failure == "too_many_strategies" and ep.reward == 0.0
    assert client.agents() == ["orchestrator"] and ep.turns[0].reward == 0.0


def test_orch_workers_blank_plan_is_unparsable():
    ep = run("orch_workers", ScriptedClient({"orchestrator": "  \n\n \t\n"}))
    assert ep.failure == "unparsable_plan" and ep.reward == 0.0
    assert ep.parse_failures == {"orchestrator": 1} and len(ep.turns) == 1
    assert ep.score_info["plan_format"] == "none"


def _orch(plan: str, max_strategies: int = 3):
    workers = {f"worker{i}": "\\boxed{42}" for i in range(4)}
    client = ScriptedClient({"orchestrator": plan, **workers, "synthesizer": "\\boxed{42}"})
    return run("orch_workers", client, WorkflowOptions(max_strategies=max_strategies)), client


def test_orch_workers_falls_back_to_a_numbered_list():
    ep, client = _orch("Two ways:\n1. Repeated addition.\n2) Use 6*(5+2)\n   and add the parts.\n\nDone.")
    assert client.agents() == ["orchestrator", "worker0", "worker1", "synthesizer"]
    assert (
        ep.turns[1]
        .messages[-1]["content"]
        .endswith("Repeated addition.\n\nPut your final answer in \\boxed{}.")
    )
    assert "Use 6*(5+2) and add the parts." in ep.turns[2].messages[-1]["content"]
    assert ep.reward == 1.0 and ep.failure is None and ep.parse_failures == {"orchestrator": 1}


def test_orch_workers_falls_back_to_lines():
    ep, client = _orch("Just compute it: \\boxed{42}\n\nCheck by division.")
    assert client.agents() == ["orchestrator", "worker0", "worker1", "synthesizer"]
    assert "strategy:\nCheck by division." in ep.turns[2].messages[-1]["content"]
    assert ep.reward == 1.0 and ep.parse_failures == {"orchestrator": 1}


@pytest.mark.parametrize(("plan", "workers", "parse_failures"), [
    ("1. a\n2. b\n3. c\n4. d", 0, {"orchestrator": 1}),  # 4 > max_strategies: reward 0, no worker runs
    ("a\nb\nc\nd", 0, {"orchestrator": 1}),
    ("a\nb\nc", 3, {"orchestrator": 1}),
    ("STRATEGY 1: a\nSTRATEGY 2: b\n\n1. c\n2. d", 2, {}),  # STRATEGY lines win over a list
])
def test_orch_workers_fallbacks_keep_the_strategy_limit(plan, workers, parse_failures):
    ep, client = _orch(plan, max_strategies=3)
    assert client.agents().count("synthesizer") == (workers > 0)
    assert [a for a in client.agents() if a.startswith("worker")] == [f"worker{i}" for i in range(workers)]
    assert ep.failure == (None if workers else "too_many_strategies")
    assert ep.reward == (1.0 if workers else 0.0) and ep.parse_failures == parse_failures


def test_parse_plan_order_of_fallbacks():
    assert parse_plan("STRATEGY 1: x\n\n1. y\n2. z") == (["x"], "strategy")
    assert parse_plan("Plan\n**1.** Draw it.\n## 2) Factor\n3.5 is not an item\n\n10. Last") == (
        ["Draw it.", "Factor 3.5 is not an item", "Last"], "numbered")
    assert parse_plan("3.5 apples\n  Draw it.  \n\n") == (["3.5 apples", "Draw it."], "lines")
    assert parse_plan("") == ([], "none") and parse_plan(" \n\t\n") == ([], "none")


def test_parse_plan_reads_strategy_lines_in_their_variants():
    text = "Plan:\n**Strategy 1:** Draw it.\n- strategy 2) Factor\n  the expression.\n\nStrategy 3 is prose"
    assert parse_plan(text) == (["Draw it.", "Factor the expression."], "strategy")
    assert parse_plan("STRATEGY 1:\nWork backwards.") == (["Work backwards."], "strategy")
    assert parse_plan("no plan here")[1] != "strategy"


def test_parse_verdict_and_choice():
    assert parse_verdict("\\boxed{Incorrect} ... actually \\boxed{Correct}") is True
    assert parse_verdict("\\boxed{\\text{Incorrect}}.") is False
    assert parse_verdict("\\boxed{maybe}") is None and parse_verdict("Correct") is None
    assert parse_choice("\\boxed{Response 3}", 3) == 3
    assert parse_choice("\\boxed{4}", 3) is None


def _eval_opt_texts(prompts: str, family=MATH) -> dict[str, str]:
    """The system prompts, the evaluator's first request and the generator's
    revision request of a 2-round run."""
    client = ScriptedClient({"generator": ["\\boxed{41}", "\\boxed{42}"],
                             "evaluator": ["Recheck the product. \\boxed{Incorrect}", "\\boxed{Correct}"]})
    ep = asyncio.run(get_workflow("eval_opt").run(TASK, client, family, WorkflowOptions(prompts=prompts), 0))
    gen0, ev0, gen1 = ep.turns[0], ep.turns[1], ep.turns[2]
    assert len(ep.turns) == 4
    return {"generator": gen0.messages[0]["content"], "evaluator": ev0.messages[0]["content"],
            "review": ev0.messages[-1]["content"], "revise": gen1.messages[-1]["content"]}


def test_eval_opt_default_prompts_are_unchanged_for_every_task():
    math, code = _eval_opt_texts("default"), _eval_opt_texts("default", CodeFamily())
    assert math["generator"] == code["generator"] == (
        "You are a careful problem solver. Reason step by step, then give the final answer.")
    assert math["evaluator"] == code["evaluator"] and math["evaluator"].startswith(
        "You are a strict reviewer"
    )
    assert math["review"].endswith(
        "Is this solution correct? Give brief feedback, then end with \\boxed{Correct} or \\boxed{Incorrect}."
    )
    assert math["revise"] == (
        "A reviewer judged your solution incorrect:\nRecheck the product. \\boxed{Incorrect}"
        "\n\nRevise your solution.\n\nPut your final answer in \\boxed{}."
    )


def test_eval_opt_paper_prompts_on_math():
    texts = _eval_opt_texts("paper")
    assert texts["generator"] == _eval_opt_texts("default")["generator"]
    assert "Never reveal the correct final answer" in texts["evaluator"]
    assert "\\boxed{Correct} or \\boxed{Incorrect}" in texts["evaluator"]
    assert texts["review"].startswith("Is this solution correct?")
    assert "without revealing the answer" in texts["review"] and "\\boxed{Incorrect}." in texts["review"]
    assert "addresses the feedback" in texts["revise"]
    assert "a different method or approach" in texts["revise"] and texts["revise"].endswith("in \\boxed{}.")


def test_eval_opt_paper_prompts_on_code_use_code_personas():
    family = CodeFamily()
    texts = _eval_opt_texts("paper", family)
    assert texts["generator"].startswith("You are an expert programmer") and "```python" in texts["generator"]
    assert texts["evaluator"].startswith("You are a code reviewer") and "edge cases" in texts["evaluator"]
    assert "do not write the fixed code" in texts["evaluator"] and "\\boxed{Incorrect}" in texts["evaluator"]
    assert "without writing the fixed code" in texts["review"]
    assert "new program that addresses the review and uses a different method" in texts["revise"]
    assert texts["revise"].endswith(family.instruction())


def test_eval_opt_paper_shares_one_conversation_over_three_rounds():
    from marl.prompts import load_prompt_set

    w = load_prompt_set("paper").wording("eval_opt", "math")
    g, e = w.role("generator"), w.role("evaluator")
    review, rereview = e.fill("review", problem="", answer=""), e.fill("rereview", answer="")
    revise = g.fill("revise", feedback="")
    verdicts = ["Recheck. \\boxed{Incorrect}", "No. \\boxed{Incorrect}", "\\boxed{Correct}"]
    client = ScriptedClient(
        {"generator": ["\\boxed{41}", "\\boxed{40}", "\\boxed{42}"], "evaluator": verdicts}
    )
    ep = run("eval_opt", client, WorkflowOptions(prompts="paper", max_rounds=3))
    problem = f"{TASK.prompt}\n\n{MATH.instruction()}"
    revise = f"{revise}\n\n{MATH.instruction()}"
    shared = [("user", problem), ("assistant", "\\boxed{41}"), ("user", review),
              ("assistant", "Recheck. \\boxed{Incorrect}"), ("user", revise), ("assistant", "\\boxed{40}"),
              ("user", rereview), ("assistant", "No. \\boxed{Incorrect}"), ("user", revise),
              ("assistant", "\\boxed{42}"), ("user", rereview)]
    # Turn k reads the system prompt of its role, then the first 2k + 1 messages of the one conversation.
    for k, turn in enumerate(ep.turns):
        assert turn.messages[0] == {"role": "system", "content": g.system if k % 2 == 0 else e.system}
        assert [(m["role"], m["content"]) for m in turn.messages[1:]] == shared[: 2 * k + 1], k
    assert [(t.role, t.round) for t in ep.turns] == [
        (r, i) for i in range(3) for r in ("generator", "evaluator")
    ]
    assert ep.final_answer == "42" and ep.reward == 1.0 and ep.parse_failures == {}


def test_eval_opt_default_keeps_two_chats():
    client = ScriptedClient({"generator": ["\\boxed{41}", "\\boxed{42}"],
                             "evaluator": ["Recheck. \\boxed{Incorrect}", "\\boxed{Correct}"]})
    ep = run("eval_opt", client)
    assert [m["role"] for m in ep.turns[1].messages] == ["system", "user"]  # the answer quoted in a user turn
    assert [m["role"] for m in ep.turns[3].messages] == ["system", "user", "assistant", "user"]


def _code_run(workflow: str, replies: dict[str, object], prompts: str):
    task = Task(
        task_id="c0", prompt="Print the sum of two numbers.", answer="", meta={"style": "stdio", "cases": []}
    )
    family = CodeFamily()
    opts = WorkflowOptions(prompts=prompts)
    return asyncio.run(get_workflow(workflow).run(task, ScriptedClient(replies), family, opts, 0)), family


def test_voting_paper_code_prompts():
    gens = {f"generator{i}": f"```python\nprint({i})\n```" for i in range(3)}
    ep, family = _code_run("voting", {**gens, "aggregator": "\\boxed{2}"}, "paper")
    gen, agg = ep.turns[0].messages, ep.turns[3].messages
    assert gen[0]["content"].startswith("You are an expert competitive programmer")
    assert gen[1]["content"].endswith(family.instruction())  # a code block
    assert "most likely to pass all tests" in agg[0]["content"]
    assert "--- Solution 2 ---\n```python\nprint(1)" in agg[1]["content"]
    assert agg[1]["content"].endswith(
        "Which solution is most likely to pass all tests? Answer with its number as "
        "\\boxed{i}, i from 1 to 3."
    )
    assert ep.final_answer == "print(1)\n"
    default, _ = _code_run("voting", {**gens, "aggregator": "\\boxed{2}"}, "default")
    assert default.turns[3].messages[0]["content"].endswith("most likely to be correct.")
    assert "Response 2:" in default.turns[3].messages[1]["content"]


def test_orch_workers_paper_code_prompts():
    replies = {"orchestrator": "STRATEGY 1: read both.\nSTRATEGY 2: split the line.",
               "worker0": "```python\nprint(1)\n```", "worker1": "```python\nprint(2)\n```",
               "synthesizer": "```python\nprint(3)\n```"}
    ep, family = _code_run("orch_workers", replies, "paper")
    plan, worker, synth = (ep.turns[i].messages for i in (0, 1, 3))
    assert "do not write code" in plan[0]["content"]
    assert worker[0]["content"].startswith("You are an expert competitive programmer")
    assert worker[1]["content"].endswith(family.instruction())
    assert "one complete, runnable Python program" in synth[1]["content"]
    assert "agreement between them" in synth[1]["content"] and synth[1]["content"].endswith(
        family.instruction()
    )
    assert ep.final_answer == "print(3)\n"
    math = asyncio.run(
        get_workflow("orch_workers").run(
            TASK,
            ScriptedClient({**replies, "synthesizer": "\\boxed{42}"}),
            MATH,
            WorkflowOptions(prompts="paper"),
            0,
        )
    )
    assert "agreement between solutions" in math.turns[3].messages[1]["content"]
    assert "runnable" not in math.turns[3].messages[1]["content"]


def test_prompt_sets_are_a_config_choice():
    from jobs.config import ConfigError, load_config

    assert load_config("jobs/configs/tiny.yaml").marl.prompts == "default"
    assert load_config("jobs/configs/sweeps/paper_base.yaml").marl.prompts == "paper"
    assert load_config("jobs/configs/tiny.yaml", ["marl.prompts=fewshot"]).marl.prompts == "fewshot"
    with pytest.raises(ConfigError, match=r"marl\.prompts=fancy: no such file, and not a built-in prompt set "
                                          r"\(default, paper, fewshot\)"):
        load_config("jobs/configs/tiny.yaml", ["marl.prompts=fancy"])
