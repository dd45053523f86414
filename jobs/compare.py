"""The side-by-side comparison of a sweep's runs: `python -m jobs.compare RUN_DIR|SWEEP_DIR [...] --out DIR`,
and what a sweep with `compare: true` prints at its end (jobs/configs/compare_sharing.yaml).

For every run: its held-out accuracy at each evaluation, and for its coordinating roles (voting's aggregator,
eval_opt's evaluator, orch_workers' orchestrator and synthesizer) the parse rate (its turns the workflow could
parse), the evaluator's verdicts that match the true grade beside a judge always giving the more common grade,
and, for the roles that decide among other roles' answers (the aggregator, the synthesizer), the
decision accuracy (of the episodes in which at least one candidate was right, those whose final answer is
right) beside what a random pick, a majority vote and always taking the first candidate would have scored over
the same episodes, at base and at the final evaluation: a parse is not a decision, and a role no better than
its chance baselines does nothing. Then the report of jobs.report (plots, index.html) is written.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from jobs.report import RunRecord, eval_curve, find_runs, load_run, report

COORDINATING = ("aggregator", "evaluator", "orchestrator", "synthesizer")
# The chance baselines of a deciding role, as marl.episode_metrics.decision_baselines names them.
BASELINES = (("random", "a random pick"), ("majority", "a majority vote"),
             ("always_first", "always the first"))


def parse_rate(row: dict[str, Any], role: str, prefix: str = "eval/") -> float:
    """1 - parse failures / turns of `role` in one evaluation's metrics (NaN when it had no turn)."""
    turns = float(row.get(f"{prefix}turns/{role}", 0.0))
    return 1.0 - float(row.get(f"{prefix}parse_failures/{role}", 0.0)) / turns if turns else math.nan


def _fmt(value: float, n: float | None = None) -> str:
    if value != value:
        return "  –  "
    return f"{value:.2f}" + (f" (of {int(n)})" if n is not None else "")


def _metric(row: dict[str, Any], key: str) -> float:
    return float(row.get(key, math.nan))


def decision_line(base: dict[str, Any], final: dict[str, Any], role: str) -> str:
    """A deciding role's accuracy at base -> final evaluation, each with its denominator, then its chance
    baselines over the same episodes."""
    def at(row: dict[str, Any], prefix: str, name: str, n: bool = False) -> str:
        return _fmt(_metric(row, f"{prefix}choice/{name}/{role}"),
                    row.get(f"{prefix}choice/available/{role}") if n else None)

    text = (f"decides right {at(base, 'eval/before/', 'accuracy', True)} -> "
            f"{at(final, 'eval/', 'accuracy', True)}")
    chance = [f"{label} {at(base, 'eval/before/', name)} -> {at(final, 'eval/', name)}"
              for name, label in BASELINES if f"eval/before/choice/{name}/{role}" in base]
    return text + (f" (chance: {', '.join(chance)})" if chance else "")


def verdict_line(base: dict[str, Any], final: dict[str, Any], role: str) -> str:
    """A judging role's verdicts that match the true grade, at base -> final, beside a judge always giving
    the more common grade."""
    def at(row: dict[str, Any], prefix: str, name: str) -> str:
        return _fmt(_metric(row, f"{prefix}verdict/{name}/{role}"))

    return (f"judges right {at(base, 'eval/before/', 'accuracy')} -> {at(final, 'eval/', 'accuracy')} "
            f"(chance: always the more common grade {at(base, 'eval/before/', 'majority')} -> "
            f"{at(final, 'eval/', 'majority')})")


def role_lines(run: RunRecord) -> list[str]:
    """The coordinating roles' parse rates, and the deciding roles' accuracy beside their chance baselines,
    at base -> final evaluation."""
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
            line += f"; {decision_line(base, final, role)}"
        if f"eval/before/verdict/accuracy/{role}" in base:
            line += f"; {verdict_line(base, final, role)}"
        if f"eval/before/choice/first/{role}" in base:
            first = (f"{_fmt(float(base[f'eval/before/choice/first/{role}']))} -> "
                     f"{_fmt(_metric(final, f'eval/choice/first/{role}'))}")
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
