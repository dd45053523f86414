"""One attempt of the driver loop on one set of built handles: start (fresh or from a checkpoint), the steps,
the cliff guard (warn | stop | rollback), checkpoints, and the final eval and export.

One step = train_step (jobs/driver/step.py: collect → score → assign → advantages → update every policy, one
optimizer step each → sync weights) → (eval) → log → (checkpoint) → callbacks. Shared vs isolated is only the
policy map. With rollout.one_step_off_policy the next step's collect runs while the learners update (a knob
of the step's RolloutSource).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from cluster import stop
from cluster.group import GroupError
from cluster.stop import StopRequested
from jobs.config import to_yaml
from jobs.config.guards import role_guards, run_guards
from jobs.config.schema import TrainConfig
from jobs.driver import run_checkpoints as ckpt
from jobs.driver.assets import InputError, RunAssets
from jobs.driver.eval_records import append_eval, eval_metrics, write_eval_turns
from jobs.driver.full_eval import full_evaluation
from jobs.driver.handles import RunHandles, build_handles
from jobs.driver.run_checkpoints import Progress
from jobs.driver.step import RolloutSource, role_caps, train_step
from jobs.driver.updates import check_skipped_steps
from jobs.telemetry.tracking import RunLog
from marl.cliff import CliffTracker
from marl.guard_grammar import at_budget
from marl.guards import guard_metrics
from marl.seeds import derive_seed
from marl.types import Episode, Task
from rollout.engine import Sampling


class StepCallback(Protocol):
    """Told about every finished step (Tune reporting, dashboard gauges, ...). `checkpoint` is the folder
    of the checkpoint committed at this step, if any."""

    def on_step(self, step: int, metrics: dict[str, float], checkpoint: Path | None) -> None: ...


@dataclass
class RunState:
    """One attempt's driver state. `progress` counts completed steps; `learners_ahead` is set while the
    learners may hold an update `progress` does not count yet (a stop then must not checkpoint them)."""

    cfg: TrainConfig
    assets: RunAssets
    run_dir: Path
    root: Path  # checkpoint folder
    log: RunLog
    callbacks: tuple[StepCallback, ...]
    progress: Progress
    cliff: CliffTracker
    learners_ahead: bool = False
    lost: list[str] = dataclasses.field(default_factory=list)  # members a failure found on dead nodes
    base_eval_s: float | None = None  # the base model's eval time, logged with step 0 (fresh starts only)
    # The base model's eval episodes and parse failures (eval/before/*), logged with step 0: a workflow's
    # coordinating roles' parse rates at base decide whether it is testable at all (fresh starts only).
    base_parse: dict[str, float] = dataclasses.field(default_factory=dict)

    def mark_learners_ahead(self) -> None:
        """The learners are about to take the step `progress` does not count yet."""
        self.learners_ahead = True


# The base evaluation's figures logged with step 0 as eval/before/*, beside eval/accuracy_before.
BASE_KEYS = ("eval/parse_failures/", "eval/turns/", "eval/response_len/", "eval/choice/", "eval/failures/",
             "eval/plan_format/", "eval/verdict/", "eval/guard/")


def evaluate(handles: RunHandles, cfg: TrainConfig, tasks: list[Task]) -> list[Episode]:
    """The workflow's episodes on the held-out tasks, one sample each at the eval temperature (pass@1)."""
    if not tasks:
        return []
    s = cfg.rollout.sampling
    sampling = Sampling(
        cfg.rollout.eval_temperature,
        s.top_p,
        s.max_new_tokens,
        seed=derive_seed(cfg.seed, "eval"),
        role_caps=role_caps(cfg.rollout),
        role_guards=role_guards(cfg),
    )
    return handles.collector.collect(tasks, 1, sampling).episodes


def timed_evaluate(handles: RunHandles, cfg: TrainConfig, tasks: list[Task], run_dir: Path,
                   steps_done: int) -> dict[str, float]:
    """jobs.driver.eval_records.eval_metrics of `evaluate` and its wall time (a study's cost includes
    its evals); the per-task results go to the run dir's eval_tasks.csv, the turns to eval_rollouts/
    (one Parquet per evaluation)."""
    t0 = time.perf_counter()
    episodes = evaluate(handles, cfg, tasks)
    append_eval(run_dir, steps_done, episodes)
    write_eval_turns(run_dir, steps_done, episodes)
    guarded = {f"eval/{k}": v for k, v in guard_metrics(episodes, run_guards(cfg), at_budget).items()}
    return {**eval_metrics(episodes, handles.collector.family), **guarded,
            "time/eval_s": time.perf_counter() - t0}


def attempt(run: RunState, resume: Path | None) -> dict[str, float]:
    """Build the handles, start from `resume` (or fresh), train to the end; the handles are released on any
    exit. A stop at a step boundary commits a checkpoint first."""
    cfg = run.cfg
    handles = build_handles(run.assets.layout, run.assets.model_paths, run.assets.family)
    try:
        # A new source holds no episodes: an attempt starts from a checkpoint, never from an earlier one's.
        display = run.log.display.episodes if run.log.display is not None else None
        source = RolloutSource(handles, cfg, run.assets.sampler, on_episode=display)
        if resume:
            _restore(run, handles, resume)
        else:
            _fresh_start(run, handles)
        while run.progress.step < cfg.steps:
            if _step(run, handles, source):
                break
        final, acc_after = _finish(run, handles)
    except StopRequested:
        stop.acknowledge()  # the checkpoint's own waits must not raise it again
        _checkpoint_on_stop(run, handles)
        raise
    except GroupError:
        run.lost = handles.placement.lost_members() if handles.placement is not None else []
        raise
    finally:
        handles.shutdown()
    return {"eval/accuracy_before": run.progress.acc_before, "eval/accuracy_after": acc_after,
            "train/rollbacks": float(run.progress.rollbacks), **run.cliff.metrics(),
            **{k: v for k, v in final.items() if k.startswith("eval/full/")}}


def _finish(run: RunState, handles: RunHandles) -> tuple[dict[str, float], float]:
    """The end of a run that trained to its last step (or its cliff guard's stop): the final evaluation with
    its cliff guard, every policy's export and, when asked, the whole split's evaluation, logged. Returns
    (those metrics, the final accuracy)."""
    cfg = run.cfg
    final = timed_evaluate(handles, cfg, run.assets.eval_tasks, run.run_dir, run.progress.step)
    acc_after = final["eval/accuracy"]
    final.update(final_cliff_guard(cfg, run.cliff, run.progress.step, acc_after))
    for pid, learner in handles.learners.items():
        learner.export(str(run.run_dir / "export" / pid))
    if run.assets.full_eval_tasks:  # after the export: evaluating the peak serves the peak's weights
        final.update(_evaluate_whole_split(run, handles, acc_after))
    run.log.log(cfg.steps, final)
    return final, acc_after


def _evaluate_whole_split(run: RunState, handles: RunHandles, final_accuracy: float) -> dict[str, float]:
    """The final weights, then the peak checkpoint's, on every held-out task (jobs/driver/full_eval.py)."""
    def restore(folder: Path) -> None:
        _load_learners(handles, folder)
        handles.sync(version=run.progress.weight_version + 1)

    def accuracy(tasks: list[Task]) -> float:
        return eval_metrics(evaluate(handles, run.cfg, tasks))["eval/accuracy"]

    return full_evaluation(
        run.assets.full_eval_tasks, accuracy, run.cfg.steps, final_accuracy, run.root, restore
    )


def _fresh_start(run: RunState, handles: RunHandles) -> None:
    # a restart without a checkpoint replays the same prompts
    run.assets.sampler.load_state(run.progress.sampler)
    ckpt.truncate_metrics(run.log.path, 0)
    base = timed_evaluate(handles, run.cfg, run.assets.eval_tasks, run.run_dir, 0)
    acc, run.base_eval_s = base["eval/accuracy"], base["time/eval_s"]
    run.base_parse = {k.replace("eval/", "eval/before/", 1): v for k, v in base.items()
                      if k.startswith(BASE_KEYS) or k == "eval/episodes"}
    run.cliff.update(0, acc)
    run.progress = dataclasses.replace(run.progress, acc_before=acc, cliff=run.cliff.state(),
                                       best_accuracy=acc if not math.isnan(acc) else -math.inf)
    policy_map = run.assets.layout.policy_map
    print(f"[{run.cfg.run_name}] policies {policy_map.policies} roles {policy_map.roles}; "
          f"held-out accuracy {acc:.3f}", flush=True)


def _restore(run: RunState, handles: RunHandles, folder: Path) -> None:
    """Learner state into every rank, driver state, then the engines re-synced to the restored version."""
    try:
        progress = ckpt.read_progress(folder)
        _load_learners(handles, folder)
        run.assets.sampler.load_state(progress.sampler)
    except (ckpt.CheckpointError, ValueError) as e:
        raise InputError(f"checkpoint {folder} cannot be restored: {e}") from e
    run.cliff.load_state(progress.cliff)
    handles.sync(version=progress.weight_version)
    dropped = ckpt.truncate_metrics(run.log.path, progress.step)
    run.progress = progress
    print(f"[{run.cfg.run_name}] resumed from {folder} at step {progress.step} (weight version "
          f"{progress.weight_version}; {dropped} metric lines of later steps dropped)", flush=True)


def _load_learners(handles: RunHandles, folder: Path) -> None:
    for pid, learner in handles.learners.items():
        state = folder / "policies" / pid
        if not state.is_dir():
            raise ckpt.CheckpointError(f"it has no state for policy {pid!r} (another sharing or workflow?)")
        try:
            learner.load(str(state))
        except Exception as e:  # noqa: BLE001 - a rank's StateError arrives wrapped by the group
            if ckpt.member_lost(e):
                raise  # a dead or hung rank, not a bad checkpoint: the driver may restart on it
            raise ckpt.CheckpointError(str(e)) from e


def _step(run: RunState, handles: RunHandles, source: RolloutSource) -> bool:
    """One training step with its eval, log, checkpoint and callbacks; True when the cliff guard stops."""
    cfg, step = run.cfg, run.progress.step
    version = run.progress.weight_version + 1
    metrics = train_step(handles, cfg, source, step, run.assets.pad_ids, run.run_dir, version,
                         before_update=run.mark_learners_ahead)
    accuracy, stop, flagged = _periodic_eval(run, handles, step, metrics)
    best = max(run.progress.best_accuracy, accuracy if accuracy is not None else -math.inf)
    run.progress = dataclasses.replace(run.progress, step=step + 1, weight_version=version,
                                       eval_accuracy=accuracy, sampler=source.sampler_state,
                                       cliff=run.cliff.state(), best_accuracy=best)
    if flagged and cfg.cliff.action == "rollback":
        metrics.update(_rollback(run, handles, source))
    if step == 0:  # the run's data and its base model's held-out accuracy (the curve's point at 0 steps)
        metrics.update({**run.assets.data_metrics, "eval/accuracy_before": run.progress.acc_before})
        if run.base_eval_s is not None:
            metrics.update({"time/eval_before_s": run.base_eval_s, **run.base_parse})
    run.learners_ahead = False
    run.log.log(step, metrics)
    check_skipped_steps(metrics, cfg.learner.max_consecutive_skipped_steps, step)  # after the row is logged
    every = cfg.checkpoint.every
    folder = _save(run, handles) if every and run.progress.step % every == 0 else None
    for cb in run.callbacks:
        cb.on_step(step, metrics, folder)
    run.log.progress(step, metrics)
    return stop


def _periodic_eval(run: RunState, handles: RunHandles, step: int,
                   metrics: dict[str, float]) -> tuple[float | None, bool, bool]:
    """After step `step`, when `eval_every` falls on it (not on the last step, evaluated by `_finish`): the
    held-out evaluation and its cliff guard, added to `metrics`. Returns (the accuracy, None when not
    evaluated or with no held-out tasks; whether the guard stops the run; whether it flagged a cliff)."""
    cfg, accuracy, stop, flagged = run.cfg, None, False, False
    if cfg.eval_every and (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.steps:
        metrics.update(timed_evaluate(handles, cfg, run.assets.eval_tasks, run.run_dir, step + 1))
        accuracy = metrics["eval/accuracy"]
        stop, guard = cliff_guard(cfg, run.cliff, step + 1, accuracy)
        metrics.update(guard)
        flagged = guard["cliff/flagged"] == 1.0
    if accuracy is not None and math.isnan(accuracy):
        accuracy = None  # no held-out tasks: nothing to rank this checkpoint by
    return accuracy, stop, flagged


def cliff_guard(
    cfg: TrainConfig, cliff: CliffTracker, step: int, accuracy: float
) -> tuple[bool, dict[str, float]]:
    """Track held-out `accuracy`; on a terminal cliff warn, and with cliff.action=stop end the run. Returns
    (whether the run stops, the tracker's metrics and `cliff/flagged`)."""
    flagged = cliff.update(step, accuracy)
    if flagged:
        print(f"[{cfg.run_name}] terminal cliff: held-out accuracy {accuracy:.3f} is "
              f"below its peak {cliff.peak:.3f} (step {cliff.peak_step}) by >= {cfg.cliff.drop}"
              f"{f' or >= {cfg.cliff.relative_drop:.0%} of it' if cfg.cliff.relative_drop else ''} for "
              f"{cliff.below} evaluations; action={cfg.cliff.action}", flush=True)
    return flagged and cfg.cliff.action == "stop", {**cliff.metrics(), "cliff/flagged": float(flagged)}


def final_cliff_guard(
    cfg: TrainConfig, cliff: CliffTracker, steps_done: int, accuracy: float
) -> dict[str, float]:
    """The final evaluation counts toward the cliff flag like the periodic ones, which skip the last step so
    as not to evaluate it twice. A run that ends early (the guard stopped it) already fed this step's
    evaluation, and a run without held-out tasks has nothing to feed. Nothing is left to stop or roll back:
    the guard records (and warns), and the final weights are exported as they are."""
    if steps_done < cfg.steps or math.isnan(accuracy):
        return {}
    return cliff_guard(cfg, cliff, steps_done, accuracy)[1]


def _rollback(run: RunState, handles: RunHandles, source: RolloutSource) -> dict[str, float]:
    """Restore the most accurate checkpoint's learner state (weights, optimizer, schedule, RNG) and serve it;
    returns the rollback's metrics (none when there is no checkpoint to roll back to).

    The tracker keeps its peak (the restored weights are the peak's) and restarts its window: another
    rollback needs `cliff.window` fresh evaluations below the peak. The step counter, data position and
    step budget are not rewound, so rollbacks end with the run instead of looping."""
    target = ckpt.best(run.root)
    if target is None:
        print(
            f"[{run.cfg.run_name}] cliff rollback skipped: no evaluated checkpoint in {run.root}", flush=True
        )
        return {}
    _load_learners(handles, target)
    source.rewind(run.progress.sampler)  # episodes prefetched by the weights rolled back are dropped
    version = run.progress.weight_version + 1
    handles.sync(version=version)
    run.cliff.below = 0
    run.progress = dataclasses.replace(run.progress, weight_version=version, cliff=run.cliff.state(),
                                       eval_accuracy=None, rollbacks=run.progress.rollbacks + 1)
    print(f"[{run.cfg.run_name}] cliff rollback to {target}", flush=True)
    return {"cliff/rollback_to_step": float(ckpt.read_progress(target).step),
            "cliff/rollbacks": float(run.progress.rollbacks), "cliff/evals_below": 0.0}


def _save(run: RunState, handles: RunHandles) -> Path:
    t0 = time.perf_counter()
    folder = ckpt.write(run.root, run.progress, handles.learners, to_yaml(run.cfg))
    ckpt.prune(run.root, run.cfg.checkpoint.keep_last, run.cfg.checkpoint.keep_best)
    print(
        f"[{run.cfg.run_name}] checkpoint {folder} committed in {time.perf_counter() - t0:.1f}s", flush=True
    )
    return folder


def _checkpoint_on_stop(run: RunState, handles: RunHandles) -> None:
    """On a graceful stop, commit the last completed step (unless the learners are already past it)."""
    if not run.cfg.checkpoint.every or run.progress.step == 0:
        return
    if run.learners_ahead:
        print(
            f"[{run.cfg.run_name}] stopped during an update: the learners are past step {run.progress.step}, "
            "so the last committed checkpoint stands",
            flush=True,
        )
        return
    try:
        _save(run, handles)
    except Exception as e:  # noqa: BLE001 - the stop proceeds; the previous checkpoint is intact
        print(f"[{run.cfg.run_name}] no checkpoint on stop: {e}", flush=True)
