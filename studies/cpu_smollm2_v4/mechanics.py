"""Study 4's per-role mechanics (README, "Per-role mechanics"), per evaluation, from the exported cells:
the committed evaluation turns (`eval_turns.parquet`) and metrics (`metrics.jsonl`).

Where each quantity lives: the orchestrator's plan is its evaluation turn, read again by the workflow's own
parser (`marl.workflows.common.parse_plan`: its strategies and the format it read them in; the exported
turns hold no episode `failure`, so an ended episode is a plan of no strategy or of more than
`marl.max_strategies`);
the synthesizer's decision is its episode's `episode_reward`, its candidates the worker turns graded again
(`studies/cpu_smollm2_v3/decisions.py`); response lengths are `eval/response_len/<role>` per evaluation;
gradient shares `grad/step_mass_share/<role>` and `grad/step_norm_share/<role>`, role norms
`grad/role_norm/<role>` and movement `update/policy_move/<policy>` per training step, averaged here over the
steps since the previous evaluation.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from marl.workflows.common import parse_plan
from studies.cpu_smollm2_v2.collect import _config as config_of
from studies.cpu_smollm2_v3.decisions import Decision, decision_measures, graded_by_episode

# The arms' folder names (<arm>/seed<s>/), as the export writes them.
SA, SP, IP = "single_agent-shared", "orch_workers-shared", "orch_workers-isolated"
PLAN_COUNTS = ("1", "2", "3", ">3", "0")
PLAN_FORMATS = ("strategy", "numbered", "lines", "none")


def is_orch(arm: str) -> bool:
    """An orchestrator-workers arm (SP or IP)."""
    return arm.startswith("orch_workers")


def plan_measures(run_dir: Path) -> dict[int, dict[str, float]]:
    """Per evaluation (steps done): the shares of the orchestrator's plans with 1, 2, 3, more than 3 and no
    strategies (PLAN_COUNTS), read in each format (PLAN_FORMATS), and `ended`: the share the workflow ended
    (no strategy, or more than marl.max_strategies)."""
    most = int(config_of(run_dir).get("marl", {}).get("max_strategies", 3))
    columns = ["step", "role", "response"]
    plans: dict[int, list[tuple[int, str]]] = {}
    for turn in pq.read_table(run_dir / "eval_turns.parquet", columns=columns).to_pylist():
        if turn["role"] == "orchestrator":
            strategies, read_as = parse_plan(turn["response"])
            plans.setdefault(turn["step"], []).append((len(strategies), read_as))
    out = {}
    for step, found in sorted(plans.items()):
        n = len(found)
        counts = [">3" if k > 3 else str(k) for k, _ in found]
        shares = {f"plans {c}": counts.count(c) / n for c in PLAN_COUNTS}
        shares |= {f"format {f}": sum(r == f for _, r in found) / n for f in PLAN_FORMATS}
        shares["ended"] = sum(k == 0 or k > most for k, _ in found) / n
        out[step] = shares
    return out


def synthesizer_decisions(run_dir: Path) -> dict[int, list[Decision]]:
    """Per evaluation: each episode's workers, graded again in worker order, and the score the synthesizer's
    answer earned (its episode's reward). Episodes the orchestrator ended have no worker and drop out."""
    workers = graded_by_episode(run_dir, "worker")
    columns = ["step", "episode", "role", "episode_reward"]
    reward = {(t["step"], t["episode"]): float(t["episode_reward"])
              for t in pq.read_table(run_dir / "eval_turns.parquet", columns=columns).to_pylist()
              if t["role"] == "synthesizer"}
    return {step: [(c, reward[(step, e)]) for e, c in episodes.items() if (step, e) in reward]
            for step, episodes in workers.items()}


def synthesizer_measures(run_dir: Path) -> dict[int, dict[str, float]]:
    """Per evaluation: decision_measures over the synthesizer's episodes ("first" is worker0)."""
    return {step: decision_measures(d) for step, d in synthesizer_decisions(run_dir).items()}


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and v == v else None


def windows(rows: list[dict[str, Any]], key: str, with_gradient: str = "") -> list[float]:
    """Per evaluation after the base: the mean of `key` over the training steps since the previous
    evaluation (the evaluation's own step included), NaN where none logged it. With `with_gradient` (a
    prefix), a step counts only when its values under that prefix sum above 0 (a step where no row carried an
    advantage logs every share as 0, which is not a share)."""
    out: list[float] = []
    values: list[float] = []
    for row in rows:
        v = _number(row.get(key))
        shares = [_number(x) for k, x in row.items() if with_gradient and k.startswith(with_gradient)]
        kept = not with_gradient or sum(x for x in shares if x is not None) > 0
        if v is not None and kept:
            values.append(v)
        if "eval/accuracy" in row:
            out.append(statistics.fmean(values) if values else math.nan)
            values = []
    return out


def role_norm_ratio(rows: list[dict[str, Any]], role: str, base: str = "worker") -> list[float]:
    """Per evaluation after the base: the median over the window's steps where both roles' rows carried a
    gradient of grad/role_norm/<role> over grad/role_norm/<base> (the authors' supervisory-over-worker
    ratio)."""
    out: list[float] = []
    ratios: list[float] = []
    for row in rows:
        a, b = _number(row.get(f"grad/role_norm/{role}")), _number(row.get(f"grad/role_norm/{base}"))
        if a and b and a > 0 and b > 0:
            ratios.append(a / b)
        if "eval/accuracy" in row:
            out.append(statistics.median(ratios) if ratios else math.nan)
            ratios = []
    return out


def roles_of(rows_of_runs: list[list[dict[str, Any]]], prefix: str) -> list[str]:
    """The roles (or policies) that logged a metric `<prefix><role>` in any of the runs' rows."""
    return sorted({k.rsplit("/", 1)[1] for rows in rows_of_runs for row in rows for k in row
                   if k.startswith(prefix)})
