"""Study 3's viability gate table: `python -m studies.cpu_smollm2_v3.gate RUNS_DIR [...]` prints, per gate run
(jobs/configs/sweeps/cpu_study_v3_gate.yaml), the coordinating role's parse rate at base with its 95 % Wilson
interval, the episodes the workflow ended early, and whether the rate reaches the gate's 50 %.

The rate is over the role's turns in the base evaluation (eval/before/turns/<role>: eval-opt's evaluator
answers once per round). Voting's aggregator and eval-opt's evaluator count a turn as parsed when the workflow
parsed it (no eval/before/parse_failures/<role>); the orchestrator's plan counts when the workflow's own
parser read it as 'STRATEGY k:' lines or a numbered list (eval/before/plan_format/strategy and /numbered), as
the workflow accepts both; a plan read line by line, or blank, does not.

It then applies the README's two cap rules, fixed before the gate ran: voting's aggregator cap is the smaller
gated cap (32, 64) whose parse rate reaches 50 %; the answering cap is the smallest of 32, 48 and 64 within
which at least 90 % of the single-agent solver's base responses end (finish reason `stop`), measured at a cap
of 96 from that run's base evaluation turns (eval_rollouts/eval_000000.parquet); 64 when none does.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from omegaconf import OmegaConf

from jobs.driver.eval_records import TURNS_DIR
from jobs.report import find_runs, load_run
from rollout.storage import read_episodes
from studies.cpu_smollm2.collect import _fmt, _table

GATE_RATE = 0.5
COORDINATING = {"voting": "aggregator", "eval_opt": "evaluator", "orch_workers": "orchestrator"}
FAILURES = ("too_many_strategies", "unparsable_plan")
ANSWER_CAPS = (32, 48, 64)
ANSWER_SHARE = 0.9  # of base responses that must end (stop) within the answering cap


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


def base_lengths(run_dir: Path, role: str = "solver") -> list[tuple[int, str]]:
    """(response tokens, finish reason) of `role`'s turns in a run's base evaluation: from the run's own
    evaluation turns, or from the slim copy a committed run holds (collect.py's eval_turns.parquet)."""
    slim = run_dir / "eval_turns.parquet"
    if slim.is_file():
        rows = pq.read_table(slim, columns=["step", "role", "response_tokens", "finish_reason"]).to_pylist()
        return [
            (r["response_tokens"], r["finish_reason"]) for r in rows if r["step"] == 0 and r["role"] == role
        ]
    episodes = read_episodes(run_dir / TURNS_DIR / "eval_000000.parquet")
    return [(len(t.completion.response_ids), t.completion.finish_reason) for e in episodes for t in e.turns
            if t.role == role]


def ended_within(lengths: list[tuple[int, str]], cap: int) -> float:
    """Share of responses that ended on their own (`stop`) within `cap` tokens."""
    return sum(n <= cap and reason == "stop" for n, reason in lengths) / len(lengths) if lengths else math.nan


def answer_cap(lengths: list[tuple[int, str]]) -> int:
    """The smallest of ANSWER_CAPS within which ANSWER_SHARE of the responses end; the largest when none."""
    return next((c for c in ANSWER_CAPS if ended_within(lengths, c) >= ANSWER_SHARE), ANSWER_CAPS[-1])


def aggregator_cap(rows: list[list[str]]) -> int | None:
    """The smallest gated cap at which voting's aggregator passes (gate_rows' rows); None when none does."""
    caps = [int(r[2]) for r in rows if r[0] == "voting" and r[-1] == "yes"]
    return min(caps) if caps else None


def lengths_table(paths: list[Path]) -> tuple[str, int | None]:
    """The solver's base response lengths of the gate's single-agent run, and the answering cap they give."""
    runs = [p for p in find_runs(paths) if load_run(p).workflow == "single_agent"]
    if not runs:
        return "no single-agent gate run: the answering cap is not measured\n", None
    lengths = base_lengths(runs[0])
    ns = sorted(n for n, _ in lengths)
    cap = _cap_of(runs[0])
    rows = [[str(cap), str(len(ns)), str(ns[len(ns) // 2]), str(ns[int(0.9 * (len(ns) - 1))]), str(ns[-1]),
             *(_fmt(ended_within(lengths, c)) for c in ANSWER_CAPS)]]
    head = [
        "cap",
        "responses",
        "median tokens",
        "90th pct",
        "longest",
        *(f"end within {c}" for c in ANSWER_CAPS),
    ]
    return _table(head, rows), answer_cap(lengths)


def _cap_of(path: Path) -> str:
    return str(OmegaConf.select(OmegaConf.load(path / "config.yaml"), "rollout.sampling.max_new_tokens",
                                default="?"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.cpu_smollm2_v3.gate",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help="gate run dirs, or the sweep folder holding them")
    args = parser.parse_args(argv)
    rows = gate_rows(args.paths)
    print(gate_table(args.paths), end="")
    lengths, answer = lengths_table(args.paths)
    print("\nsingle-agent solver at base (its wording is voting's generators'):\n" + lengths, end="")
    aggregator = aggregator_cap(rows)
    if aggregator is None:
        print("voting's aggregator passes at no gated cap: voting is not testable with this prompt set")
        return 0
    if answer is not None:
        print(f"study caps by the README's rules: --answer-cap {answer} --aggregator-cap {aggregator}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
