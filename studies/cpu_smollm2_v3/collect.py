"""Study 3's committed results:
`python -m studies.cpu_smollm2_v3.collect [--sweep DIR ...] [--gate DIR] [--check]`.

1. Copies every run from the sweeps' storage into studies/cpu_smollm2_v3/runs/<arm>/seed<seed>/ (gate runs
   into gate/<workflow>-<role>-<cap>/): metrics.jsonl, config.yaml, eval_tasks.csv, its held-out curve as
   eval_curve.csv and its evaluations' turns as eval_turns.parquet (what each role wrote, its length and
   finish reason, the rewards; no prompts, ids or log-probs). **A run whose start rows record another commit
   than STUDY_COMMIT, or uncommitted changes, is refused**: the study runs from one pinned commit.
2. Rewrites the README's measured tables (between `<!-- table:NAME -->` and
   `<!-- /table -->`) from the committed runs, and draws them in `cpu_smollm2_v3_mechanics.png` (figures.py).

`--check` changes nothing and exits 1 when the README's tables differ from the committed runs'.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from jobs.driver.eval_records import TURNS_DIR
from jobs.report import find_runs
from marl.workflows.common import parse_choice
from studies.cpu_smollm2.collect import _fmt, _table, readme_tables, rewrite_readme
from studies.cpu_smollm2_v2.collect import (
    Run,
    arms_table,
    by_arm,
    cliff,
    cliff_comparison,
    load,
    paired_counts,
    provenance_table,
)
from studies.cpu_smollm2_v2.collect import copy_runs as copy_v2_files
from studies.cpu_smollm2_v2.stats import mcnemar_exact, mean_sd
from studies.cpu_smollm2_v3.decisions import Graded, decisions_table, graded_by_episode
from studies.cpu_smollm2_v3.figures import draw
from studies.cpu_smollm2_v3.gate import gate_table, lengths_table
from studies.cpu_smollm2_v3.stats import permutation_p, welch

HERE = Path(__file__).resolve().parent
RUNS, GATE, README = HERE / "runs", HERE / "gate", HERE / "README.md"
FIGURE = HERE / "cpu_smollm2_v3_mechanics.png"
SWEEPS = sorted(Path("runs/sweeps").glob("cpu_study_v3_s[0-9]_*"))
# The commit the tag study-v3 names, written to COMMIT once pinned: every run of the study recorded it
# (studies/cpu_smollm2_v3/run.py). The file comes after the commit it names, so that commit cannot hold it.
STUDY_COMMIT = (HERE / "COMMIT").read_text().strip() if (HERE / "COMMIT").is_file() else "unset"
SA, SP, IP = "single_agent-shared", "voting-shared", "voting-isolated"
COMPARISONS = ((SP, IP), (SP, SA), (IP, SA))  # the question first, then each against single-agent
TURN_COLUMNS = ("step", "episode", "task_id", "role", "agent", "round", "response", "finish_reason", "reward",
                "episode_reward", "final_answer", "parse_failures", "score_info")


class ProvenanceError(ValueError):
    """A run that did not run from the study's commit, on a clean tree."""


def check_provenance(path: Path, commit: str | None = STUDY_COMMIT) -> int:
    """How many times the run at `path` started (its rows carrying `code/commit`); ProvenanceError when any
    start recorded another commit (any commit passes when `commit` is None), uncommitted changes, or no commit
    at all."""
    # Raw lines: load_run merges a re-logged step's rows, and with them two starts' commit keys.
    lines = (path / "metrics.jsonl").read_text().splitlines()
    starts = [row for line in lines if line.strip() and "code/commit" in (row := json.loads(line))]
    if not starts:
        raise ProvenanceError(f"{path}: no code/commit recorded")
    for row in starts:
        if (commit is not None and row["code/commit"] != commit) or row.get("code/dirty") is not False:
            raise ProvenanceError(f"{path}: ran at {row['code/commit']} (dirty: {row.get('code/dirty')}), "
                                  f"not the study's commit {commit} on a clean tree")
    return len(starts)


def slim_turns(run_dir: Path) -> pa.Table | None:
    """Every evaluation's turns of a run, in one table of TURN_COLUMNS (`step`: steps done at that
    evaluation), with each response's length in tokens; None without evaluation turns."""
    files = sorted((run_dir / TURNS_DIR).glob("eval_*.parquet"))
    if not files:
        return None
    tables = [pq.read_table(f, columns=[*TURN_COLUMNS, "response_ids"]) for f in files]
    table = pa.concat_tables(tables)
    lengths = pa.array([len(ids) for ids in table.column("response_ids").to_pylist()], pa.int32())
    return table.drop_columns(["response_ids"]).append_column("response_tokens", lengths)


def copy_runs(sweep: Path, root: Path, gate: bool = False, commit: str | None = STUDY_COMMIT) -> list[str]:
    """Study 2's copy (files, curve, destination by arm and seed; gate runs by workflow, role and cap), after
    each run's provenance check against `commit`, plus the slim evaluation turns."""
    for path in find_runs([sweep]):
        check_provenance(path, commit)
    names = copy_v2_files(sweep, root, "gate" if gate else "study")
    for path, name in zip(find_runs([sweep]), names, strict=True):
        turns = slim_turns(path)
        if turns is not None:
            pq.write_table(turns, root / name / "eval_turns.parquet", compression="zstd")
    return names


def committed(root: Path = RUNS) -> list[Run]:
    runs = [load(p) for p in find_runs([root])] if root.is_dir() else []
    return sorted(runs, key=lambda r: ([SA, SP, IP].index(r.arm) if r.arm in (SA, SP, IP) else 3, r.seed))


def finals(runs: list[Run]) -> list[float]:
    return [r.curve[-1] for r in sorted(runs, key=lambda r: r.seed)]


def tests_table(runs: list[Run]) -> str:
    """Per comparison: the seeds each arm ran, mean final accuracy difference, the exact permutation p over
    seeds (the test), Welch's t, and pooled McNemar on tasks x seeds (shown, not the test)."""
    arms, rows = by_arm(runs), []
    for x, y in COMPARISONS:
        if x not in arms or y not in arms:
            continue
        a, b = finals(arms[x]), finals(arms[y])
        t, df, p_welch = welch(a, b)
        pairs, only_a, only_b = paired_counts(arms[x], arms[y])
        rows.append(
            [
                f"{x} vs {y}",
                f"{len(a)} / {len(b)}",
                f"{statistics.fmean(a) - statistics.fmean(b):+.3f}",
                _fmt(permutation_p(a, b)),
                f"{_fmt(t, 2)} (df {_fmt(df, 1)})",
                _fmt(p_welch),
                f"{only_a} / {only_b} of {pairs}",
                _fmt(mcnemar_exact(only_a, only_b)) if pairs else "–",
            ]
        )
    return _table(["comparison", "seeds", "final difference", "permutation p", "Welch t", "Welch p",
                   "pooled tasks right only in first / second", "McNemar p (not the test)"], rows)


def seeds_table(runs: list[Run]) -> str:
    """Per run: base, peak, final, the final's gain over the base and whether it cliffed under the rule."""
    rows = [[r.arm, str(r.seed), _fmt(r.curve[0]), _fmt(max(r.curve)), _fmt(r.curve[-1]),
             f"{r.curve[-1] - r.curve[0]:+.3f}", "yes" if cliff(r) else "no"] for r in runs]
    return _table(["arm", "seed", "base", "peak", "final", "final - base", "cliff (rule)"], rows)


def cliff_tests_table(runs: list[Run]) -> str:
    """Per comparison: cliffs in each arm and Fisher's exact p on them (added after the data: the design's
    test is on final accuracy)."""
    arms, rows = by_arm(runs), []
    for x, y in COMPARISONS:
        if x in arms and y in arms:
            counts, p = cliff_comparison(arms[x], arms[y])
            rows.append([f"{x} vs {y}", counts, _fmt(p)])
    return _table(["comparison", "cliffs", "Fisher p (not the test)"], rows)


def eval_series(rows: list[dict[str, Any]], key: str) -> list[float]:
    """`key` (an eval/ metric) at each evaluation: the base's from eval/before/* in step 0's row, then every
    row holding an evaluation; NaN where an evaluation did not log it."""
    before = "eval/before/" + key.removeprefix("eval/")
    out = [float(rows[0].get(before, math.nan))] if rows and "eval/accuracy_before" in rows[0] else []
    return out + [float(r.get(key, math.nan)) for r in rows if "eval/accuracy" in r]


def parse_rate(rows: list[dict[str, Any]], role: str) -> list[float]:
    """The role's parse rate at each evaluation: 1 - failed turns / turns."""
    turns, failed = eval_series(rows, f"eval/turns/{role}"), eval_series(rows, f"eval/parse_failures/{role}")
    return [1 - (f if f == f else 0.0) / n if n else math.nan for n, f in zip(turns, failed, strict=True)]


def _mean_columns(series: list[list[float]]) -> list[str]:
    """Mean over seeds at each evaluation (NaNs left out), formatted."""
    columns = list(zip(*series, strict=False))
    return [_fmt(statistics.fmean(v) if (v := [x for x in col if x == x]) else math.nan) for col in columns]


def _mean_over(group: list[Run], series: Callable[[Run], list[float]]) -> list[str]:
    return _mean_columns([series(r) for r in group])


def mechanics_table(runs: list[Run]) -> str:
    """Voting arms, mean over seeds at each evaluation: how many episodes had a right candidate (at least one
    generator answered right: what the aggregator can at best reach), the aggregator's parse rate, its choice
    accuracy on those episodes, and its response length."""
    rows = []
    for arm, group in by_arm(runs).items():
        if not arm.startswith("voting"):
            continue
        for label, series in (
                ("episodes with a right candidate", lambda r: eval_series(r.record.rows,
                                                                          "eval/choice/available/aggregator")),
                ("aggregator parse rate", lambda r: parse_rate(r.record.rows, "aggregator")),
                ("aggregator choice accuracy", lambda r: eval_series(r.record.rows,
                                                                     "eval/choice/accuracy/aggregator")),
                ("aggregator response tokens", lambda r: eval_series(r.record.rows,
                                                                     "eval/response_len/aggregator"))):
            rows.append([arm, label, *_mean_over(group, series)])
    return _table(["arm", "measure", "step 0", "10", "20", "30", "40"], rows)


def choice_counts(run_dir: Path, k: int = 3) -> dict[int, list[int]]:
    """Per evaluation (steps done), the aggregator's turns by what the workflow's parser reads: counts of
    choices 1..k, then of unparsed turns (which the workflow resolves by its fallback), from the committed
    eval_turns.parquet."""
    table = pq.read_table(run_dir / "eval_turns.parquet", columns=["step", "role", "response"]).to_pylist()
    counts: dict[int, list[int]] = {}
    for turn in table:
        if turn["role"] == "aggregator":
            choice = parse_choice(turn["response"], k)
            counts.setdefault(turn["step"], [0] * (k + 1))[(choice or k + 1) - 1] += 1
    return dict(sorted(counts.items()))


def choices_table(runs: list[Run]) -> str:
    """Voting arms: the aggregator's parsed choices at each evaluation, pooled over the seeds' turns, as
    `1 / 2 / 3 / unparsed` shares. Added after the first seeds showed it converging on response 1."""
    rows = []
    for arm, group in by_arm(runs).items():
        if not arm.startswith("voting"):
            continue
        pooled: dict[int, list[int]] = {}
        for run in group:
            for step, counts in choice_counts(run.record.path).items():
                before = pooled.get(step, [0] * len(counts))
                pooled[step] = [a + b for a, b in zip(before, counts, strict=True)]
        cells = [" / ".join(f"{c / sum(v):.2f}" for c in v) for _, v in sorted(pooled.items())]
        rows.append([arm, str(len(group)), *cells])
    return _table(["arm", "seeds", "step 0", "10", "20", "30", "40"], rows)


def graded_turns(run_dir: Path, role: str) -> dict[int, list[list[Graded]]]:
    """Per evaluation (steps done), per episode: each of `role`'s turns graded again (decisions.py)."""
    return {step: list(e.values()) for step, e in graded_by_episode(run_dir, role).items()}


def generator_measures(run_dir: Path) -> tuple[list[float], list[float]]:
    """Per evaluation: the generators' accuracy (right turns / turns) and their agreement (the share of
    episodes whose generators all gave the same answer, an answer being read)."""
    accuracy, agreement = [], []
    for episodes in graded_turns(run_dir, "generator").values():
        turns = [g for episode in episodes for g in episode]
        accuracy.append(sum(score for _, score in turns) / len(turns))
        same = [len({a for a, _ in e}) == 1 and e[0][0] is not None for e in episodes]
        agreement.append(sum(same) / len(episodes))
    return accuracy, agreement


def generators_table(runs: list[Run]) -> str:
    """Voting arms, mean over seeds at each evaluation: the generators' accuracy and agreement, graded again
    from the committed turns. Added after the data, to see the generators' side of the shared cliffs and how
    alike the parallel generators become."""
    rows = []
    for arm, group in by_arm(runs).items():
        if not arm.startswith("voting"):
            continue
        accuracy, agreement = zip(*(generator_measures(r.record.path) for r in group), strict=True)
        for label, per_run in (("generator accuracy", accuracy), ("generators agree", agreement)):
            rows.append([arm, label, *_mean_columns(list(per_run))])
    return _table(["arm", "measure", "step 0", "10", "20", "30", "40"], rows)


def _training_mean(run: Run, prefix: str, with_gradient: bool) -> dict[str, float]:
    """Per suffix of `prefix` (a role or a policy): the mean over the run's training steps. With
    `with_gradient`, over the steps whose values under `prefix` sum above 0: a step where no row carried an
    advantage logs every role's share as 0, which is not a share, so averaging it in would report how often a
    step trained rather than which role drove it."""
    values: dict[str, list[float]] = {}
    for row in run.record.rows:
        step = {key.removeprefix(prefix): float(v) for key, v in row.items()
                if key.startswith(prefix) and isinstance(v, int | float) and v == v}
        if with_gradient and sum(step.values()) <= 0:
            continue
        for name, v in step.items():
            values.setdefault(name, []).append(v)
    return {k: statistics.fmean(v) for k, v in values.items()}


def training_table(runs: list[Run]) -> str:
    """Per arm and role or policy, mean ± SD over seeds of the per-run training means: the gradient norm share
    and mass share of the step (over the steps with a gradient), and the policy movement per step (every step,
    0 where it did not move)."""
    rows = []
    for arm, group in by_arm(runs).items():
        for label, prefix, with_gradient in (
                ("gradient norm share (steps with a gradient)", "grad/step_norm_share/", True),
                ("gradient mass share (steps with a gradient)", "grad/step_mass_share/", True),
                ("policy move per step", "update/policy_move/", False)):
            per_run = [_training_mean(r, prefix, with_gradient) for r in group]
            for name in sorted({k for m in per_run for k in m}):
                m, sd = mean_sd([p[name] for p in per_run if name in p])
                rows.append([arm, label, name, f"{_fmt(m, 4)} ± {_fmt(sd, 4)}"])
    return _table(["arm", "measure", "role / policy", "mean over training (± SD over seeds)"], rows)


def role_norms(rows: list[dict[str, Any]], first: str = "aggregator", second: str = "generator",
               ) -> list[tuple[float, float]]:
    """`grad/role_norm/<first>` and `<second>` at each training step where both roles' rows carried a gradient
    (both norms above 0): the step's mean over its optimizer steps of each role's gradient norm."""
    keys = (f"grad/role_norm/{first}", f"grad/role_norm/{second}")
    pairs = [(row.get(keys[0]), row.get(keys[1])) for row in rows]
    return [(float(a), float(b)) for a, b in pairs
            if isinstance(a, int | float) and isinstance(b, int | float) and a > 0 and b > 0]


def role_norms_table(runs: list[Run]) -> str:
    """Voting arms, per seed: the median over the steps where both roles trained of the aggregator's and the
    generators' gradient norms and of their ratio. Added after the data, to hold the runs against the authors'
    "supervisory roles often have 5-8x larger grad norms than generators" (under isolated policies)."""
    rows = []
    for arm, group in by_arm(runs).items():
        if not arm.startswith("voting"):
            continue
        for run in sorted(group, key=lambda r: r.seed):
            pairs = role_norms(run.record.rows)
            if not pairs:
                rows.append([arm, str(run.seed), "0", "–", "–", "–"])
                continue
            medians = [statistics.median(v) for v in zip(*pairs, strict=True)]
            ratio = statistics.median(a / b for a, b in pairs)
            rows.append([arm, str(run.seed), str(len(pairs)), _fmt(medians[0], 3), _fmt(medians[1], 3),
                         _fmt(ratio, 2)])
    return _table(["arm", "seed", "steps both roles trained", "aggregator norm", "generator norm",
                   "aggregator / generator"], rows)


RUN_TIME_KEYS = ("time/step_s", "time/eval_s", "time/eval_before_s")


def run_minutes(rows: list[dict[str, Any]], keys: tuple[str, ...] = RUN_TIME_KEYS) -> float:
    """Minutes of a run's training steps and evaluations, summed from its metrics (`keys`: by default
    time/step_s, time/eval_s, time/eval_before_s): the work the run kept, without start-up, and without steps
    a resumed run redid."""
    return sum(float(r[k]) for r in rows for k in keys if isinstance(r.get(k), int | float)) / 60


def starts_table(runs: list[Run]) -> str:
    """Per run: how many times it started (a resumed run continues from its newest checkpoint) and the minutes
    of steps and evaluations it logged; then the total."""
    minutes = [run_minutes(r.record.rows) for r in runs]
    pairs = zip(runs, minutes, strict=True)
    rows = [[r.arm, str(r.seed), str(check_provenance(r.record.path)), f"{m:.1f}"] for r, m in pairs]
    total = sum(minutes)
    rows.append(["all", f"{len(runs)} runs", "", f"{total:.1f} ({total / 60:.1f} h)"])
    return _table(["arm", "seed", "starts", "minutes of steps and evaluations"], rows)


TABLES: dict[str, Callable[[list[Run]], str]] = {
    "arms": arms_table, "seeds": seeds_table, "tests": tests_table, "cliff_tests": cliff_tests_table,
    "mechanics": mechanics_table, "choices": choices_table,
    "generators": generators_table, "decisions": decisions_table,
    "training": training_table, "role_norms": role_norms_table,
    "provenance": provenance_table, "starts": starts_table,
}


def committed_tables() -> dict[str, str]:
    runs = committed(RUNS)
    out = {name: fn(runs) for name, fn in TABLES.items()}
    gated = GATE.is_dir() and bool(find_runs([GATE]))
    out["gate"] = gate_table([GATE]) if gated else ""
    out["lengths"] = lengths_table([GATE])[0] if gated else ""
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.cpu_smollm2_v3.collect",
                                     description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sweep", type=Path, nargs="*", default=list(SWEEPS), help="the arms' sweeps (copied)"
    )
    parser.add_argument("--gate", type=Path, nargs="*", default=[], help="the gate's sweep (copied)")
    parser.add_argument("--check", action="store_true", help="only compare the README's tables with the runs")
    args = parser.parse_args(argv)
    try:
        for sources, root, gate in ((args.sweep, RUNS, False), (args.gate, GATE, True)):
            for sweep in sources if not args.check else []:
                print(f"copied {', '.join(copy_runs(sweep, root, gate)) or 'no runs'} from {sweep}")
        computed, text = committed_tables(), README.read_text()
    except ProvenanceError as e:
        print(f"refused: {e}", file=sys.stderr)
        return 2
    if args.check:
        stale = [n for n, t in readme_tables(text).items() if computed.get(n) != t]
        print(f"README tables {'differ: ' + ', '.join(stale) if stale else 'match'} the committed runs")
        return 1 if stale else 0
    README.write_text(rewrite_readme(text, computed))
    if runs := committed(RUNS):
        draw(runs, FIGURE, parse_rate, eval_series)
    return 0


if __name__ == "__main__":
    sys.exit(main())
