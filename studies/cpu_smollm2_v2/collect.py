"""The second CPU study's committed results:
`python -m studies.cpu_smollm2_v2.collect [--sweep DIR ...] [--check]`.

1. Copies every run (metrics.jsonl, config.yaml, eval_tasks.csv and its held-out curve as eval_curve.csv; no
   rollouts, no weights) from the sweeps' storage into studies/cpu_smollm2_v2/runs/<arm>/seed<seed>/, the arm
   read from the run's own config (ablations by their keys, not by folder names). Calibration runs go to
   calibration/ (`--calibration DIR`) and gate runs to gate/ (`--gate DIR`) instead: reported, never results.
2. Rewrites the README's measured tables (between `<!-- table:NAME -->` and `<!-- /table -->`) from the
   committed runs with the functions below and those of studies.cpu_smollm2_v2.stats.

`--check` changes nothing and exits 1 when the README's tables differ from the committed runs'.
"""

from __future__ import annotations

import argparse
import csv
import math
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

from omegaconf import OmegaConf

from jobs.driver.eval_records import FILE as EVAL_TASKS
from jobs.driver.eval_records import read_eval
from jobs.report import RunRecord, eval_curve, find_runs, load_run
from studies.cpu_smollm2.collect import _fmt, _table, readme_tables, rewrite_readme
from studies.cpu_smollm2_v2.stats import fisher_exact, is_cliff, last_mean, mcnemar_exact, mean_sd

HERE = Path(__file__).resolve().parent
Phase = Literal["study", "calibration", "gate"]
RUNS, CALIBRATION, GATE, README = HERE / "runs", HERE / "calibration", HERE / "gate", HERE / "README.md"
# One sweep per phase and seed (jobs/configs/sweeps/cpu_study_v2.yaml).
SWEEPS = sorted(
    [*Path("runs/sweeps").glob("cpu_study_v2_s*"), *Path("runs/sweeps").glob("cpu_study_v2_ablation_s*")]
)
BASELINE = "single_agent-shared"
GATE_RATE = 0.5  # a coordinating role's parse rate at base that makes its workflow testable
# the rule's floor: a gap under 10 points is no cliff even where 2 standard errors are smaller
CLIFF_DROP = 0.1


@dataclass
class Run:
    """One committed run: its arm, seed, code version, held-out curve and per-task final results."""

    arm: str
    seed: int
    record: RunRecord
    curve: list[float]
    n_tasks: int
    final_tasks: dict[str, float]
    lr: float


def arm_of(cfg: dict[str, Any]) -> str:
    """`<workflow>-<sharing>`, plus `+mb0` (algo.ppo_mini_batch_size=0) and `+skip`
    (algo.skip_empty_optimizer_steps=true) for the ablations."""
    marl, algo = cfg.get("marl", {}), cfg.get("algo", {})
    arm = f"{marl.get('workflow', '?')}-{marl.get('sharing', '?')}"
    if algo.get("ppo_mini_batch_size", 0) == 0:
        arm += "+mb0"
    if algo.get("skip_empty_optimizer_steps", False):
        arm += "+skip"
    return arm


def _config(path: Path) -> dict[str, Any]:
    if not (path / "config.yaml").is_file():
        return {}
    return cast(dict[str, Any], OmegaConf.to_container(OmegaConf.load(path / "config.yaml")))


def load(path: Path) -> Run:
    cfg, record = _config(path), load_run(path)
    xs, ys = eval_curve(record.rows)
    evals = read_eval(path)
    final = evals[max(evals)] if evals else {}
    n_tasks = len(final) or int(cfg.get("data", {}).get("eval_size", 0))
    return Run(arm_of(cfg), int(cfg.get("seed", 0)), record, ys, n_tasks, final,
               float(cfg.get("learner", {}).get("optim", {}).get("lr", math.nan)))


def committed(root: Path = RUNS) -> list[Run]:
    """Runs under `root`, by arm (the baseline first) and seed."""
    runs = [load(p) for p in find_runs([root])] if root.is_dir() else []
    return sorted(runs, key=lambda r: (r.arm != BASELINE, r.arm, r.seed))


def gate_name(cfg: dict[str, Any]) -> str:
    """A gate run's folder: `<workflow>-<role>-<cap>` (the role whose cap it sets)."""
    caps = cfg.get("rollout", {}).get("role_max_new_tokens", {})
    return "-".join(
        [cfg.get("marl", {}).get("workflow", "?"), *(f"{r}-{c}" for r, c in sorted(caps.items()))]
    )


def destination(root: Path, path: Path, run: Run, phase: Phase) -> Path:
    """Where a run is committed: `root`/<arm>/seed<seed>/; calibration runs, which share arm and seed and
    differ in lr, under `root`/<arm>-lr<lr>/seed<seed>/; gate runs under `root`/<gate_name>/."""
    if phase == "gate":
        return root / gate_name(_config(path))
    arm = f"{run.arm}-lr{run.lr:g}" if phase == "calibration" else run.arm
    return root / arm / f"seed{run.seed}"


def copy_runs(sweep: Path, root: Path, phase: Phase = "study") -> list[str]:
    """Copies each run under `sweep` to its `destination` under `root`; returns those folders' names. Two runs
    bound for one folder are an error, not an overwrite."""
    names: list[str] = []
    for path in find_runs([sweep]):
        run = load(path)
        dest = destination(root, path, run, phase)
        if str(dest.relative_to(root)) in names:
            raise ValueError(f"two runs of {sweep} would be committed to {dest}")
        dest.mkdir(parents=True, exist_ok=True)
        for name in ("metrics.jsonl", "config.yaml", EVAL_TASKS):
            if (path / name).is_file():
                shutil.copyfile(path / name, dest / name)
        xs, ys = eval_curve(run.record.rows)
        with open(dest / "eval_curve.csv", "w", newline="") as f:
            csv.writer(f).writerows([("steps_done", "accuracy"), *zip(xs, ys, strict=True)])
        names.append(str(dest.relative_to(root)))
    return names


def by_arm(runs: list[Run]) -> dict[str, list[Run]]:
    out: dict[str, list[Run]] = {}
    for run in runs:
        out.setdefault(run.arm, []).append(run)
    return out


def cliff(run: Run) -> bool:
    return is_cliff(run.curve, run.n_tasks, CLIFF_DROP)


def _ms(values: list[float]) -> str:
    m, sd = mean_sd(values)
    return f"{_fmt(m)} ± {_fmt(sd)}"


def arms_table(runs: list[Run]) -> str:
    """Per arm: seeds, cliffs under the rule, base, peak, final and last-3 mean held-out accuracy (mean ± SD
    over seeds), and the final's gain over the run's own base."""
    rows = []
    for arm, group in by_arm(runs).items():
        rows.append([arm, ",".join(str(r.seed) for r in group), f"{sum(map(cliff, group))}/{len(group)}",
                     _ms([r.curve[0] for r in group]), _ms([max(r.curve) for r in group]),
                     _ms([r.curve[-1] for r in group]), _ms([last_mean(r.curve) for r in group]),
                     _ms([r.curve[-1] - r.curve[0] for r in group])])
    return _table(
        ["arm", "seeds", "cliffs", "base", "peak", "final", "last 3 evals", "final - own base"], rows
    )


def comparisons(arms: list[str]) -> list[tuple[str, str]]:
    """Each headline arm against the baseline, shared against isolated per workflow, each ablation against its
    headline arm."""
    headline = [a for a in arms if "+" not in a]
    out = [(a, BASELINE) for a in headline if a != BASELINE and BASELINE in arms]
    out += [(a, a.replace("-shared", "-isolated")) for a in headline
            if a.endswith("-shared") and a != BASELINE and a.replace("-shared", "-isolated") in arms]
    return out + [(a, a.split("+")[0]) for a in arms if "+" in a and a.split("+")[0] in arms]


def paired_counts(a: list[Run], b: list[Run]) -> tuple[int, int, int]:
    """(pairs, right under A alone, right under B alone) over the seeds both arms ran and the held-out tasks
    both final evaluations hold."""
    seeds_b = {r.seed: r for r in b}
    pairs = only_a = only_b = 0
    for ra in a:
        rb = seeds_b.get(ra.seed)
        if rb is None:
            continue
        for task in sorted(set(ra.final_tasks) & set(rb.final_tasks)):
            x, y = ra.final_tasks[task] > 0, rb.final_tasks[task] > 0
            pairs, only_a, only_b = pairs + 1, only_a + (x and not y), only_b + (y and not x)
    return pairs, only_a, only_b


def cliff_comparison(a: list[Run], b: list[Run]) -> tuple[str, float]:
    """Two arms' cliff counts under the rule ("c/n vs c/n") and Fisher's exact p on them."""
    ca, cb = sum(map(cliff, a)), sum(map(cliff, b))
    return f"{ca}/{len(a)} vs {cb}/{len(b)}", fisher_exact(ca, len(a) - ca, cb, len(b) - cb)


def tests_table(runs: list[Run]) -> str:
    """Per comparison: cliff counts and Fisher's exact p; final accuracies paired by seed and task, McNemar's
    exact p on the discordant pairs."""
    arms, rows = by_arm(runs), []
    for x, y in comparisons(list(arms)):
        counts, p_cliff = cliff_comparison(arms[x], arms[y])
        pairs, only_a, only_b = paired_counts(arms[x], arms[y])
        diff = (only_a - only_b) / pairs if pairs else math.nan
        rows.append([f"{x} vs {y}", counts, _fmt(p_cliff), str(pairs),
                     f"{only_a} / {only_b}", f"{diff:+.3f}" if pairs else "–",
                     _fmt(mcnemar_exact(only_a, only_b)) if pairs else "–"])
    return _table(["comparison", "cliffs", "Fisher p", "paired tasks", "right only in first / second",
                   "final accuracy difference", "McNemar p"], rows)


def calibration_table(runs: list[Run]) -> str:
    """Per calibration run: lr, seed, base / peak / final, the cliff rule, and the largest step movement."""
    rows = []
    for run in sorted(runs, key=lambda r: (r.lr, r.seed)):
        moves = [
            float(v) for row in run.record.rows for k, v in row.items() if k.startswith("update/policy_move/")
        ]
        rows.append(
            [
                f"{run.lr:g}",
                str(run.seed),
                _fmt(run.curve[0]),
                _fmt(max(run.curve)),
                _fmt(run.curve[-1]),
                "yes" if cliff(run) else "no",
                _fmt(max(moves), 3) if moves else "–",
            ]
        )
    return _table(["lr", "seed", "base", "peak", "final", "cliff (rule)", "largest policy move"], rows)


def turns_at_most(cfg: dict[str, Any], role: str) -> int:
    """The most turns `role` takes in one episode: eval-opt's evaluator one per round (an episode ends early
    only when a verdict parses as "correct"), every other coordinating role one."""
    marl = cfg.get("marl", {})
    return int(marl.get("max_rounds", 1)) if (marl.get("workflow"), role) == ("eval_opt", "evaluator") else 1


def gate_table(paths: list[Path]) -> str:
    """Per gate run: the coordinating role, its cap, the base model's parse rate over its turns in the
    evaluation and whether it reaches the gate's 50 %.

    The evaluation logs the role's failures, not its turns: the rate is 1 - failures / turns with turns at
    most episodes x turns_at_most, so for a role with several turns per episode the rate shown is an upper
    bound (marked <=), which settles a "no" and leaves a "yes" unproven (marked ?)."""
    rows = []
    for path in paths:
        cfg, record = _config(path), load_run(path)
        first = record.rows[0] if record.rows else {}
        for role, cap in sorted(cfg.get("rollout", {}).get("role_max_new_tokens", {}).items()):
            episodes, most = float(first.get("eval/before/episodes", 0.0)), turns_at_most(cfg, role)
            failures = float(first.get(f"eval/before/parse_failures/{role}", 0.0))
            rate = 1 - failures / (episodes * most) if episodes else math.nan
            shown = ("<= " if most > 1 else "") + _fmt(rate)
            passes = "–" if rate != rate else ("no" if rate < GATE_RATE else "yes" if most == 1 else "?")
            rows.append(
                [record.workflow, role, str(cap), f"{episodes:.0f}", f"{failures:.0f}", shown, passes]
            )
    return _table(["workflow", "role", "cap", "episodes", "failed turns", "parse rate at base", ">= 50 %"],
                  sorted(rows, key=lambda r: (r[0], r[1], int(r[2]))))


def provenance_table(runs: list[Run]) -> str:
    """The code versions the runs ran: each commit, its runs and how many had uncommitted changes."""
    seen: dict[str, list[bool | str]] = {}
    for run in runs:
        first = run.record.rows[0] if run.record.rows else {}
        seen.setdefault(str(first.get("code/commit", "unknown")), []).append(
            first.get("code/dirty", "unknown")
        )
    return _table(["commit", "runs", "with uncommitted changes"],
                  [[c, str(len(d)), str(sum(x is True for x in d))] for c, d in sorted(seen.items())])


TABLES: dict[str, Callable[[list[Run]], str]] = {
    "arms": arms_table, "tests": tests_table, "provenance": provenance_table,
}


def tables(runs: list[Run], calibration: list[Run], gate: list[Path]) -> dict[str, str]:
    return {**{name: fn(runs) for name, fn in TABLES.items()}, "calibration": calibration_table(calibration),
            "gate": gate_table(gate)}


def committed_tables() -> dict[str, str]:
    gate = find_runs([GATE]) if GATE.is_dir() else []
    return tables(committed(RUNS), committed(CALIBRATION), gate)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.cpu_smollm2_v2.collect",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", type=Path, nargs="*", default=list(SWEEPS), help="study sweeps (copied)")
    parser.add_argument("--calibration", type=Path, nargs="*", default=[], help="calibration sweeps (copied)")
    parser.add_argument("--gate", type=Path, nargs="*", default=[], help="gate sweeps (copied)")
    parser.add_argument("--check", action="store_true", help="only compare the README's tables with the runs")
    args = parser.parse_args(argv)
    phases: list[tuple[list[Path], Path, Phase]] = [
        (args.sweep, RUNS, "study"),
        (args.calibration, CALIBRATION, "calibration"),
        (args.gate, GATE, "gate"),
    ]
    for sources, root, phase in phases:
        for sweep in sources if not args.check else []:
            if sweep.is_dir():
                print(f"copied {', '.join(copy_runs(sweep, root, phase)) or 'no runs'} from {sweep}")
    computed, text = committed_tables(), README.read_text()
    if args.check:
        stale = [n for n, t in readme_tables(text).items() if computed.get(n) != t]
        print(f"README tables {'differ: ' + ', '.join(stale) if stale else 'match'} the committed runs")
        return 1 if stale else 0
    README.write_text(rewrite_readme(text, computed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
