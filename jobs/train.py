"""The training driver: `python -m jobs.train --config X [key=value ...] [--print-config]`.

One step = collect → score → assign → advantages → update every policy (one optimizer step each) →
sync weights → log → (eval). Shared vs isolated is only the policy map.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from cluster.connect import connect
from jobs.config import ConfigError, load_config, to_yaml
from jobs.models import resolve_model
from jobs.system import System, build_system
from jobs.tracking import RunLog, progress_line
from learners.advantages import ADVANTAGE_ESTIMATORS, group_keys, keys_to_ids
from learners.batch import build_batches, empty_batch, flat_rewards
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


def train(cfg: Any) -> dict[str, float]:
    """Runs the whole job; returns the summary (accuracy before/after, wall time)."""
    t_start = time.perf_counter()
    run_dir = Path(cfg.out_dir) / cfg.run_name
    (run_dir / "rollouts").mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    model_path = resolve_model(cfg.model.path)
    family = get_family(cfg.data.task, cfg.data.answer_fallback)
    sampler = PromptSampler(load_tasks(cfg.data.train, cfg.data.train_size, cfg.seed, cfg.data.task), cfg.seed)
    eval_tasks = []
    if cfg.data.eval_size:
        eval_tasks = load_tasks(cfg.data.eval, cfg.data.eval_size, cfg.seed + 1, cfg.data.task)
    roles = list(roles_of(cfg.marl.workflow))
    policy_map = PolicyMap.build(cfg.marl.sharing, roles, OmegaConf.to_container(cfg.marl.policy_map))
    pad_id = _pad_id(model_path)
    log = RunLog(run_dir)
    with connect(cfg.ray.address, cfg.ray.num_cpus, cfg.ray.include_dashboard):
        system = build_system(cfg, model_path, policy_map, family)
        try:
            acc_before = evaluate(system, cfg, eval_tasks)
            print(f"[{cfg.run_name}] policies {policy_map.policies} roles {roles}; held-out accuracy {acc_before:.3f}")
            for step in range(cfg.steps):
                metrics = train_step(system, cfg, sampler.next(cfg.rollout.prompts_per_step), step, pad_id, run_dir)
                if cfg.eval_every and (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.steps:
                    metrics["eval/accuracy"] = evaluate(system, cfg, eval_tasks)
                log.log(step, metrics)
                print(progress_line(step, cfg.steps, metrics, roles), flush=True)
            acc_after = evaluate(system, cfg, eval_tasks)
            log.log(cfg.steps, {"eval/accuracy": acc_after})
            for pid, learner in system.learners.items():
                learner.export(str(run_dir / "export" / pid))
        finally:
            system.shutdown()
            log.close()
    summary = {"eval/accuracy_before": acc_before, "eval/accuracy_after": acc_after,
               "time/total_s": time.perf_counter() - t_start}
    print(f"[{cfg.run_name}] held-out accuracy {acc_before:.3f} -> {acc_after:.3f} "
          f"in {summary['time/total_s']:.0f}s; run dir {run_dir}")
    return summary


def _pad_id(model_path: str) -> int:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    return tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.train", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="YAML config (jobs/configs/*.yaml)")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument("overrides", nargs="*", help="key.path=value overrides")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 2
    if args.print_config:
        print(to_yaml(cfg), end="")
        return 0
    train(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
