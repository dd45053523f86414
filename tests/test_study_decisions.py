"""The coordinating role's decisions against their chance baselines (studies/cpu_smollm2_v3/decisions.py),
by hand on tiny fixtures: the measures, the plurality's two tie rules, and a voting run graded again from its
committed turns."""

from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.parquet as pq

from marl.tasks.data import load_tasks
from studies.cpu_smollm2_v3.decisions import decision_measures, first_choices, plurality, voting_decisions

SPEC = "reasoning_gym:chain_sum?min_terms=2&max_terms=2&min_digits=1&max_digits=2"


def test_plurality_splits_ties_or_takes_the_first_and_ignores_unread_answers():
    assert plurality([("5", 0.0), ("7", 1.0), ("7", 1.0)]) == 1.0
    assert plurality([("5", 0.0), ("7", 1.0), ("9", 0.0)]) == 1 / 3
    assert plurality([("5", 0.0), ("7", 1.0), ("9", 0.0)], "first") == 0.0
    assert plurality([(None, 0.0), ("7", 1.0), ("9", 0.0)], "first") == 1.0  # None casts no vote
    assert plurality([(None, 0.0), (None, 0.0)]) == 0.0


def test_decision_measures_by_hand():
    episodes = [  # candidates (answer, score), the decision's score
        ([("3", 0.0), ("4", 1.0), ("4", 1.0)], 0.0),  # right available, picked response 1 (wrong)
        ([("4", 1.0), ("2", 0.0), ("5", 0.0)], 1.0),  # right available, picked response 1 (right)
        ([("2", 0.0), ("2", 0.0), (None, 0.0)], 0.0),  # none right: out of the "on those" measures
    ]
    m = decision_measures(episodes)
    assert m["available"] == 2 and m["decision"] == 0.5 and m["first"] == 0.5
    assert math.isclose(m["random"], (2 / 3 + 1 / 3) / 2)
    assert math.isclose(m["majority_available"], (1.0 + 1 / 3) / 2)
    assert math.isclose(m["accuracy"], 1 / 3) and math.isclose(m["majority"], (1 + 1 / 3 + 0) / 3)
    assert math.isclose(m["majority_first"], (1 + 1 + 0) / 3)
    assert math.isnan(decision_measures([([("2", 0.0)], 0.0)])["decision"])


def test_voting_decisions_grade_the_generators_and_take_the_aggregators_choice(tmp_path):
    (tmp_path / "config.yaml").write_text(
        f"data:\n  eval: '{SPEC}'\n  eval_size: 2\n  eval_seed: 0\n  task: math\n  answer_fallback: none\n")
    tasks = load_tasks(SPEC, 2, 1_000_000_000, "math")
    right = [f"\\boxed{{{t.answer}}}" for t in tasks]
    # episode 0: generator1 alone right, the aggregator picks 2; episode 1: generator0 right, prose -> 1
    rows = [(0, "generator", "generator2", "\\boxed{-3}"), (0, "generator", "generator0", "\\boxed{-1}"),
            (0, "generator", "generator1", right[0]), (0, "aggregator", "aggregator", "\\boxed{2}"),
            (1, "generator", "generator0", right[1]), (1, "generator", "generator1", "no"),
            (1, "generator", "generator2", "\\boxed{-2}"), (1, "aggregator", "aggregator", "I pick the best")]
    turns = [{"step": 10, "episode": ep, "task_id": tasks[ep].task_id, "role": role, "agent": agent,
              "response": text} for ep, role, agent, text in rows]
    pq.write_table(pa.Table.from_pylist(turns), tmp_path / "eval_turns.parquet")
    decisions = voting_decisions(tmp_path)
    assert [(scores, d) for scores, d in ([[s for _, s in c], d] for c, d in decisions[10])] == [
        ([0.0, 1.0, 0.0], 1.0), ([1.0, 0.0, 0.0], 1.0)]  # candidates in generator order
    assert first_choices(tmp_path) == [1]
