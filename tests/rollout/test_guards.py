"""Output guards (marl/guards.py) end to end on builtin:tiny with the HF engine: config errors at load, the
built-in guards always parse, the learner's replay gives the engine's (masked) log-probs, and a learner that
does not replay is caught. The vLLM engine's side is in tests/rollout/test_vllm_engine.py."""

from __future__ import annotations

import pytest

from jobs.config import ConfigError, load_config
from jobs.models.resolve import resolve_model
from marl.guard_grammar import at_budget, grammar_text
from marl.guards import Guard, boxed_choices, guard_metrics
from marl.types import Completion, Episode, Task, Turn
from marl.workflows import eval_opt, orch_workers, voting
from marl.workflows.common import WorkflowOptions, parse_choice, parse_plan, parse_verdict
from rollout.engine import Sampling
from rollout.hf_engine import HFEngine
from tests.learners.test_engine_logprobs import DIFF_TOL, REQUESTS, TEMPERATURE, learner_gap

ADVANTAGES = [1.0, -1.0, 0.5, -0.5]

BASE = ["rollout.sampling.max_new_tokens=64", "algo.max_len=512"]
VERDICT = Guard("choice", boxed_choices(["Correct", "Incorrect"]), budget=6)


@pytest.fixture(scope="module")
def tiny() -> str:
    return resolve_model("builtin:tiny")


@pytest.fixture(scope="module")
def engine(tiny) -> HFEngine:
    return HFEngine(tiny, policy_id="p")


@pytest.mark.parametrize(("override", "message"), [
    ("marl.guards={critic: builtin}", "marl.guards.critic: voting has no role 'critic'"),
    ("marl.guards={generator: builtin}", "marl.guards.generator: voting declares no built-in guard"),
    ("marl.guards={aggregator: {kind: choice, choices: []}}",
     "marl.guards.aggregator: choices must be a non-empty list"),
    ("marl.guards={aggregator: {kind: ebnf, text: 'root ::= foo'}}",
     "marl.guards.aggregator: the ebnf does not compile: .*Rule \"foo\" is not defined"),
    ("marl.guards={aggregator: {kind: regex, text: 'a(b'}}",
     "marl.guards.aggregator: the regex does not compile"),
    ("marl.guards={aggregator: {budget: 400}}", "marl.guards.aggregator.budget=400: the role's response cap"),
])
def test_bad_guards_are_config_errors_naming_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config("jobs/configs/tiny.yaml", ["marl.workflow=voting", *BASE, override])


def test_guards_are_off_unless_asked_for():
    assert load_config("jobs/configs/tiny.yaml").marl.guards == {}


@pytest.mark.parametrize(("module", "role", "parses"), [
    (voting, "aggregator", lambda text: parse_choice(text, 3) is not None),
    (eval_opt, "evaluator", lambda text: parse_verdict(text) is not None),
    (orch_workers, "orchestrator",
     lambda text: parse_plan(text)[1] == "strategy" and len(parse_plan(text)[0]) <= 3),
])
def test_built_in_guards_always_parse(engine, module, role, parses):
    # A random tiny model writes noise; under its guard every turn still parses (here with a budget that the
    # noise reaches, so turns end at the budget too).
    guard = module.guards(WorkflowOptions())[role]
    guard = Guard(guard.kind, guard.text, min(guard.budget, 12), guard.format_chars)
    cap = guard.budget + (guard.longest() or 0) + 1
    sampling = Sampling(1.0, max_new_tokens=cap, seed=2, guard=grammar_text(guard))
    out = engine.generate([REQUESTS[0]] * 8, sampling)
    assert all(c.finish_reason == "stop" and parses(c.text) for c in out), [c.text for c in out]
    if guard.budget:
        assert any(at_budget(guard, c.text) for c in out)


@pytest.fixture(scope="module")
def guarded_run(engine, tiny):
    """The evaluator's rows (REQUESTS 1 and 3) sampled under VERDICT, the generator's unguarded."""
    text = grammar_text(VERDICT)
    free = engine.generate(REQUESTS, Sampling(TEMPERATURE, max_new_tokens=24, seed=5))
    held = engine.generate(REQUESTS, Sampling(TEMPERATURE, max_new_tokens=24, seed=5, guard=text))
    return tiny, [free[0], held[1], free[2], held[3]], {"evaluator": text}


def test_the_learner_replays_the_guard_to_the_engines_logprobs(guarded_run):
    tiny, completions, guards = guarded_run
    gaps = learner_gap(tiny, completions, ADVANTAGES, guards=guards)
    assert all(gap < DIFF_TOL for gap in gaps.values()), gaps


def test_a_learner_that_does_not_replay_the_guard_is_caught(guarded_run):
    # The same rows without the guard's replay: the evaluator's log-probs are of the unmasked distribution.
    tiny, completions, _ = guarded_run
    gaps = learner_gap(tiny, completions, ADVANTAGES, guards={})
    assert gaps["generator"] < DIFF_TOL and gaps["evaluator"] > 1e-2, gaps


def _turn(role: str, text: str) -> Turn:
    return Turn(role, role, 0, [], Completion(text, [1], [1], [0.0]))


def test_guard_metrics_count_use_budget_ends_and_parse_rate():
    ends = ["x" * 6 + "\\boxed{Correct}", "ok\\boxed{Incorrect}", "y" * 6 + "\\boxed{Incorrect}"]
    episodes = [Episode(task=Task(f"t{i}", "p", "a"), sample_index=0, workflow="eval_opt",
                        turns=[_turn("generator", "g"), _turn("evaluator", text)])
                for i, text in enumerate(ends)]
    m = guard_metrics(episodes, {"evaluator": VERDICT}, at_budget)
    assert m == {"guard/turns/evaluator": 3.0, "guard/parse_rate/evaluator": 1.0,
                 "guard/at_budget/evaluator": 2 / 3}
    episodes[0].note_parse_failure("evaluator")  # a parse failure would show: the rate is not a constant
    rate = guard_metrics(episodes, {"evaluator": VERDICT}, at_budget)["guard/parse_rate/evaluator"]
    assert rate == pytest.approx(2 / 3)


def test_a_user_workflow_declares_guards_beside_its_options():
    from jobs.config.guards import run_guards

    debate = [*BASE, "marl.workflow=examples/debate.py", "marl.options.debaters=3"]
    cfg = load_config("jobs/configs/tiny.yaml", [*debate, "marl.guards={judge: {budget: 20}}"])
    assert run_guards(cfg) == {"judge": Guard("choice", boxed_choices(["1", "2", "3"]), budget=20)}
    with pytest.raises(ConfigError, match="marl.guards.debater: examples/debate.py declares no built-in"):
        load_config("jobs/configs/tiny.yaml", [*BASE, "marl.workflow=examples/debate.py",
                                               "marl.guards={debater: builtin}"])
