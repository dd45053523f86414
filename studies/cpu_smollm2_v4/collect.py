"""Study 4's tables from the exported cells: `python -m studies.cpu_smollm2_v4.collect [--root DIR]` reads
`<root>/runs/<arm>/seed<s>/` (the study) and `<root>/pilot/<arm>/seed100/` (the pilot, in no test) and writes
`<root>/results.md`: the arm table, the paired differences SP - IP with the declared tests (README,
"Analysis"), the cliffs, and the per-role mechanics per evaluation (mechanics.py), drawn beside it
(figures.py). It only reads runs; each was checked against the pinned commit when it was exported.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jobs.report import eval_curve
from studies.cpu_smollm2.collect import _fmt, _table
from studies.cpu_smollm2_v2.collect import Run, arms_table, by_arm, cliff, cliff_comparison, load
from studies.cpu_smollm2_v2.stats import last_mean
from studies.cpu_smollm2_v3.collect import run_minutes
from studies.cpu_smollm2_v4 import figures, mechanics
from studies.cpu_smollm2_v4.mechanics import IP, SA, SP
from studies.cpu_smollm2_v4.run import SEEDS
from studies.cpu_smollm2_v4.stats import differences, holm, sign_flip_interval, sign_flip_p, wilcoxon_p

HERE = Path(__file__).resolve().parent
ROLES = ("orchestrator", "worker", "synthesizer")
FIGURES = {"runs": "cpu_smollm2_v4_mechanics.png", "pilot": "cpu_smollm2_v4_pilot_mechanics.png"}
PEAK_NOTE = ("The peak is the highest of a run's five evaluations, a maximum over noisy values: it exceeds "
             "the run's true best accuracy on average (by about one binomial SE, ~0.05 at 64 tasks). "
             "Not tested.")


def committed(root: Path) -> list[Run]:
    """Every exported cell under `root` (<arm>/seed<s>/metrics.jsonl), in arm then seed order."""
    return [load(p.parent) for p in sorted(root.glob("*/seed*/metrics.jsonl"))]


def paired(runs: list[Run], x: str, y: str, value: Callable[[Run], float]) -> tuple[list[int], list[float]]:
    """The seeds both arms ran and x - y of `value` on each, in seed order."""
    arms = by_arm(runs)
    a = {r.seed: value(r) for r in arms.get(x, [])}
    b = {r.seed: value(r) for r in arms.get(y, [])}
    seeds = sorted(a.keys() & b.keys())
    return seeds, differences([a[s] for s in seeds], [b[s] for s in seeds])


def final(run: Run) -> float:
    return run.curve[-1]


def last3(run: Run) -> float:
    return last_mean(run.curve)


def seeds_table(runs: list[Run]) -> str:
    """Per seed: each arm's final and last-3 mean, and the paired differences SP - IP."""
    arms = {arm: {r.seed: r for r in group} for arm, group in by_arm(runs).items()}
    rows = []
    for seed in sorted({r.seed for r in runs}):
        cells = [arms.get(a, {}).get(seed) for a in (SA, SP, IP)]
        out = [str(seed)] + [f"{_fmt(final(r))} / {_fmt(last3(r))}" if r else "–" for r in cells]
        sp, ip = cells[1], cells[2]
        out += [f"{final(sp) - final(ip):+.3f}" if sp and ip else "–",
                f"{last3(sp) - last3(ip):+.3f}" if sp and ip else "–"]
        rows.append(out)
    return _table(["seed", "SA final / last-3", "SP final / last-3", "IP final / last-3", "SP - IP final",
                   "SP - IP last-3"], rows)


def tests(runs: list[Run]) -> list[tuple[str, str, float, float, str]]:
    """The declared tests in the README's order: (name, seeds or counts, the mean difference or NaN, its p,
    Wilcoxon's p or the test's name): the primary, then the four secondaries."""
    out = []
    for name, x, y, value in (("primary: SP - IP, final", SP, IP, final),
                              ("(a) SP - IP, last-3", SP, IP, last3),
                              ("(c) SP - SA, final", SP, SA, final), ("(d) IP - SA, final", IP, SA, final)):
        seeds, d = paired(runs, x, y, value)
        mean = statistics.fmean(d) if d else float("nan")
        out.append((name, str(len(seeds)), mean, sign_flip_p(d), _fmt(wilcoxon_p(d))))
    arms = by_arm(runs)
    if SP in arms and IP in arms:
        counts, p = cliff_comparison(arms[SP], arms[IP])
        out.insert(2, ("(b) cliffs SP vs IP", counts, float("nan"), p, "Fisher"))
    return out


def tests_table(runs: list[Run]) -> str:
    """The declared tests with their p: the sign-flip (Fisher for the cliffs), Wilcoxon beside it, Holm over
    the four secondaries, and Holm over all five as the sensitivity line; the primary's 95 % interval."""
    found = tests(runs)
    secondary = holm([t[3] for t in found[1:]])
    everything = holm([t[3] for t in found])
    rows = []
    for i, (name, n, mean, p, other) in enumerate(found):
        within = "– (judged alone)" if i == 0 else _fmt(secondary[i - 1])
        rows.append([name, n, "–" if mean != mean else f"{mean:+.3f}", _fmt(p), other, within,
                     _fmt(everything[i])])
    _, d = paired(runs, SP, IP, final)
    low, high = sign_flip_interval(d)
    interval = f"SP - IP final, 95 % interval (sign-flip inverted): {low:+.3f} to {high:+.3f}\n"
    return _table(["test", "seeds / cliffs", "mean difference", "p (sign-flip; Fisher)", "Wilcoxon p",
                   "Holm, secondaries", "Holm, all five"], rows) + "\n" + interval


def cliffs_table(runs: list[Run]) -> str:
    """Per arm: cliffs under study 2's rule, and which seeds."""
    rows = [[arm, f"{sum(map(cliff, g))}/{len(g)}", ",".join(str(r.seed) for r in g if cliff(r)) or "–"]
            for arm, g in by_arm(runs).items()]
    return _table(["arm", "cliffs", "seeds that cliffed"], rows)


def _mean(values: list[float]) -> str:
    kept = [v for v in values if v == v]
    return _fmt(statistics.fmean(kept)) if kept else "–"


def _columns(series: list[list[float]]) -> list[str]:
    """Mean over seeds at each position of the runs' series (NaNs left out), formatted."""
    return [_mean(list(c)) for c in zip(*series, strict=False)]


def _header(runs: list[Run], base: bool = True) -> list[str]:
    steps = eval_curve(runs[0].record.rows)[0][1:] if runs else []  # steps done at each evaluation
    return ["arm", "measure", *(["step 0"] if base else []), *map(str, steps)]


def plans_table(runs: list[Run]) -> str:
    """Orchestrator-workers arms: the plan count and format shares and the episodes ended, per evaluation."""
    rows = []
    for arm, group in by_arm(runs).items():
        if mechanics.is_orch(arm):
            per_run = [list(mechanics.plan_measures(r.record.path).values()) for r in group]
            for key in [f"plans {c}" for c in mechanics.PLAN_COUNTS] + [
                    f"format {f}" for f in mechanics.PLAN_FORMATS] + ["ended"]:
                rows.append([arm, key, *_columns([[m[key] for m in run] for run in per_run])])
    return _table(_header(runs), rows)


def synthesizer_table(runs: list[Run]) -> str:
    """Orchestrator-workers arms: the synthesizer's decision accuracy on the episodes where some worker was
    right, against worker0, a random worker and a majority over the workers; and over every episode."""
    labels = {"available": "episodes with a right worker", "decision": "synthesizer, on those",
              "first": "worker0, on those", "random": "a random worker, on those",
              "majority_available": "majority over workers, on those",
              "accuracy": "synthesizer, all episodes",
              "majority": "majority over workers, all (ties split)"}
    rows = []
    for arm, group in by_arm(runs).items():
        if mechanics.is_orch(arm):
            per_run = [list(mechanics.synthesizer_measures(r.record.path).values()) for r in group]
            for key, label in labels.items():
                rows.append([arm, label, *_columns([[m[key] for m in run] for run in per_run])])
    return _table(_header(runs), rows)


def training_table(runs: list[Run]) -> str:
    """Per arm, mean over seeds of each window's mean (the training steps since the previous evaluation):
    gradient mass and norm shares per role (steps with a gradient; role capture under SP), the per-role
    gradient norms' medians over the workers' (IP: the authors' 5-8x), and each policy's movement."""
    rows = []
    for arm, group in by_arm(runs).items():
        keys = sorted({k for r in group for row in r.record.rows for k in row
                       if k.startswith(("grad/step_mass_share/", "grad/step_norm_share/",
                                        "update/policy_move/"))})
        for key in keys:
            gate = key.rsplit("/", 1)[0] + "/" if key.startswith("grad/") else ""
            rows.append([arm, key, *_columns([mechanics.windows(r.record.rows, key, gate) for r in group])])
        for role in ("orchestrator", "synthesizer"):
            if any(f"grad/role_norm/{role}" in row for r in group for row in r.record.rows):
                rows.append([arm, f"{role} / worker norm (median)",
                             *_columns([mechanics.role_norm_ratio(r.record.rows, role) for r in group])])
    return _table(_header(runs, base=False), rows)


def lengths_table(runs: list[Run]) -> str:
    """Per arm and role: mean response tokens at each evaluation (eval/response_len/<role>)."""
    from studies.cpu_smollm2_v3.collect import eval_series  # the base's eval/before/* first, as study 3

    rows = []
    for arm, group in by_arm(runs).items():
        for role in mechanics.roles_of([r.record.rows for r in group], "eval/response_len/"):
            key = f"eval/response_len/{role}"
            rows.append([arm, f"{role} tokens", *_columns([eval_series(r.record.rows, key) for r in group])])
    return _table(_header(runs), rows)


def cell_minutes(rows: list[dict[str, Any]]) -> tuple[float, float]:
    """(training, evaluating) minutes a cell's logged rows record: the sum of `time/step_s`, and of
    `time/eval_s` with the base evaluation's `time/eval_before_s`. Start-up (Ray, the engines, the model) is
    not logged; a resumed cell keeps only its surviving start's rows for the steps it ran again."""
    return run_minutes(rows, ("time/step_s",)), run_minutes(rows, ("time/eval_s", "time/eval_before_s"))


def cost_table(runs: list[Run], planned: int = len(SEEDS)) -> str:
    """The measured cost (README, "Budget"): per arm, the cells' logged minutes (median and range, training +
    evaluating), their sum, and the cells still to run (`planned` per arm) at the arm's median; then the
    whole."""
    rows, done, left = [], 0.0, 0.0
    for arm, group in by_arm(runs).items():
        minutes = [cell_minutes(r.record.rows) for r in group]
        totals = [t + e for t, e in minutes]
        median = statistics.median(totals)
        todo = max(planned - len(group), 0)
        done, left = done + sum(totals), left + todo * median
        rows.append([arm, str(len(group)), f"{median:.1f} ({min(totals):.1f}-{max(totals):.1f})",
                     f"{statistics.median(t for t, _ in minutes):.1f} + "
                     f"{statistics.median(e for _, e in minutes):.1f}",
                     f"{sum(totals) / 60:.2f}", str(todo), f"{todo * median / 60:.2f}"])
    rows.append(["all", str(len(runs)), "", "", f"{done / 60:.2f}", "", f"{left / 60:.2f}"])
    return _table(["arm", "cells", "minutes per cell, median (range)", "training + evaluating, medians",
                   "hours logged", "cells to run", "hours to run, at the median"], rows) + (
        "\nLogged minutes only: each start's Ray, engines and model add about 1-3 minutes a cell, and the "
        "steps a cut start ran again are not counted.\n")


SECTIONS: tuple[tuple[str, Callable[[list[Run]], str]], ...] = (
    ("Arms (mean ± SD over seeds). " + PEAK_NOTE, arms_table), ("Per seed", seeds_table),
    ("The declared tests", tests_table), ("Cliffs (study 2's rule)", cliffs_table),
    ("The orchestrator's plans (shares of its turns)", plans_table),
    ("The synthesizer's decisions", synthesizer_table), ("Response lengths", lengths_table),
    ("Over training (window means between evaluations)", training_table),
    ("Cost (logged minutes of the box)", cost_table),
)


def results(root: Path) -> str:
    """The results markdown: the study's tables, then the pilot's (which enter no test)."""
    out = ["# Study 4: results\n\n*Written by `python -m studies.cpu_smollm2_v4.collect` from the exported "
           "cells.*\n"]
    for folder, title in (("runs", "Study"), ("pilot", "Pilot (seed 100, in no test)")):
        runs = committed(root / folder)
        out.append(f"\n## {title}\n\n" + (f"![The per-role mechanics]({FIGURES[folder]})\n" if runs
                                            else "*No cell exported.*\n"))
        for heading, table in SECTIONS if runs else ():
            if folder == "pilot" and table in (seeds_table, tests_table):
                continue
            text = cost_table(runs, 1) if folder == "pilot" and table is cost_table else table(runs)
            out.append(f"\n### {heading}\n\n{text}")
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.cpu_smollm2_v4.collect",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=HERE, help="the study's folder (runs/, pilot/)")
    args = parser.parse_args(argv)
    path = args.root / "results.md"
    path.write_text(results(args.root))
    print(f"wrote {path}")
    for folder, title in (("runs", "Study 4"), ("pilot", "Study 4's pilot (seed 100)")):
        if runs := committed(args.root / folder):
            print(f"drew {figures.draw(runs, args.root / FIGURES[folder], title)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
