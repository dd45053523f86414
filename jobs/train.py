"""The training driver: `python -m jobs.train --config X [key=value ...] [--print-config]`.

Prepares the inputs, connects to Ray and runs attempts of the loop (jobs/driver/loop.py) until one finishes: a
member failure restarts from the newest committed checkpoint (jobs/driver/run_checkpoints.py), up to
`checkpoint.max_failures` times. Shared vs isolated is only the policy map.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
import warnings
from pathlib import Path

import torch

from cluster.connect import ConnectError, connect
from cluster.group import GroupError
from cluster.placement import PlacementError
from cluster.stop import StopRequested, sigterm_stops
from jobs.config import ConfigError, load_config, to_yaml
from jobs.config.schema import TrainConfig
from jobs.driver import run_checkpoints as ckpt
from jobs.driver.assets import InputError, RunAssets, prepare
from jobs.driver.loop import RunState, StepCallback, attempt
from jobs.driver.provenance import code_version, config_header, layout_record, prompt_version
from jobs.driver.run_checkpoints import Progress
from jobs.driver.updates import SkippedStepsError
from jobs.plan.cluster_check import refuse_on_cluster
from jobs.telemetry.tracking import RunLog
from learners.batch import RoleDropError
from marl.cliff import CliffTracker


def quiet_logs(verbose: bool) -> None:
    """Unless `verbose`, the console shows the run's own lines: vLLM at ERROR (its start-up emits ~20 advisory
    WARNING lines per engine), torch's C++ warnings at ERROR, no FutureWarnings. Read by every engine at
    import (forwarded to engine actors by rollout.vllm.support.engine_env); the user's own settings win."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO" if verbose else "ERROR")
    # DeepSpeed (imported by HF saving code) otherwise warns it found no GPU;
    if not torch.cuda.is_available():
        # actors of the embedded cluster inherit the driver's env
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if not verbose:
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
        os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
        warnings.filterwarnings("ignore", category=FutureWarning)


def train(cfg: TrainConfig, callbacks: tuple[StepCallback, ...] = ()) -> dict[str, float]:
    """Runs the whole job; returns the summary (accuracy before/after, wall time, cliff, failures).

    A member failure (dead or hung learner/engine: GroupError) tears the system down and restarts from the
    newest committed checkpoint, up to `checkpoint.max_failures` times."""
    t_start = time.perf_counter()
    quiet_logs(cfg.tracking.verbose)
    run_dir, version = _run_dir(cfg)
    resume = _initial_resume(cfg, run_dir)
    with connect(cfg.ray.address, cfg.ray.num_cpus, cfg.ray.include_dashboard, cfg.ray.connect_timeout_s,
                 quiet=not cfg.tracking.verbose), sigterm_stops():
        # Connected first: the layout, its plan and the NCCL gate read the GPUs of the cluster's nodes
        # (cluster/gpus.py), which a driver on a CPU head node does not have itself.
        assets = prepare(cfg)
        refuse_on_cluster(assets.layout)
        # The config keeps `auto` as null; what the plan resolved it to is recorded beside the code's version.
        version |= layout_record(assets.layout)
        (run_dir / "config.yaml").write_text(config_header(version) + to_yaml(cfg))
        log = RunLog.for_run(run_dir, cfg, assets.layout.policy_map.roles, first_row=version)
        try:
            summary, failures, lost = _attempts(cfg, assets, run_dir, log, callbacks, resume)
        finally:
            log.close()
    summary.update({"time/total_s": time.perf_counter() - t_start, "train/failures": float(failures),
                    "train/steps_lost": float(lost)})
    print(f"[{cfg.run_name}] held-out accuracy {summary['eval/accuracy_before']:.3f} -> "
          f"{summary['eval/accuracy_after']:.3f} in {summary['time/total_s']:.0f}s; run dir {run_dir}")
    return summary


def _run_dir(cfg: TrainConfig) -> tuple[Path, dict[str, str | bool]]:
    """The run's folder, made, with its config.yaml headed by the code's and the prompts' version (returned:
    the layout's record is added once the cluster is connected)."""
    run_dir = Path(cfg.out_dir) / cfg.run_name
    (run_dir / "rollouts").mkdir(parents=True, exist_ok=True)
    version = {**code_version(), **prompt_version(cfg.marl.prompts)}
    (run_dir / "config.yaml").write_text(config_header(version) + to_yaml(cfg))
    return run_dir, version


def _attempts(
    cfg: TrainConfig,
    assets: RunAssets,
    run_dir: Path,
    log: RunLog,
    callbacks: tuple[StepCallback, ...],
    resume: Path | None,
) -> tuple[dict[str, float], int, int]:
    """Attempts until one finishes: (its summary, failures survived, steps lost to them)."""
    fresh, failures, lost = assets.sampler.state(), 0, 0
    while True:
        cliff = CliffTracker(cfg.cliff.drop, cfg.cliff.window, cfg.cliff.relative_drop)
        progress = Progress(sampler=fresh)
        run = RunState(cfg, assets, run_dir, ckpt.root_dir(cfg, run_dir), log, callbacks, progress, cliff)
        try:
            return attempt(run, resume), failures, lost
        except GroupError as e:
            failures += 1
            resume = _restart_point(run, e, failures, resume)
            lost += run.progress.step - (ckpt.read_progress(resume).step if resume else 0)
        except PlacementError as e:
            if not failures:
                raise
            raise PlacementError(
                f"{e}\n  (after training failure {failures}; the last checkpoint, "
                f"{resume or 'none'}, is kept: the same command resumes from it once the cluster "
                "holds the run)"
            ) from None


def _initial_resume(cfg: TrainConfig, run_dir: Path) -> Path | None:
    spec = cfg.checkpoint.resume
    if spec == "never":
        return None
    if spec == "auto":
        return ckpt.newest(ckpt.root_dir(cfg, run_dir))
    try:
        ckpt.check(Path(spec))
    except ckpt.CheckpointError as e:
        raise InputError(f"checkpoint.resume: {e}") from None
    return Path(spec)


def _restart_point(run: RunState, error: GroupError, failures: int, resume: Path | None) -> Path | None:
    """Where the next attempt starts; re-raises `error` once `checkpoint.max_failures` are used up."""
    cfg = run.cfg
    if failures > cfg.checkpoint.max_failures:
        raise error
    resume = ckpt.newest(run.root) or resume
    gone = f"; lost with their node: {', '.join(run.lost)}" if run.lost else ""
    print(
        f"[{cfg.run_name}] training failure {failures}/{cfg.checkpoint.max_failures}: {error}{gone}; system "
        "torn "
        f"down, restarting from {resume or 'the start'} once the cluster holds the run "
        "(ray.placement_timeout_s="
        f"{cfg.ray.placement_timeout_s:g})",
        flush=True,
    )
    return resume


EXIT_CONFIG, EXIT_INPUT, EXIT_TRAINING, EXIT_STOPPED = 2, 3, 4, 143


def _print_plan(cfg: TrainConfig) -> int:
    from jobs.plan.layout import run_layout
    from jobs.plan.planner import make_plan
    from jobs.plan.report import format_plan

    try:
        plan = make_plan(run_layout(cfg))
    except ValueError as e:  # a model the planner cannot size
        raise ConfigError(f"config: {e}") from None
    print(format_plan(cfg, plan))
    return 0 if plan.fits() else EXIT_CONFIG


def _refuse_unfit(cfg: TrainConfig) -> None:
    """A plan that does not fit its GPUs is a config error, found before anything starts
    (jobs/plan/planner.py)."""
    from jobs.plan.layout import run_layout
    from jobs.plan.planner import refuse_unfit

    try:
        refuse_unfit(run_layout(cfg))
    except ValueError as e:  # PlanError, or a model the planner cannot size
        raise ConfigError(f"config: {e}") from None


def main(argv: list[str] | None = None) -> int:
    """Exit codes: 0 done, 2 config error (or a cluster that does not answer, or resources it cannot hold),
    3 model/data error, 4 training failure, 143 stopped by SIGTERM."""
    args = _parser().parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        if args.plan:
            return _print_plan(cfg)
        _refuse_unfit(cfg)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return EXIT_CONFIG
    if args.print_config:
        print(to_yaml(cfg), end="")
        return 0
    return _train_exit_code(cfg)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m jobs.train", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="YAML config (jobs/configs/*.yaml)")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument(
        "--plan",
        action="store_true",
        help="print the memory plan per GPU and the step-time estimates, exit (2 if it does not fit)",
    )
    parser.add_argument("overrides", nargs="*", help="key.path=value overrides")
    return parser


def _train_exit_code(cfg: TrainConfig) -> int:
    """Trains `cfg`; each failure class is reported on stderr and mapped to its exit code (main's)."""
    try:
        train(cfg)
    except ConfigError as e:  # what the cluster's GPUs refuse (refuse_on_cluster), before any actor starts
        print(e, file=sys.stderr)
        return EXIT_CONFIG
    except (PlacementError, ConnectError) as e:  # no cluster to join, or resources it cannot hold: fixed in
        print(e, file=sys.stderr)  # the config or the environment, found before any actor starts
        return EXIT_CONFIG
    except InputError as e:
        print(f"input error: {e}", file=sys.stderr)
        return EXIT_INPUT
    except StopRequested as e:
        print(f"[{cfg.run_name}] stopped by {e}; actors released", file=sys.stderr)
        return EXIT_STOPPED
    except (RoleDropError, SkippedStepsError) as e:  # a guard that stopped the run: its message says all
        print(f"[{cfg.run_name}] training stopped: {e}", file=sys.stderr)
        return EXIT_TRAINING
    except Exception:  # noqa: BLE001 - any other failure is a training failure with its traceback
        traceback.print_exc()
        return EXIT_TRAINING
    return 0


if __name__ == "__main__":
    sys.exit(main())
