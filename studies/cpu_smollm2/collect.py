"""The CPU study's committed results: `python -m studies.cpu_smollm2.collect [--sweep DIR] [--check]`.

1. Copies every cell's run (metrics.jsonl, config.yaml, and its held-out curve as eval_curve.csv; no rollouts,
   no weights) from the sweep's storage (default runs/sweeps/cpu_study) into studies/cpu_smollm2/runs/
   <workflow>-<sharing>/. Without a sweep folder the committed runs are used as they are.
2. Rewrites the README's measured tables (each between `<!-- table:NAME -->` and `<!-- /table -->`) from the
   committed runs, with the functions below, so every number in them is recomputed from the runs.
3. Regenerates the report (PNGs and index.html, jobs.report) under studies/cpu_smollm2/report/.

`--check` changes nothing and exits 1 when the README's tables differ from the committed runs'.
"""

from __future__ import annotations

import argparse
import csv
import math
import re
import shutil
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jobs.report import RunRecord, eval_curve, find_runs, load_run, report, role_series
from marl.cliff import CliffTracker, first_cliff

HERE = Path(__file__).resolve().parent
RUNS, REPORT, README = HERE / "runs", HERE / "report", HERE / "README.md"
SWEEP = Path("runs/sweeps/cpu_study")
ORDER = ("single_agent", "voting", "eval_opt", "orch_workers")  # table order; the baseline first
SUPERVISORS = ("aggregator", "evaluator", "orchestrator", "synthesizer")  # roles that judge or combine
DOERS = ("generator", "worker", "solver")  # roles that answer the task itself
# A role gradient norm below this is a policy whose log-probabilities saturated (it writes one text with
# probability ~1): its norm is rounding noise, 1e-8 to 1e-10 in orch_workers-isolated, and a ratio to it says
# nothing about the other role. Every other norm in the study is at least 2e-3.
VANISHED_NORM = 1e-4
TABLE = re.compile(r"(<!-- table:(\w+) -->\n)(.*?)(<!-- /table -->)", re.S)


def cell_name(run: RunRecord) -> str:
    return f"{run.workflow}-{run.sharing}"


def committed_runs(root: Path = RUNS) -> list[RunRecord]:
    """The study's runs, baseline first, then each workflow shared before isolated."""
    runs = [load_run(p) for p in find_runs([root])] if root.is_dir() else []
    return sorted(runs, key=lambda r: (ORDER.index(r.workflow) if r.workflow in ORDER else len(ORDER),
                                       r.sharing != "shared"))


def copy_runs(sweep: Path, root: Path = RUNS) -> list[str]:
    """Copies each run under `sweep` into `root`/<workflow>-<sharing>/; returns the cell names."""
    names = []
    for path in find_runs([sweep]):
        run = load_run(path)
        dest = root / cell_name(run)
        dest.mkdir(parents=True, exist_ok=True)
        for name in ("metrics.jsonl", "config.yaml"):
            if (path / name).is_file():
                shutil.copyfile(path / name, dest / name)
        xs, ys = eval_curve(run.rows)
        with open(dest / "eval_curve.csv", "w", newline="") as f:
            csv.writer(f).writerows([("steps_done", "accuracy"), *zip(xs, ys, strict=True)])
        names.append(cell_name(run))
    return names


# -- the numbers ---------------------------------------------------------------------------------------------

def steps_done(run: RunRecord) -> int:
    return sum("time/step_s" in r for r in run.rows)


def curve_summary(run: RunRecord) -> dict[str, Any]:
    """Base, peak (and the steps done at it), final held-out accuracy, and the cliff flags of the run's own
    cliff settings replayed over its evaluations (absolute: `drop` below the peak; relative: at most
    (1 - relative_drop) of it; each for `window` evaluations in a row)."""
    xs, ys = eval_curve(run.rows)
    if not ys:
        return {"base": math.nan, "peak": math.nan, "peak_at": -1, "final": math.nan, "final_at": -1,
                "cliff_abs": False, "cliff_rel": False, "cliff_recovered": False}
    drop, window, relative = run.cliff
    tracker = CliffTracker(drop=drop, window=int(window), relative_drop=relative)
    flagged = {"cliff_abs": False, "cliff_rel": False}
    for x, y in zip(xs, ys, strict=True):
        tracker.update(x, y)
        m = tracker.metrics()
        flagged["cliff_abs"] |= m["cliff/flagged_absolute"] == 1.0
        flagged["cliff_rel"] |= m["cliff/flagged_relative"] == 1.0
    peak = max(range(len(ys)), key=ys.__getitem__)
    event = first_cliff(ys, drop=drop, window=int(window), relative_drop=relative)
    return {"base": ys[0] if xs[0] == 0 else math.nan, "peak": ys[peak], "peak_at": xs[peak], "final": ys[-1],
            "final_at": xs[-1], **flagged, "cliff_recovered": event is not None and event.recovered}


def series(run: RunRecord, key: str) -> list[float]:
    """`key` over the run's training rows that recorded it, in step order."""
    return [float(r[key]) for r in run.rows if key in r and "time/step_s" in r and r[key] == r[key]]


def mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else math.nan


def roles_in(run: RunRecord, prefix: str) -> list[str]:
    """The roles (or policies) with a `prefix<name>` metric in the run."""
    return sorted(role_series(run.rows, prefix))


def _fmt(value: float, digits: int = 3) -> str:
    return "–" if value != value else f"{value:.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"


def results_table(runs: list[RunRecord]) -> str:
    """Per cell: steps done, base / peak / final held-out accuracy, the gain over single-agent RL at peak and
    at final, and the cliff flags."""
    single = next((curve_summary(r) for r in runs if r.workflow == "single_agent"), None)
    rows = []
    for run in runs:
        s = curve_summary(run)
        gain_peak = s["peak"] - single["peak"] if single else math.nan
        gain_final = s["final"] - single["final"] if single else math.nan
        cliff = (
            "/".join(n for n, f in (("absolute", s["cliff_abs"]), ("relative", s["cliff_rel"])) if f) or "no"
        )
        if s["cliff_recovered"]:
            cliff += ", recovered"
        rows.append(
            [
                run.workflow,
                "–" if run.single_role else run.sharing,
                str(steps_done(run)),
                _fmt(s["base"]),
                f"{_fmt(s['peak'])} @ {s['peak_at']}",
                f"{_fmt(s['final'])} @ {s['final_at']}",
                f"{gain_peak:+.3f}" if gain_peak == gain_peak else "–",
                f"{gain_final:+.3f}" if gain_final == gain_final else "–",
                cliff,
            ]
        )
    return _table(
        [
            "workflow",
            "sharing",
            "steps",
            "base",
            "peak @ steps",
            "final @ steps",
            "gain vs single (peak)",
            "gain vs single (final)",
            "cliff",
        ],
        rows,
    )


def _halves(values: list[float]) -> tuple[float, float]:
    half = len(values) // 2
    return mean(values[:half]), mean(values[half:])


def grad_ratio_table(runs: list[RunRecord]) -> str:
    """Per multi-role cell: each supervisory role's gradient norm over the doing role's, step by
    step (grad/role_norm, the mean over each policy's optimizer steps), over the steps where both
    norms are at least VANISHED_NORM (counted): averaged over the first and the second half of those
    steps, and over all of them."""
    rows = []
    for run in runs:
        roles = roles_in(run, "grad/role_norm/")
        doers = [r for r in roles if r in DOERS]
        for sup in (r for r in roles if r in SUPERVISORS):
            for doer in doers:
                pairs = [(row.get(f"grad/role_norm/{sup}"), row.get(f"grad/role_norm/{doer}"))
                         for row in run.rows if "time/step_s" in row]
                ratios = [s / d for s, d in pairs if s is not None and d is not None
                          and min(s, d) >= VANISHED_NORM]
                first, second = _halves(ratios)
                rows.append(
                    [
                        cell_name(run),
                        f"{sup} / {doer}",
                        str(len(ratios)),
                        _fmt(first, 2),
                        _fmt(second, 2),
                        _fmt(mean(ratios), 2),
                        _fmt(statistics.median(ratios) if ratios else math.nan, 2),
                    ]
                )
    return _table(
        [
            "cell",
            "norm ratio",
            "steps",
            "first half (mean)",
            "second half (mean)",
            "all steps (mean)",
            "all steps (median)",
        ],
        rows,
    )


def _updating(run: RunRecord, key: str) -> list[float]:
    """`key` over the training rows whose step had a gradient (some row with a non-zero advantage): a step
    whose every advantage was zero has all shares 0 and would pull the means towards it."""
    roles = roles_in(run, "grad/step_mass_share/")
    return [float(r[key]) for r in run.rows if key in r and "time/step_s" in r
            and sum(r.get(f"grad/step_mass_share/{x}", 0.0) for x in roles) > 0]


def role_share_table(runs: list[RunRecord]) -> str:
    """Per multi-role cell and role, over the steps that had a gradient: its share of the step's gradient mass
    and of the summed role gradient norms across policies, and the shared policy's dominance index; then the
    number of such steps, and the role's response length over the first and the last 5 steps (all steps)."""
    rows = []
    for run in runs:
        if run.single_role:
            continue
        dominance = mean(_updating(run, "grad/dominance/shared")) if run.sharing == "shared" else math.nan
        for role in roles_in(run, "grad/step_mass_share/"):
            lengths = series(run, f"response_len/mean/{role}")
            mass = _updating(run, f"grad/step_mass_share/{role}")
            norm = _updating(run, f"grad/step_norm_share/{role}")
            rows.append(
                [
                    cell_name(run),
                    role,
                    _fmt(mean(mass)),
                    _fmt(mean(norm)),
                    _fmt(dominance),
                    f"{len(mass)}/{steps_done(run)}",
                    _fmt(mean(lengths[:5]), 1),
                    _fmt(mean(lengths[-5:]), 1),
                ]
            )
    return _table(["cell", "role", "mass share (step)", "norm share (step)", "dominance (shared)",
                   "steps with a gradient", "response tokens, first 5 steps", "last 5 steps"], rows)


def optimizer_steps_table(runs: list[RunRecord]) -> str:
    """Optimizer steps each policy took per training step (the amplification channel): mean and range."""
    rows = []
    for run in runs:
        for policy in roles_in(run, "optim/steps/"):
            values = series(run, f"optim/steps/{policy}")
            rows.append([cell_name(run), policy, _fmt(mean(values), 2),
                         f"{min(values):.0f}–{max(values):.0f}" if values else "–"])
    return _table(["cell", "policy", "optimizer steps per step (mean)", "range"], rows)


def wall_table(runs: list[RunRecord]) -> str:
    """Wall time per cell on the 2-core box: training steps plus held-out evaluations (the base
    model's, every eval_every steps and the final one; start-up and checkpoint writes are not counted),
    and each phase's median per step."""
    rows, total = [], 0.0
    for run in runs:
        steps = sum(series(run, "time/step_s"))
        evals = sum(
            float(r.get("time/eval_s", 0.0)) + float(r.get("time/eval_before_s", 0.0)) for r in run.rows
        )
        total += steps + evals
        phases = [statistics.median(v) if (v := series(run, f"time/{p}_s")) else math.nan
                  for p in ("step", "rollout", "update", "sync")]
        rows.append([cell_name(run), _fmt((steps + evals) / 60, 1), _fmt(steps / 60, 1), _fmt(evals / 60, 1),
                     *(_fmt(p, 1) for p in phases)])
    rows.append(["all cells", _fmt(total / 60, 1), "", "", "", "", "", ""])
    return _table(["cell", "steps + evals (min)", "steps (min)", "evals (min)", "step (s, median)", "rollout",
                   "update", "sync"], rows)


TABLES: dict[str, Callable[[list[RunRecord]], str]] = {
    "results": results_table, "grad_ratio": grad_ratio_table, "role_share": role_share_table,
    "optimizer_steps": optimizer_steps_table, "wall": wall_table,
}


def tables(runs: list[RunRecord]) -> dict[str, str]:
    return {name: fn(runs) for name, fn in TABLES.items()}


def readme_tables(text: str) -> dict[str, str]:
    return {m.group(2): m.group(3) for m in TABLE.finditer(text)}


def rewrite_readme(text: str, computed: dict[str, str]) -> str:
    return TABLE.sub(lambda m: m.group(1) + computed.get(m.group(2), m.group(3)) + m.group(4), text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m studies.cpu_smollm2.collect", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--sweep", type=Path, default=SWEEP, help="the sweep's storage folder (copied if present)"
    )
    parser.add_argument("--check", action="store_true", help="only compare the README's tables with the runs")
    args = parser.parse_args(argv)
    if not args.check and args.sweep.is_dir():
        print(f"copied {', '.join(copy_runs(args.sweep)) or 'no runs'} from {args.sweep}")
    runs = committed_runs()
    computed, text = tables(runs), README.read_text()
    if args.check:
        stale = [n for n, t in readme_tables(text).items() if computed.get(n) != t]
        print(f"README tables {'differ: ' + ', '.join(stale) if stale else 'match'} the committed runs")
        return 1 if stale else 0
    README.write_text(rewrite_readme(text, computed))
    if runs:
        print(f"wrote {write_report()}")
    return 0


def write_report() -> Path:
    """The study's report, regenerated whole: the figure of a run no longer committed would stay behind,
    unreferenced."""
    for old in REPORT.glob("*.png"):
        old.unlink()
    return report([RUNS], REPORT)


if __name__ == "__main__":
    sys.exit(main())
