"""A coordinating role's decisions against their chance baselines, graded again from committed evaluation
turns: study 3's voting aggregator (its pick among the generators) and study 4's synthesizer (its answer
over the workers').

An episode's candidates are the answering turns the role read (generators, workers), each graded by the run's
task family; its decision is the score the role's output earned (the picked candidate's, or the role's own
answer's). Over the episodes where some candidate was right (the only ones where a decision can matter), the
decision's accuracy is held against always taking the first candidate, a random pick (in expectation, the
right candidates' share) and a plurality vote over the candidates' answers; over every episode, the
decision's accuracy against the plurality vote's.
"""

from __future__ import annotations

import functools
import statistics
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq

from jobs.driver.run_data import EVAL_SEED_OFFSET
from marl.tasks import get_family
from marl.tasks.data import load_tasks
from marl.types import Episode, Task
from marl.workflows import voting
from studies.cpu_smollm2.collect import _table
from studies.cpu_smollm2_v2.collect import Run, by_arm
from studies.cpu_smollm2_v2.collect import _config as config_of

Graded = tuple[str | None, float]  # an answer as the task family reads it, and its score
# Per episode: the candidates' graded answers in the order the role read them, and the decision's score.
Decision = tuple[list[Graded], float]


def _mean_columns(series: list[list[float]]) -> list[str]:
    """Mean over seeds at each evaluation (NaNs left out), formatted to 3 places."""
    columns = list(zip(*series, strict=False))
    return ["–" if not (v := [x for x in col if x == x]) else f"{statistics.fmean(v):.3f}" for col in columns]
MEASURES = ("available", "decision", "first", "random", "majority_available", "accuracy", "majority",
            "majority_first")


@functools.cache
def graded_by_episode(run_dir: Path, role: str) -> dict[int, dict[int, list[Graded]]]:
    """Per evaluation (steps done), per episode id: each of `role`'s turns graded again from the committed
    turns (its answer as the run's task family reads it, and its score), in agent order. The held-out tasks
    are drawn again as the run drew them (data.eval, its size, eval_seed + EVAL_SEED_OFFSET), which the
    committed turns do not hold. Cached: the committed runs are read by several tables."""
    data = config_of(run_dir)["data"]
    tasks = load_tasks(data["eval"], data["eval_size"], data["eval_seed"] + EVAL_SEED_OFFSET, data["task"])
    by_id = {t.task_id: t for t in tasks}
    family = get_family(data["task"], data.get("answer_fallback", "none"))
    columns = ["step", "episode", "task_id", "role", "agent", "response"]
    turns = [t for t in pq.read_table(run_dir / "eval_turns.parquet", columns=columns).to_pylist()
             if t["role"] == role]
    episodes: dict[int, dict[int, list[Graded]]] = {}
    # in agent order (generator0, generator1, ...): the order the coordinating role read them
    for turn in sorted(turns, key=lambda t: (t["step"], len(t["agent"]), t["agent"])):
        answer = family.extract_answer(turn["response"])
        graded = (answer, float(family.score(by_id[turn["task_id"]], answer)))
        episodes.setdefault(turn["step"], {}).setdefault(turn["episode"], []).append(graded)
    return dict(sorted(episodes.items()))


def plurality(candidates: list[Graded], ties: str = "split") -> float:
    """The score of a plurality vote over the candidates' read answers; an unread answer (None) casts no vote,
    and 0.0 when none was read. Ties: "split" evenly (the expected score of a random pick among the tied
    answers), or "first", the tied answer that came first (with three different answers, the first
    candidate's)."""
    votes = Counter(answer for answer, _ in candidates if answer is not None)
    if not votes:
        return 0.0
    top = max(votes.values())
    score = {answer: s for answer, s in candidates}
    tied = [a for a in dict.fromkeys(a for a, _ in candidates) if a is not None and votes[a] == top]
    return score[tied[0]] if ties == "first" else statistics.fmean(score[a] for a in tied)


def decision_measures(episodes: list[Decision]) -> dict[str, float]:
    """MEASURES over `episodes` [n]: `available`, the episodes with a right candidate (a count); on those, the
    decision's accuracy, always-first's, a random pick's (the right candidates' share, averaged) and the
    plurality vote's (NaN when there are none); over all episodes, the decision's accuracy and the plurality
    vote's, ties split and ties to the first."""
    right = [(c, d) for c, d in episodes if any(s > 0 for _, s in c)]

    def mean(values: list[float]) -> float:
        return statistics.fmean(values) if values else float("nan")

    return {
        "available": float(len(right)),
        "decision": mean([d for _, d in right]),
        "first": mean([c[0][1] for c, _ in right]),
        "random": mean([statistics.fmean(s for _, s in c) for c, _ in right]),
        "majority_available": mean([plurality(c) for c, _ in right]),
        "accuracy": mean([d for _, d in episodes]),
        "majority": mean([plurality(c) for c, _ in episodes]),
        "majority_first": mean([plurality(c, "first") for c, _ in episodes]),
    }


def aggregator_choices(run_dir: Path, k: int = 3) -> dict[int, dict[int, int]]:
    """Per evaluation (steps done), per episode: the aggregator's 1-based choice as the voting workflow made
    it (its parser, then its fallback: the first standalone 1..k, else response 1), read from the committed
    turns. Study 3 ran without shuffled candidates, so response i is generator i-1's."""
    columns = ["step", "episode", "role", "response"]
    choices: dict[int, dict[int, int]] = {}
    blank = Task("", "", "")
    for turn in pq.read_table(run_dir / "eval_turns.parquet", columns=columns).to_pylist():
        if turn["role"] == "aggregator":
            choice = voting.choose(turn["response"], k, Episode(blank, 0, voting.NAME))
            choices.setdefault(turn["step"], {})[turn["episode"]] = choice
    return dict(sorted(choices.items()))


def voting_decisions(run_dir: Path) -> dict[int, list[Decision]]:
    """Per evaluation: each episode's generators, graded, and the score of the one the aggregator picked."""
    generators, choices = graded_by_episode(run_dir, "generator"), aggregator_choices(run_dir)
    return {step: [(c, c[choices[step][e] - 1][1]) for e, c in episodes.items()]
            for step, episodes in generators.items()}


def first_choices(run_dir: Path) -> list[int]:
    """Per evaluation: how many of the aggregator's turns chose response 1 (as the workflow chose)."""
    return [sum(c == 1 for c in by_episode.values()) for by_episode in aggregator_choices(run_dir).values()]


# (label, the measure of decision_measures, or "ones" for first_choices), in the table's order
DECISION_ROWS = (
    ("episodes with a right candidate", "available"),
    ("aggregator's pick, on those", "decision"),
    ("always response 1, on those", "first"),
    ("a random pick, on those", "random"),
    ("majority over the generators, on those", "majority_available"),
    ("aggregator's pick, all episodes (the arm's accuracy)", "accuracy"),
    ("majority over the generators, all episodes (ties split)", "majority"),
    ("majority over the generators, all episodes (ties to the first)", "majority_first"),
    ("turns choosing response 1 (of 64)", "ones"),
)


def decisions_table(runs: list[Run]) -> str:
    """Voting arms, mean over seeds at each evaluation: the aggregator's decisions against always taking
    response 1, a random pick and a majority vote over the generators (decision_measures), and how often it
    chose response 1. Found after the data (issue 51's recompute)."""
    rows = []
    for arm, group in by_arm(runs).items():
        if not arm.startswith("voting"):
            continue
        per_run = [[decision_measures(e) for e in voting_decisions(r.record.path).values()] for r in group]
        ones = [[float(n) for n in first_choices(r.record.path)] for r in group]
        for label, key in DECISION_ROWS:
            series = ones if key == "ones" else [[m[key] for m in run] for run in per_run]
            rows.append([arm, label, *_mean_columns(series)])
    return _table(["arm", "measure", "step 0", "10", "20", "30", "40"], rows)
