"""Study 3's viability gate table: `python -m studies.cpu_smollm2_v3.gate RUNS_DIR [...]` prints, per gate run
(jobs/configs/sweeps/cpu_study_v3_gate.yaml), the coordinating role's parse rate at base with its 95 % Wilson
interval, the episodes the workflow ended early, and whether the rate reaches the gate's 50 %.

The rate is over the role's turns in the base evaluation (eval/before/turns/<role>: eval-opt's evaluator
answers once per round). Voting's aggregator and eval-opt's evaluator count a turn as parsed when the workflow
parsed it (no eval/before/parse_failures/<role>); the orchestrator's plan counts when the workflow's own
parser read it as 'STRATEGY k:' lines or a numbered list (eval/before/plan_format/strategy and /numbered), as
the workflow accepts both; a plan read line by line, or blank, does not.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from jobs.report import find_runs, load_run
from studies.cpu_smollm2.collect import _fmt, _table

GATE_RATE = 0.5
COORDINATING = {"voting": "aggregator", "eval_opt": "evaluator", "orch_workers": "orchestrator"}
FAILURES = ("too_many_strategies", "unparsable_plan")


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion k / n (95 % by default); (NaN, NaN) for n = 0."""
    if n == 0:
        return math.nan, math.nan
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def parsed_turns(first: dict[str, Any], role: str) -> tuple[int, int]:
    """(parsed, turns) of `role` in the base evaluation logged in a run's first metrics row."""
    turns = int(first.get(f"eval/before/turns/{role}", 0))
    if not turns:  # a run from before evaluations counted turns per role
        return 0, 0
    if role == "orchestrator":
        parsed = sum(int(first.get(f"eval/before/plan_format/{f}", 0)) for f in ("strategy", "numbered"))
    else:
        parsed = turns - int(first.get(f"eval/before/parse_failures/{role}", 0))
    return parsed, turns


def gate_rows(paths: list[Path]) -> list[list[str]]:
    rows = []
    for path in find_runs(paths):
        record = load_run(path)
        role = COORDINATING.get(record.workflow)
        if role is None or not record.rows:
            continue
        first = record.rows[0]
        parsed, turns = parsed_turns(first, role)
        low, high = wilson(parsed, turns)
        rate = parsed / turns if turns else math.nan
        interval = f"{_fmt(low)}–{_fmt(high)}" if turns else "–"
        ended = ", ".join(f"{f} {int(first.get(f'eval/before/failures/{f}', 0))}" for f in FAILURES
                          if record.workflow == "orch_workers")
        passes = "–" if rate != rate else "yes" if rate >= GATE_RATE else "no"
        counted = f"{parsed} / {turns}" if turns else "not recorded"
        rows.append([record.workflow, role, _cap(path, role), counted, _fmt(rate), interval, ended or "–",
                     passes])
    return sorted(rows, key=lambda r: (r[0], int(r[2]) if r[2].isdigit() else 0))


def _cap(path: Path, role: str) -> str:
    return str(OmegaConf.select(OmegaConf.load(path / "config.yaml"), f"rollout.role_max_new_tokens.{role}",
                                default="?"))


def gate_table(paths: list[Path]) -> str:
    return _table(["workflow", "role", "cap", "parsed turns", "parse rate at base", "95 % interval",
                   "episodes ended", ">= 50 %"], gate_rows(paths))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.cpu_smollm2_v3.gate",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help="gate run dirs, or the sweep folder holding them")
    args = parser.parse_args(argv)
    print(gate_table(args.paths), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
