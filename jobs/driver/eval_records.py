"""Per-task held-out results: every evaluation appends (steps_done, task_id, reward) rows to
`<run>/eval_tasks.csv`, so that two runs evaluated on the same tasks (data.eval_seed) can be compared task
by task (a paired test), and reports the evaluation's parse failures per role
(`eval/parse_failures/<role>`, of `eval/episodes`).

Every evaluation's turns (what each role wrote) also go to `<run>/eval_rollouts/eval_<steps_done>.parquet`, in
the training rollouts' schema (rollout/storage.py, `step` = steps done), so that a claim about what a role
wrote at evaluation can be checked against the text.

A resumed run evaluates again at steps it had already evaluated after its checkpoint: the reader keeps the
last row written for each (steps_done, task_id), and the turns' file of that evaluation is rewritten.
"""

from __future__ import annotations

import csv
from pathlib import Path

from marl.episode_metrics import choice_metrics, verdict_metrics
from marl.tasks.base import TaskFamily
from marl.types import Episode
from rollout.storage import write_episodes

FILE = "eval_tasks.csv"
TURNS_DIR = "eval_rollouts"
HEADER = ("steps_done", "task_id", "reward")


def append_eval(run_dir: Path, steps_done: int, episodes: list[Episode]) -> None:
    """Append one evaluation's rows (one per episode: one sample per held-out task)."""
    if not episodes:
        return
    path = run_dir / FILE
    new = not path.exists()
    with path.open("a", newline="") as f:
        writer = csv.writer(f)
        if new:
            writer.writerow(HEADER)
        writer.writerows((steps_done, e.task.task_id, f"{e.reward:g}") for e in episodes)


def write_eval_turns(run_dir: Path, steps_done: int, episodes: list[Episode]) -> Path | None:
    """One evaluation's turns as `<run>/eval_rollouts/eval_<steps_done>.parquet` (None without episodes)."""
    if not episodes:
        return None
    path = run_dir / TURNS_DIR / f"eval_{steps_done:06d}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_episodes(episodes, steps_done, path)
    return path


def read_eval(run_dir: Path) -> dict[int, dict[str, float]]:
    """steps_done -> task_id -> reward ({} without the file); the last row of each pair wins."""
    path = run_dir / FILE
    if not path.is_file():
        return {}
    out: dict[int, dict[str, float]] = {}
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            out.setdefault(int(row["steps_done"]), {})[row["task_id"]] = float(row["reward"])
    return out


def _plan(episode: Episode) -> str:
    fmt = episode.score_info.get("plan_format")
    return f"plan_format/{fmt}" if fmt else ""


def eval_metrics(episodes: list[Episode], family: TaskFamily | None = None) -> dict[str, float]:
    """eval/accuracy (pass@1: the mean reward, NaN without tasks), eval/episodes, eval/parse_failures/<role>
    (turns of that role the workflow could not parse, summed over the episodes), eval/failures/<reason>
    (episodes the workflow ended early: too_many_strategies, unparsable_plan), eval/plan_format/<format>
    (orch_workers: how its parser read each plan, strategy | numbered | lines | none), eval/turns/<role> and
    eval/response_len/<role> (mean response tokens), and with `family` the coordinating roles' decision
    accuracy beside its chance baselines: the aggregator's choice (eval/choice/*, choice_metrics) and the
    evaluator's verdict against the true grade (eval/verdict/*, verdict_metrics, marl.episode_metrics)."""
    out = {"eval/accuracy": sum(e.reward for e in episodes) / len(episodes) if episodes else float("nan"),
           "eval/episodes": float(len(episodes))}
    lengths: dict[str, list[int]] = {}
    for e in episodes:
        for role, count in e.parse_failures.items():
            out[f"eval/parse_failures/{role}"] = out.get(f"eval/parse_failures/{role}", 0.0) + count
        for key in (f"failures/{e.failure}" if e.failure else "", _plan(e)):
            if key:
                out[f"eval/{key}"] = out.get(f"eval/{key}", 0.0) + 1
        for t in e.turns:
            lengths.setdefault(t.role, []).append(len(t.completion.response_ids))
    for role, n in lengths.items():
        out[f"eval/turns/{role}"] = float(len(n))
        out[f"eval/response_len/{role}"] = sum(n) / len(n)
    if family is not None:
        decisions = {**choice_metrics(episodes, family), **verdict_metrics(episodes, family)}
        out.update({f"eval/{k}": v for k, v in decisions.items()})
    return out
