"""The training driver: `python -m jobs.train --config X [key=value ...] [--print-config]`.

One step = collect → score → assign → advantages → update every policy (one optimizer step each) →
sync weights → log → (eval). Shared vs isolated is only the policy map.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from omegaconf import OmegaConf

from cluster.connect import connect
from jobs.config import ConfigError, load_config, to_yaml
from jobs.models import resolve_model
from jobs.system import System, build_system
from jobs.tracking import RunLog, progress_line
from learners.advantages import ADVANTAGE_ESTIMATORS, group_keys, keys_to_ids
from learners.batch import build_batches, empty_batch, flat_rewards
from marl.cliff import CliffTracker
from marl.metrics import episode_metrics
from marl.policy_map import PolicyMap
from marl.tasks import get_family
from marl.tasks.data import PromptSampler, load_tasks
from marl.types import Task
from marl.workflows import roles_of
from rollout.engine import Sampling
from rollout.storage import write_episodes


def train_step(system: System, cfg: Any, tasks: list[Task], step: int, pad_id: int, run_dir: Path) -> dict:
    t0 = time.perf_counter()
    s = cfg.rollout.sampling
    sampling = Sampling(s.temperature, s.top_p, s.max_new_tokens, seed=cfg.seed * 1_000_003 + step)
    episodes = system.collector.collect(tasks, cfg.rollout.samples_per_prompt, sampling)
    write_episodes(episodes, step, run_dir / "rollouts" / f"step_{step:06d}.parquet")
    t1 = time.perf_counter()
    keys = keys_to_ids(group_keys(episodes, cfg.algo.group_by))
    advantages = ADVANTAGE_ESTIMATORS[cfg.algo.advantage](flat_rewards(episodes), keys, norm_std=cfg.algo.norm_std)
    batches, batch_stats = build_batches(episodes, system.policy_map, advantages, pad_id, cfg.algo.max_len)
    updates = [lg.submit_update(batches.get(pid) or empty_batch(pid, pad_id)) for pid, lg in system.learners.items()]
    update_metrics = {k: v for u in updates for k, v in u.result().items()}
    t2 = time.perf_counter()
    sync_metrics = system.sync(version=step + 1)
    return {
        **episode_metrics(episodes, system.policy_map.roles), **update_metrics, **sync_metrics,
        **{k: float(v) for k, v in batch_stats.items()},
        "time/rollout_s": t1 - t0, "time/update_s": t2 - t1, "time/step_s": time.perf_counter() - t0,
    }


def evaluate(system: System, cfg: Any, tasks: list[Task]) -> float:
    """pass@1 of the workflow's final answer at the eval temperature."""
    if not tasks:
        return float("nan")
    s = cfg.rollout.sampling
    sampling = Sampling(cfg.rollout.eval_temperature, s.top_p, s.max_new_tokens, seed=cfg.seed + 17)
    episodes = system.collector.collect(tasks, 1, sampling)
    return sum(e.reward for e in episodes) / len(episodes)


class StepCallback(Protocol):
    """Told about every finished step (Tune reporting, dashboard gauges, ...). `checkpoint` is the folder
    of the checkpoint committed at this step, if any."""

    def on_step(self, step: int, metrics: dict[str, float], checkpoint: Path | None) -> None: ...


@dataclass
class Inputs:
    model_path: str
    family: Any
    sampler: PromptSampler
    eval_tasks: list[Task]
    policy_map: PolicyMap
    pad_id: int


def prepare(cfg: Any) -> Inputs:
    """Everything the loop needs that does not run on the cluster; bad model paths and data fail here."""
    model_path = resolve_model(cfg.model.path)
    train_tasks = load_tasks(cfg.data.train, cfg.data.train_size, cfg.seed, cfg.data.task)
    eval_size, kind = cfg.data.eval_size, cfg.data.task
    eval_tasks = load_tasks(cfg.data.eval, eval_size, cfg.seed + 1, kind) if eval_size else []
    roles = list(roles_of(cfg.marl.workflow))
    policy_map = PolicyMap.build(cfg.marl.sharing, roles, OmegaConf.to_container(cfg.marl.policy_map))
    family = get_family(cfg.data.task, cfg.data.answer_fallback, OmegaConf.to_container(cfg.data.sandbox))
    return Inputs(model_path, family, PromptSampler(train_tasks, cfg.seed), eval_tasks, policy_map, _pad_id(model_path))


def train(cfg: Any, callbacks: tuple[StepCallback, ...] = ()) -> dict[str, float]:
    """Runs the whole job; returns the summary (accuracy before/after, wall time, cliff)."""
    t_start = time.perf_counter()
    run_dir = Path(cfg.out_dir) / cfg.run_name
    (run_dir / "rollouts").mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    try:
        inp = prepare(cfg)
    except (ValueError, FileNotFoundError) as e:
        raise InputError(str(e)) from e
    roles, cliff, log = inp.policy_map.roles, CliffTracker(cfg.cliff.drop, cfg.cliff.window), RunLog(run_dir)
    with connect(cfg.ray.address, cfg.ray.num_cpus, cfg.ray.include_dashboard):
        _install_stop_handler()
        system = build_system(cfg, inp.model_path, inp.policy_map, inp.family)
        try:
            acc_before = evaluate(system, cfg, inp.eval_tasks)
            cliff.update(0, acc_before)
            print(f"[{cfg.run_name}] policies {inp.policy_map.policies} roles {roles}; "
                  f"held-out accuracy {acc_before:.3f}")
            for step in range(cfg.steps):
                tasks = inp.sampler.next(cfg.rollout.prompts_per_step)
                metrics = train_step(system, cfg, tasks, step, inp.pad_id, run_dir)
                stop = False
                if cfg.eval_every and (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.steps:
                    metrics["eval/accuracy"] = evaluate(system, cfg, inp.eval_tasks)
                    stop = _cliff_guard(cfg, cliff, step + 1, metrics)
                log.log(step, metrics)
                for cb in callbacks:
                    cb.on_step(step, metrics, None)
                print(progress_line(step, cfg.steps, metrics, roles), flush=True)
                if stop:
                    break
            acc_after = evaluate(system, cfg, inp.eval_tasks)
            log.log(cfg.steps, {"eval/accuracy": acc_after})
            for pid, learner in system.learners.items():
                learner.export(str(run_dir / "export" / pid))
        finally:
            system.shutdown()
            log.close()
    summary = {"eval/accuracy_before": acc_before, "eval/accuracy_after": acc_after,
               "time/total_s": time.perf_counter() - t_start, **cliff.metrics()}
    print(f"[{cfg.run_name}] held-out accuracy {acc_before:.3f} -> {acc_after:.3f} "
          f"in {summary['time/total_s']:.0f}s; run dir {run_dir}")
    return summary


def _cliff_guard(cfg: Any, cliff: CliffTracker, step: int, metrics: dict[str, float]) -> bool:
    """Track held-out accuracy; on a terminal cliff warn, and with cliff.action=stop end the run."""
    flagged = cliff.update(step, metrics["eval/accuracy"])
    metrics.update({**cliff.metrics(), "cliff/flagged": float(flagged)})
    if flagged:
        print(f"[{cfg.run_name}] terminal cliff: held-out accuracy {metrics['eval/accuracy']:.3f} is "
              f">= {cfg.cliff.drop} below its peak {cliff.peak:.3f} (step {cliff.peak_step}) for "
              f"{cliff.below} evaluations; action={cfg.cliff.action}", flush=True)
    return flagged and cfg.cliff.action == "stop"


def _pad_id(model_path: str) -> int:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    return tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id


class InputError(ValueError):
    """The model or the data cannot be used (missing folder, no valid rows, ...)."""


class StopRequested(BaseException):
    """SIGTERM (e.g. `ray job stop`): unwind through the cleanup that releases actors.

    A BaseException, like KeyboardInterrupt, so that `except Exception` handlers on the way (which turn a
    member's failure into an attributable GroupError) cannot re-label a stop as a training failure."""


EXIT_CONFIG, EXIT_INPUT, EXIT_TRAINING, EXIT_STOPPED = 2, 3, 4, 143


def _install_stop_handler() -> None:
    # Only the main thread may set signal handlers (a Tune trainable runs the driver elsewhere).
    if threading.current_thread() is threading.main_thread():
        def _raise(signum, frame):  # noqa: ARG001 - signal handler signature
            raise StopRequested(f"signal {signum}")

        signal.signal(signal.SIGTERM, _raise)


def main(argv: list[str] | None = None) -> int:
    """Exit codes: 0 done, 2 config error, 3 model/data error, 4 training failure, 143 stopped by SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m jobs.train", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="YAML config (jobs/configs/*.yaml)")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument("overrides", nargs="*", help="key.path=value overrides")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return EXIT_CONFIG
    if args.print_config:
        print(to_yaml(cfg), end="")
        return 0
    try:
        train(cfg)
    except InputError as e:
        print(f"input error: {e}", file=sys.stderr)
        return EXIT_INPUT
    except StopRequested as e:
        print(f"[{cfg.run_name}] stopped by {e}; actors released", file=sys.stderr)
        return EXIT_STOPPED
    except Exception:  # noqa: BLE001 - any other failure is a training failure with its traceback
        traceback.print_exc()
        return EXIT_TRAINING
    return 0


if __name__ == "__main__":
    sys.exit(main())
