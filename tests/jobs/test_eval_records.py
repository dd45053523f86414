"""Per-task eval records: rows appended per evaluation, read back with a re-evaluation's rows winning, and the
evaluation's accuracy and per-role parse failures."""

from __future__ import annotations

import math

import pytest

from jobs.driver.eval_records import append_eval, eval_metrics, read_eval
from marl.episode_metrics import decision_baselines, majority_accuracy
from marl.tasks import MathFamily
from marl.types import Completion, Episode, Task, Turn


def episode(task_id: str, reward: float, **failures: int) -> Episode:
    return Episode(task=Task(task_id, "1+1", "2"), sample_index=0, workflow="voting", reward=reward,
                   parse_failures=dict(failures))


def test_rows_appended_and_read_back_last_wins(tmp_path):
    append_eval(tmp_path, 0, [episode("a", 0.0), episode("b", 1.0)])
    append_eval(tmp_path, 10, [episode("a", 1.0), episode("b", 1.0)])
    append_eval(tmp_path, 10, [episode("a", 0.0)])  # a resumed run evaluates step 10 again
    append_eval(tmp_path, 20, [])
    assert (tmp_path / "eval_tasks.csv").read_text().splitlines()[0] == "steps_done,task_id,reward"
    assert read_eval(tmp_path) == {0: {"a": 0.0, "b": 1.0}, 10: {"a": 0.0, "b": 1.0}}
    assert read_eval(tmp_path / "none") == {}


def test_eval_metrics_by_hand():
    m = eval_metrics([episode("a", 1.0, aggregator=1), episode("b", 0.0, aggregator=1, generator=2),
                      episode("c", 0.0)])
    assert m == {"eval/accuracy": 1 / 3, "eval/episodes": 3.0, "eval/parse_failures/aggregator": 2.0,
                 "eval/parse_failures/generator": 2.0}
    assert math.isnan(eval_metrics([])["eval/accuracy"])


def voting_episode(task_id: str, answers: list[str], chosen: int, choice_text: str) -> Episode:
    """A scored voting episode on '2 + 3' whose generators answered `answers` and whose aggregator chose
    `chosen`."""
    task = Task(task_id, "2 + 3", "5")
    turns = [Turn("generator", f"generator{n - 1}", 0, [],
                  Completion(f"\\boxed{{{a}}}", [1], [1] * n, [0.0] * n))
             for n, a in enumerate(answers, start=1)]
    turns.append(Turn("aggregator", "aggregator", 0, [], Completion(choice_text, [1], [1] * 4, [0.0] * 4)))
    reward = float(answers[chosen - 1] == "5")
    return Episode(task=task, sample_index=0, workflow="voting", turns=turns, reward=reward)


def test_the_aggregators_choice_accuracy_counts_episodes_with_a_right_candidate():
    episodes = [voting_episode("a", ["4", "5", "6"], 2, "\\boxed{2}"),  # a right candidate, chosen
                voting_episode("b", ["5", "4", "6"], 3, "\\boxed{3}"),  # a right candidate, missed
                voting_episode("c", ["4", "5", "5"], 3, "\\boxed{3}"),  # two right candidates, one chosen
                voting_episode("d", ["4", "6", "7"], 1, "\\boxed{1}")]  # none right: not counted
    m = eval_metrics(episodes, MathFamily())
    assert m["eval/choice/available/aggregator"] == 3.0 and m["eval/choice/accuracy/aggregator"] == 2 / 3
    # over a, b, c: a random pick 1/3, 1/3, 2/3; a majority vote 1/3 (a three-way tie), 1/3, 1 (two 5s);
    # always the first 0, 1, 0
    assert m["eval/choice/random/aggregator"] == pytest.approx(4 / 9)
    assert m["eval/choice/majority/aggregator"] == pytest.approx(5 / 9)
    assert m["eval/choice/always_first/aggregator"] == pytest.approx(1 / 3)
    assert m["eval/turns/generator"] == 12.0 and m["eval/response_len/generator"] == 2.0  # lengths 1, 2, 3
    assert m["eval/response_len/aggregator"] == 4.0
    none_right = eval_metrics([episodes[3]], MathFamily())
    assert none_right["eval/choice/available/aggregator"] == 0.0
    assert math.isnan(none_right["eval/choice/accuracy/aggregator"])
    assert not any(k.startswith("eval/choice/") for k in eval_metrics([episode("e", 1.0)], MathFamily()))


def test_the_aggregators_choice_accuracy_comes_with_its_chance_baselines():
    episodes = [voting_episode("a", ["4", "5", "6"], 2, "\\boxed{2}"),  # first shown wrong; random 1/3
                voting_episode("b", ["5", "4", "6"], 3, "\\boxed{3}"),  # first shown right; random 1/3
                voting_episode("c", ["4", "5", "5"], 3, "\\boxed{3}")]  # first shown wrong; random 2/3
    episodes[0].score_info["shown"] = [1, 0, 2]  # shuffled: the right answer was shown first
    m = eval_metrics(episodes, MathFamily())
    assert m["eval/choice/always_first/aggregator"] == 2 / 3
    assert abs(m["eval/choice/random/aggregator"] - (1 / 3 + 1 / 3 + 2 / 3) / 3) < 1e-12


def eval_opt_episode(task_id: str, rounds: list[tuple[str, str]]) -> Episode:
    """An eval_opt episode on '2 + 3' of (answer, verdict text) rounds."""
    turns = []
    for r, (answer, verdict) in enumerate(rounds):
        text = f"\\boxed{{{answer}}}"
        turns.append(Turn("generator", "generator", r, [], Completion(text, [1], [1], [0.0])))
        turns.append(Turn("evaluator", "evaluator", r, [], Completion(verdict, [1], [1], [0.0])))
    return Episode(task=Task(task_id, "2 + 3", "5"), sample_index=0, workflow="eval_opt", turns=turns)


def test_the_evaluators_verdicts_are_scored_against_the_true_grade_of_the_answer_they_judged():
    episodes = [eval_opt_episode("a", [("4", "\\boxed{Incorrect}"), ("5", "\\boxed{Correct}")]),  # 2 right
                eval_opt_episode("b", [("4", "\\boxed{Correct}")]),  # wrong
                eval_opt_episode("c", [("6", "Yes, it is correct.")])]  # unparsable reads Incorrect: right
    m = eval_metrics(episodes, MathFamily())
    assert m["eval/verdict/judged/evaluator"] == 4.0 and m["eval/verdict/accuracy/evaluator"] == 3 / 4
    assert m["eval/verdict/correct_share/evaluator"] == 1 / 4
    assert m["eval/verdict/majority/evaluator"] == 3 / 4
    assert not any(k.startswith("eval/verdict/") for k in eval_metrics(episodes[:0], MathFamily()))


def test_episode_failures_and_plan_formats_are_counted():
    plans = [Episode(task=Task("a", "1+1", "2"), sample_index=0, workflow="orch_workers", failure=failure,
                     score_info={"plan_format": fmt} if fmt else {})
             for failure, fmt in ((None, "strategy"), (None, "numbered"), ("too_many_strategies", "lines"),
                                  ("unparsable_plan", "none"), (None, None))]
    m = eval_metrics(plans)
    assert {k: v for k, v in m.items() if k.startswith(("eval/failures/", "eval/plan_format/"))} == {
        "eval/failures/too_many_strategies": 1.0, "eval/failures/unparsable_plan": 1.0,
        "eval/plan_format/strategy": 1.0, "eval/plan_format/numbered": 1.0, "eval/plan_format/lines": 1.0,
        "eval/plan_format/none": 1.0}


def test_majority_vote_and_first_shown_baselines():
    assert majority_accuracy(["5", "5", "4"], [True, True, False]) == 1.0
    assert majority_accuracy(["4", "4", "5"], [False, False, True]) == 0.0
    assert majority_accuracy(["4", "5", None], [False, True, False]) == 0.5  # a tie; None casts no vote
    assert majority_accuracy([None, None], [False, False]) == 0.0
    # a shuffled display: the first response shown was candidate 2
    assert decision_baselines([False, False, True], ["4", "6", "5"], [2, 0, 1])["always_first"] == 1.0
    assert decision_baselines([False, False, True], ["4", "6", "5"], None)["always_first"] == 0.0


def orch_episode(task_id: str, answers: list[str], final: str) -> Episode:
    """A scored orch_workers episode on '2 + 3': a plan, one worker per answer, a synthesizer answering
    `final`."""
    def turn(role: str, agent: str, text: str) -> Turn:
        return Turn(role, agent, 0, [], Completion(text, [1], [1], [0.0]))

    turns = [turn("orchestrator", "orchestrator", "STRATEGY 1: add"),
             *(turn("worker", f"worker{i}", f"\\boxed{{{a}}}") for i, a in enumerate(answers)),
             turn("synthesizer", "synthesizer", f"\\boxed{{{final}}}")]
    return Episode(task=Task(task_id, "2 + 3", "5"), sample_index=0, workflow="orch_workers", turns=turns,
                   reward=float(final == "5"))


def test_the_synthesizer_is_held_against_its_workers():
    episodes = [orch_episode("a", ["5", "4"], "5"),  # right, one right worker
                orch_episode("b", ["5", "5", "6"], "6"),  # wrong against a right majority
                orch_episode("c", ["4", "6"], "5")]  # right, but no worker was: not counted
    m = eval_metrics(episodes, MathFamily())
    assert m["eval/choice/available/synthesizer"] == 2.0 and m["eval/choice/accuracy/synthesizer"] == 0.5
    assert m["eval/choice/random/synthesizer"] == pytest.approx((1 / 2 + 2 / 3) / 2)
    assert m["eval/choice/majority/synthesizer"] == pytest.approx((1 / 2 + 1) / 2)
    assert m["eval/choice/always_first/synthesizer"] == 1.0
    assert not any(k.endswith("/aggregator") for k in m if k.startswith("eval/choice/"))
