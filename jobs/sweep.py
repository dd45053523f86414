"""The experiment matrix as one Ray Tune sweep: `python -m jobs.sweep --config jobs/configs/sweeps/<name>.yaml
[key=value ...] [--resume] [--dry-run]`.

Each trial runs the ordinary driver (`jobs.train.train`) on its cell's config. Its resources are one
placement group per trial: a driver bundle, then a bundle per engine and learner rank computed from that
trial's config (jobs/driver/resources.py); the run inside the trial schedules its actors into exactly those
bundles. Every step's metrics go to Tune, with a pointer checkpoint (a JSON naming the run's committed
checkpoint folder on shared storage) when the run commits one. `--resume` continues an interrupted sweep
(Tuner.restore); restarted trials pick up their newest checkpoint (checkpoint.resume=auto).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from ray import tune
from ray.tune import PlacementGroupFactory

from cluster.connect import ConnectError, connect
from jobs.compare import compare
from jobs.config import load_config
from jobs.config.schema import TrainConfig
from jobs.config.sweep_spec import (
    WHERE,
    SweepConfig,
    SweepError,
    as_overrides,
    cell_label,
    cells,
    checked_configs,
    load_sweep,
    search_space,
    validate,
)
from jobs.driver.resources import arithmetic, trial_bundles
from jobs.pages.scaling import configurations, scaling_markdown
from jobs.plan.layout import RunLayout, run_layout
from jobs.plan.planner import make_plan, refuse_unfit
from jobs.plan.report import format_plan
from jobs.telemetry.tracking import read_metrics

POINTER = "pointer.json"
FINISHED = "sweep/finished"  # in a trial's last result once its run returned (Tune's own `done` is not saved)


class TuneReporter:
    """A StepCallback reporting every step's metrics to Tune; a committed checkpoint travels as a pointer
    (the folder stays where the run wrote it, on shared storage, instead of being copied by Tune)."""

    def __init__(self, run_dir: Path | None = None):
        self.run_dir = run_dir
        self.last: dict[str, float] = {}

    def on_step(self, step: int, metrics: dict[str, float], checkpoint: Path | None) -> None:
        self.last = {**metrics, "step": step}
        if checkpoint is None:
            tune.report(self.last)
            return
        with tempfile.TemporaryDirectory() as d:
            pointer = {"checkpoint": str(checkpoint), "run_dir": str(self.run_dir or ""), "step": step}
            (Path(d) / POINTER).write_text(json.dumps(pointer))
            tune.report(self.last, checkpoint=tune.Checkpoint.from_directory(d))


@dataclass(frozen=True)
class TrialSetup:
    """What every trial shares; paths absolute, since trials may run anywhere on the cluster."""

    name: str
    base: str
    overrides: tuple[str, ...]
    out_dir: str
    driver: tuple[tuple[str, float], ...]


def trial_config(setup: TrialSetup, config: dict[str, Any], run_name: str) -> TrainConfig:
    """The train config of one trial: base ← sweep overrides ← its cell ← its search sample."""
    overrides = [
        *setup.overrides,
        *as_overrides(config.get("grid", {})),
        *as_overrides(config.get("search", {})),
        f"run_name={run_name}",
        f"out_dir={setup.out_dir}",
    ]
    return load_config(setup.base, overrides)


def trial_resources(setup: TrialSetup, config: dict[str, Any]) -> PlacementGroupFactory:
    return resources_of(setup, run_layout(trial_config(setup, config, f"{setup.name}_resources")))


def resources_of(setup: TrialSetup, layout: RunLayout) -> PlacementGroupFactory:
    """A trial's placement group request: its driver's bundle, then the bundles of its run's layout."""
    return PlacementGroupFactory(trial_bundles(layout, dict(setup.driver)),
                                 strategy=str(layout.cfg.ray.placement_strategy))


def run_trial(config: dict[str, Any], setup: TrialSetup) -> None:
    """One trial: the ordinary driver. Its run name is stable across restarts (the trial id), so a restarted
    trial finds its own checkpoints."""
    from jobs.train import train

    cfg = trial_config(setup, config, f"{setup.name}_{tune.get_context().get_trial_id()}")
    reporter = TuneReporter(Path(cfg.out_dir) / cfg.run_name)
    summary = train(cfg, callbacks=(reporter,))
    # A trial resumed after its run's last step had committed trains no step here: its final result carries
    # the run's last logged step instead, so the sweep's metric (reward/mean) is still in it.
    tune.report(
        {**(reporter.last or last_step_metrics(Path(cfg.out_dir) / cfg.run_name)), **summary, FINISHED: 1.0}
    )


def last_step_metrics(run_dir: Path) -> dict[str, float]:
    """The numeric metrics of the last training step logged in `run_dir`'s metrics.jsonl ({} without one)."""
    path = run_dir / "metrics.jsonl"
    rows = [r for r in read_metrics(run_dir) if "reward/mean" in r] if path.exists() else []
    return {k: float(v) for k, v in rows[-1].items() if isinstance(v, int | float)} if rows else {}


def make_trainable(setup: TrialSetup) -> Any:
    return tune.with_resources(tune.with_parameters(run_trial, setup=setup),
                               resources=partial(trial_resources, setup))


def setup_of(spec: SweepConfig) -> TrialSetup:
    root = Path(spec.storage_path).resolve() / spec.name
    return TrialSetup(spec.name, str(Path(spec.base).resolve()), tuple(spec.overrides), str(root / "runs"),
                      (("CPU", spec.driver_cpus),))


def experiment_path(spec: SweepConfig, resume: bool) -> str:
    """Where the sweep's Tune state lives; a fresh sweep must not land on an old one, a resume needs one."""
    path = str(Path(spec.storage_path).resolve() / spec.name)
    if resume != tune.Tuner.can_restore(path):
        raise SweepError(f"sweep: {path} {'has no sweep to resume' if resume else 'holds a sweep already'}; "
                         f"{'drop --resume' if resume else 'pass --resume, or change name or storage_path'}")
    return path


def make_tuner(spec: SweepConfig, path: str, resume: bool) -> tune.Tuner:
    """A fresh Tuner, or the interrupted sweep's (unfinished and errored trials resume)."""
    trainable = make_trainable(setup_of(spec))
    if resume:
        return tune.Tuner.restore(path, trainable=trainable, resume_unfinished=True, resume_errored=True)
    # One grid_search over whole cells: exclusions and `where` rules are resolved before Tune sees them.
    param_space = {"grid": tune.grid_search(cells(spec)), "search": search_space(spec)}
    return tune.Tuner(
        trainable, param_space=param_space,
        tune_config=tune.TuneConfig(metric=spec.metric, mode=spec.mode, num_samples=spec.num_samples,
                                    max_concurrent_trials=spec.max_concurrent_trials or None),
        run_config=tune.RunConfig(name=spec.name, storage_path=str(Path(spec.storage_path).resolve()),
                                  failure_config=tune.FailureConfig(max_failures=spec.max_failures)),
    )


def run_sweep(spec: SweepConfig, resume: bool = False) -> tune.ResultGrid:
    # Trials read paths relative to where the sweep was started (data files), not their trial folders.
    os.environ["RAY_CHDIR_TO_TRIAL_DIR"] = "0"
    path = experiment_path(spec, resume)
    with connect(spec.ray.address, spec.ray.num_cpus, timeout_s=spec.ray.connect_timeout_s):
        return make_tuner(spec, path, resume).fit()


def _refuse_unfit(spec: SweepConfig, all_cells: list[dict[str, Any]]) -> None:
    """A cell whose plan does not fit its GPUs is refused before any trial starts (jobs/plan/planner.py)."""
    setup = setup_of(spec)
    for cell, sampled in checked_configs(spec, all_cells):
        try:
            refuse_unfit(
                run_layout(trial_config(setup, {"grid": cell, "search": sampled}, f"{setup.name}_plan"))
            )
        except ValueError as e:  # PlanError, or a model the planner cannot size
            where = cell_label(cell) + (f"; search {cell_label(sampled)}" if sampled else "")
            raise SweepError(f"sweep {spec.name}: cell [{where}]: config: {e}") from None


def _dry_run(spec: SweepConfig, all_cells: list[dict[str, Any]]) -> None:
    setup = setup_of(spec)
    for cell in all_cells:
        sets = "".join(f" {k}={v}" for k, v in cell.get(WHERE, {}).items())
        layout = run_layout(trial_config(setup, {"grid": cell}, f"{setup.name}_resources"))
        print(
            f"[{cell_label(cell)}]{' where' + sets if sets else ''} bundles "
            f"{resources_of(setup, layout).bundles}"
        )
        print(f"  {arithmetic(layout, dict(setup.driver))}")
        print("  " + format_plan(layout.cfg, make_plan(layout)).replace("\n", "\n  "))
    print(f"{len(all_cells)} cells x {spec.num_samples} samples; search {sorted(spec.search)}; "
          f"runs in {setup.out_dir}")


def scaling_page(spec: SweepConfig, all_cells: list[dict[str, Any]]) -> str:
    """docs/scaling.md's page: one layout per configuration of the sweep (its seeds counted, not planned)."""
    setup = setup_of(spec)
    return scaling_markdown(
        spec,
        [
            (run_layout(trial_config(setup, {"grid": cell}, f"{setup.name}_plan")), seeds)
            for cell, seeds in configurations(all_cells)
        ],
    )


def _summary(results: tune.ResultGrid, spec: SweepConfig) -> int:
    """Print one line per trial; returns how many trials neither finished nor failed (interrupted)."""
    unfinished = 0
    for r in results:
        cell = cell_label((r.config or {}).get("grid", {}))
        metrics = r.metrics or {}
        state = "ERROR " + str(r.error).splitlines()[0] if r.error else (
            "finished" if metrics.get(FINISHED) else "unfinished")
        unfinished += not r.error and not metrics.get(FINISHED)
        print(f"[{cell}] {spec.metric}={metrics.get(spec.metric, float('nan')):.4f} {state}")
    return unfinished


def main(argv: list[str] | None = None) -> int:
    """Exit codes: 0 every trial finished, 2 sweep or config error (or a cluster that does not answer), 4 some
    trial failed, 130 interrupted
    (trials left unfinished: rerun with --resume)."""
    args = _parser().parse_intermixed_args(argv)
    try:
        spec = load_sweep(args.config, args.overrides)
        all_cells = validate(spec)
        _refuse_unfit(spec, all_cells)
        if args.dry_run:
            if args.markdown:
                print(scaling_page(spec, all_cells), end="")
            else:
                _dry_run(spec, all_cells)
            return 0
        results = run_sweep(spec, args.resume)
    except (SweepError, ConnectError) as e:
        print(e, file=sys.stderr)
        return 2
    unfinished = _summary(results, spec)
    root = Path(spec.storage_path).resolve() / spec.name
    print(f"sweep {spec.name}: {len(results)} trials, {results.num_errors} failed, {unfinished} unfinished; "
          f"{root}")
    if spec.compare:
        print(compare([Path(setup_of(spec).out_dir)], root / "report"))
    return 4 if results.num_errors else 130 if unfinished else 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m jobs.sweep", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="sweep YAML (jobs/configs/sweeps/*.yaml)")
    parser.add_argument("--resume", action="store_true", help="continue the interrupted sweep")
    parser.add_argument("--dry-run", action="store_true",
                        help="validate, print every cell's bundles and memory plan per GPU, exit")
    parser.add_argument(
        "--markdown",
        action="store_true",
        help="with --dry-run: the scaling tables (docs/scaling.md) instead of the per-cell plans",
    )
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the sweep file")
    return parser


if __name__ == "__main__":
    sys.exit(main())
