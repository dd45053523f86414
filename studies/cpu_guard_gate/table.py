"""The guarded gate's table (jobs/configs/sweeps/cpu_guard_gate.yaml):
`python -m studies.cpu_guard_gate.table RUNS_DIR [...] [--export DIR]` prints, per run, the guarded
coordinating role at base beside study 3's unguarded gate run of the same role (studies/cpu_smollm2_v3/gate/):
its parse rate, what its decisions scored against their chance baselines, its mean response length, the share
of its turns whose free text used the whole budget, and the episodes the workflow ended early.

Decisions, all from the base evaluation's metrics (eval/before/*, jobs/driver/eval_records.py):
- voting's aggregator: its choice accuracy on the episodes where some generator was right, against a random
  pick, always the first response shown, and a majority vote over the generators (marl.episode_metrics);
- eval-opt's evaluator: its verdicts' accuracy against the true grade of the answer it judged, against a judge
  always giving the more common grade, and how often it says Correct on right and on wrong answers (from the
  turns, where a run has them);
- the orchestrator decides no answer: its plans' strategy counts are shown, and the synthesizer's choice
  accuracy downstream of them against its baselines.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from omegaconf import OmegaConf

from jobs.report import find_runs, load_run
from marl.workflows.common import parse_verdict
from studies.cpu_smollm2.collect import _fmt, _table
from studies.cpu_smollm2_v3.collect import copy_runs
from studies.cpu_smollm2_v3.decisions import decision_measures, graded_by_episode, voting_decisions
from studies.cpu_smollm2_v3.gate import COORDINATING, FAILURES, _cap, parsed_turns, wilson
from studies.cpu_smollm2_v4.mechanics import synthesizer_decisions

HERE = Path(__file__).resolve().parent
UNGUARDED = HERE.parent / "cpu_smollm2_v3" / "gate"
B = "eval/before/"


def regraded(path: Path, role: str) -> dict[str, float]:
    """The base evaluation's decision metrics (eval/before/* as the trainer names them) graded again from a
    committed run's turns, for a run from before the trainer recorded them (study 3's gate)."""
    if role == "evaluator":
        pairs = verdict_pairs(path)
        share = statistics.fmean(g for _, g in pairs) if pairs else math.nan
        accuracy = statistics.fmean(v == g for v, g in pairs) if pairs else math.nan
        return {"verdict/judged/evaluator": float(len(pairs)), "verdict/accuracy/evaluator": accuracy,
                "verdict/majority/evaluator": max(share, 1 - share)}
    decider, decisions = (("aggregator", voting_decisions(path)) if role == "aggregator"
                          else ("synthesizer", synthesizer_decisions(path)))
    m = decision_measures(decisions.get(0, []))
    return {f"choice/{name}/{decider}": m[measure] for name, measure in
            (("available", "available"), ("accuracy", "decision"), ("random", "random"),
             ("always_first", "first"), ("majority", "majority_available"))}


def verdict_pairs(path: Path) -> list[tuple[bool, bool]]:
    """(verdict, true grade) of each evaluator turn at base: its verdict as the workflow reads it (unparsable
    = Incorrect) against the grade of the generator answer of the same round."""
    graded = graded_by_episode(path, "generator").get(0, {})
    columns = ["step", "episode", "role", "round", "response"]
    rows = [t for t in pq.read_table(path / "eval_turns.parquet", columns=columns).to_pylist()
            if t["step"] == 0 and t["role"] == "evaluator"]
    return [(bool(parse_verdict(t["response"])), graded[t["episode"]][t["round"]][1] == 1.0)
            for t in sorted(rows, key=lambda t: (t["episode"], t["round"]))]


def verdict_split(pairs: list[tuple[bool, bool]]) -> tuple[int, int, int, int]:
    """(Correct verdicts on right answers, right answers, Correct verdicts on wrong answers, wrong answers):
    whether the verdicts tell the grades apart at all, which their accuracy against the majority grade hides
    when nearly every answer is wrong."""
    right = [v for v, g in pairs if g]
    wrong = [v for v, g in pairs if not g]
    return sum(right), len(right), sum(wrong), len(wrong)


def decision(first: dict[str, Any], role: str, path: Path) -> str:
    """The role's decisions against their baselines, as one cell: 'accuracy (baseline a, baseline b, ...)'."""
    known = {k.removeprefix(B): v for k, v in first.items() if k.startswith(B)}
    if not any(k.startswith(("choice/random/", "verdict/majority/")) for k in known):
        for key, value in regraded(path, role).items():
            known.setdefault(key, value)
    get = lambda key: float(known.get(key, math.nan))  # noqa: E731
    if role == "evaluator":
        split = ""
        if (path / "eval_turns.parquet").is_file():
            on_right, right, on_wrong, wrong = verdict_split(verdict_pairs(path))
            split = f"; Correct on {on_right} / {right} right answers, {on_wrong} / {wrong} wrong ones"
        return (f"{_fmt(get('verdict/accuracy/evaluator'))} of {int(get('verdict/judged/evaluator') or 0)} "
                f"verdicts (majority grade {_fmt(get('verdict/majority/evaluator'))}{split})")
    decider = "aggregator" if role == "aggregator" else "synthesizer"
    if math.isnan(get(f"choice/accuracy/{decider}")):
        return "not recorded"
    base = ", ".join(f"{name} {_fmt(get(f'choice/{name}/{decider}'))}"
                     for name in ("random", "always_first", "majority"))
    prefix = "" if decider == role else "synthesizer "
    return (f"{prefix}{_fmt(get(f'choice/accuracy/{decider}'))} of "
            f"{int(get(f'choice/available/{decider}'))} ({base})")


def _guarded(path: Path, role: str) -> bool:
    guard = OmegaConf.select(OmegaConf.load(path / "config.yaml"), f"marl.guards.{role}", default=None)
    return guard is not None


def row(path: Path) -> list[str] | None:
    record = load_run(path)
    role = COORDINATING.get(record.workflow)
    if role is None or not record.rows:
        return None
    first = record.rows[0]
    parsed, turns = parsed_turns(first, role)
    low, high = wilson(parsed, turns)
    rate = f"{parsed} / {turns} = {_fmt(parsed / turns)} ({_fmt(low)}–{_fmt(high)})" if turns else "–"
    ended = sum(int(first.get(f"{B}failures/{f}", 0)) for f in FAILURES)
    at_budget = first.get(f"{B}guard/at_budget/{role}")
    return [record.workflow, role, "guarded" if _guarded(path, role) else "unguarded", _cap(path, role), rate,
            decision(first, role, path), _fmt(float(first.get(f"{B}response_len/{role}", math.nan))),
            "–" if at_budget is None else _fmt(float(at_budget)), str(ended),
            _fmt(float(first.get("eval/accuracy_before", math.nan)))]


def table(paths: list[Path]) -> str:
    rows = [r for r in (row(p) for p in find_runs(paths)) if r is not None]
    rows.sort(key=lambda r: (r[0], r[2] != "unguarded", int(r[3]) if r[3].isdigit() else 0))
    return _table(["workflow", "role", "guard", "cap", "parsed at base (95 %)",
                   "decisions (chance baselines)", "mean tokens", "at budget", "episodes ended",
                   "accuracy at base"], rows)


def unguarded_runs(guarded: list[Path]) -> list[Path]:
    """Study 3's gate run of each guarded run's role at the same cap, or the largest it gated."""
    out: list[Path] = []
    for path in find_runs(guarded):
        record = load_run(path)
        role = COORDINATING.get(record.workflow)
        if role is None:
            continue
        cells = sorted(UNGUARDED.glob(f"{record.workflow}-{role}-*"),
                       key=lambda p: int(p.name.rsplit("-")[-1]))
        same = [c for c in cells if c.name.endswith(f"-{_cap(path, role)}")]
        out += same or cells[-1:]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.cpu_guard_gate.table",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help="guarded gate run dirs, or the sweep folder")
    parser.add_argument("--export", type=Path,
                        help="copy the runs (metrics, config, curve, evaluation turns) into DIR first")
    args = parser.parse_args(argv)
    paths = args.paths
    if args.export:
        for sweep in args.paths:
            # Any commit, each run's own recorded in its metrics (the gate is not a pinned study), on a clean
            # tree; the slim evaluation turns go with them, as study 3's gate runs did.
            print("exported:", ", ".join(copy_runs(sweep, args.export, gate=True, commit=None)))
        paths = [args.export]
    print(table([*paths, *unguarded_runs(paths)]), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
