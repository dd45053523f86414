"""The side-by-side comparison of a sweep's runs: `python -m jobs.compare RUN_DIR|SWEEP_DIR [...] --out DIR`,
and what a sweep with `compare: true` prints at its end (jobs/configs/compare_sharing.yaml).

For every run: its held-out accuracy at each evaluation, and for its coordinating role (voting's aggregator,
eval_opt's evaluator, orch_workers' orchestrator) the parse rate (its turns the workflow could parse) and, for
the aggregator, the choice accuracy (of the episodes in which at least one generator was right, those where it
chose a right one) at base and at the final evaluation. Then the report of jobs.report (plots, index.html) is
written.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from jobs.report import RunRecord, eval_curve, find_runs, load_run, report

COORDINATING = ("aggregator", "evaluator", "orchestrator")


def parse_rate(row: dict[str, Any], role: str, prefix: str = "eval/") -> float:
    """1 - parse failures / turns of `role` in one evaluation's metrics (NaN when it had no turn)."""
    turns = float(row.get(f"{prefix}turns/{role}", 0.0))
    return 1.0 - float(row.get(f"{prefix}parse_failures/{role}", 0.0)) / turns if turns else math.nan


def _fmt(value: float, n: float | None = None) -> str:
    if value != value:
        return "  –  "
    return f"{value:.2f}" + (f" (of {int(n)})" if n is not None else "")


def _choice(row: dict[str, Any], role: str, prefix: str = "eval/") -> str:
    """Choice accuracy and its denominator (the episodes with at least one right candidate)."""
    return _fmt(float(row.get(f"{prefix}choice/accuracy/{role}", math.nan)),
                row.get(f"{prefix}choice/available/{role}"))


def role_lines(run: RunRecord) -> list[str]:
    """The coordinating role's parse rate, and the aggregator's choice accuracy, at base -> final
    evaluation."""
    empty: dict[str, Any] = {}
    base = next((r for r in run.rows if "eval/before/episodes" in r), empty)
    final = next((r for r in reversed(run.rows) if "eval/episodes" in r and "time/step_s" not in r), empty)
    lines = []
    for role in COORDINATING:
        if f"eval/before/turns/{role}" not in base:
            continue
        before, after = _fmt(parse_rate(base, role, "eval/before/")), _fmt(parse_rate(final, role))
        line = f"  {run.sharing:<9} {role}: parses {before} at base -> {after} after training"
        if f"eval/before/choice/accuracy/{role}" in base:
            chose = f"{_choice(base, role, 'eval/before/')} -> {_choice(final, role)}"
            line += f"; chooses a right answer {chose}"
        if f"eval/before/choice/first/{role}" in base:
            first = (f"{_fmt(float(base[f'eval/before/choice/first/{role}']))} -> "
                     f"{_fmt(float(final.get(f'eval/choice/first/{role}', math.nan)))}")
            line += f"; picks the first response shown {first}"
        lines.append(line)
    return lines


def comparison(runs: list[RunRecord]) -> str:
    """The table the compare command prints: held-out curves, then the coordinating roles."""
    lines = ["held-out accuracy by training steps done:"]
    for run in runs:
        xs, ys = eval_curve(run.rows)
        curve = "  ".join(f"{x}: {y:.3f}" for x, y in zip(xs, ys, strict=True)) or "no evaluation recorded"
        lines.append(f"  {run.label}   {curve}")
    roles = [line for run in runs for line in role_lines(run)]
    if roles:
        lines += ["coordinating roles at base -> after training (held-out evaluations):", *roles]
    return "\n".join(lines)


def compare(paths: list[Path], out: Path) -> str:
    """The comparison of every run at or under `paths`, and the report written to `out`."""
    runs = [load_run(p) for p in find_runs(paths)]
    if not runs:
        where = ", ".join(map(str, paths))
        raise FileNotFoundError(f"no run dirs (folders with metrics.jsonl) at or under {where}")
    index = report(paths, out)
    return f"{comparison(runs)}\nreport with plots: {index}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.compare", description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path, help="run dirs, or folders (sweeps) holding run dirs")
    parser.add_argument("--out", type=Path, required=True, help="folder for the report's PNGs and index.html")
    args = parser.parse_args(argv)
    try:
        print(compare(args.paths, args.out))
    except FileNotFoundError as e:
        print(f"compare: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
