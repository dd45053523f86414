"""The learning rate each policy trains at, per training step, under each `learner.optim.schedule_unit`, for
an isolated orch_workers run (three policies; the worker policy holds three parallel agents' rows, so with PPO
mini-batches of one agent's rows it takes three optimizer steps per training step).

    .venv/bin/python -m benchmarks.lr_schedule [--steps 60] [--warmup 5] [--every
    3] [--clamp] [--no-start-zero]
        [--schedule cosine|constant] [--real]

The schedule is verl's (the paper's stack) unless asked otherwise: warmup from lr 0 (`warmup_start_zero`) and
the unclamped cosine (`cosine_clamp=false`); `--schedule constant` is what verl 0.6.1 built for the paper's
runs (paper_base.yaml), where the units differ only in how fast each policy warms up. Each row prints, per
unit and policy, the lr of that step's update call as the run logs it (`lr/<policy>`: the mean over the
call's optimizer steps). The expected values come from learners.schedule and the PPO plan's optimizer-step
counts (learners.update.ppo_plan); `--real` also runs the three policies' learners in-process on builtin:tiny
(a tiny update per call on synthetic rows, no rollout), reads the `lr/<policy>` they log, and prints the
largest gap to the expected values.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

from jobs.config import load_config
from jobs.config.schema import TrainConfig
from learners.batch import TrainBatch
from learners.schedule import lr_factor, schedule_position
from learners.update.ppo_plan import num_mini_batches
from marl.policy_map import PolicyMap
from marl.workflows import roles_of
from tests.builders import random_batch

UNITS = ("step", "optimizer_step", "update_call")
AGENTS = {"orchestrator": 1, "worker": 3, "synthesizer": 1}  # orch_workers: rows per episode, by role
EPISODES = 4  # per training step; the PPO mini-batch is one agent's rows, as the paper's 512 = 64 x 8


def config(unit: str, args: argparse.Namespace) -> Any:
    return load_config(
        "jobs/configs/tiny.yaml",
        [
            "marl.workflow=orch_workers",
            "marl.sharing=isolated",
            f"steps={args.steps}",
            "learner.ranks=0",
            f"learner.optim.warmup_steps={args.warmup}",
            f"learner.optim.schedule={args.schedule}",
            f"learner.optim.schedule_unit={unit}",
            f"learner.optim.warmup_start_zero={str(args.start_zero).lower()}",
            f"learner.optim.cosine_clamp={str(args.clamp).lower()}",
            f"algo.ppo_mini_batch_size={EPISODES}",
            "learner.role_grad_diagnostics=false",
            "model.dtype=float32",
            "model.lora.enabled=false",
        ],
    )


def expected_lrs(cfg: TrainConfig) -> dict[str, list[float]]:
    """policy -> the lr it logs at each training step: the mean of its update call's optimizer steps' lrs."""
    opt, policies = cfg.learner.optim, PolicyMap.isolated(roles_of(cfg.marl.workflow)).policies
    out: dict[str, list[float]] = {}
    for index, pid in enumerate(policies):
        k = num_mini_batches(AGENTS[pid] * EPISODES, cfg.algo.ppo_mini_batch_size)
        # scheduler ticks per optimizer step, or none
        per_call = k if opt.schedule_unit == "optimizer_step" else 1
        lrs = []
        for t in range(cfg.steps):
            ticks = [t * k + i if per_call > 1 else t for i in range(k)]
            positions = [schedule_position(x, opt.schedule_unit, len(policies), index) for x in ticks]
            lrs.append(sum(opt.lr * lr_factor(p, opt.warmup_steps, cfg.steps, opt.schedule, opt.min_lr_ratio,
                                              start_zero=opt.warmup_start_zero, clamp=opt.cosine_clamp)
                           for p in positions) / k)
        out[pid] = lrs
    return out


def rows_of(pid: str, vocab: int) -> TrainBatch:
    """AGENTS[pid] x EPISODES short rows, advantages +-1, one agent instance per slot."""
    n = AGENTS[pid] * EPISODES
    return random_batch(n, 6, 3, vocab, policy_id=pid, roles=(pid,),
                        agents=[f"{pid}{i // EPISODES}" for i in range(n)],
                        advantages=torch.tensor([1.0, -1.0] * (n // 2)))


def logged_lrs(cfg: TrainConfig) -> dict[str, list[float]]:
    """The `lr/<policy>` each real learner logs, driven as the run's step drives them (one call per step)."""
    from jobs.models.resolve import resolve_model
    from learners.group import LearnerGroup
    from tests.builders import learner_spec

    path, policies = resolve_model(cfg.model.path), PolicyMap.isolated(roles_of(cfg.marl.workflow)).policies
    groups = {pid: LearnerGroup(learner_spec(cfg, path, policy_id=pid, total_steps=cfg.steps,
                                             num_policies=len(policies), policy_index=i), "lr")
              for i, pid in enumerate(policies)}
    vocab = 64  # builtin:tiny's vocabulary is larger; any ids below it will do
    out: dict[str, list[float]] = {pid: [] for pid in policies}
    for t in range(cfg.steps):
        for pid, group in groups.items():
            out[pid].append(group.update(rows_of(pid, vocab), t)[f"lr/{pid}"])
    for group in groups.values():
        group.shutdown()
    return out


def print_table(curves: dict[str, dict[str, list[float]]], every: int) -> None:
    policies = list(next(iter(curves.values())))
    print(f"{'':>5}" + "".join(f"{unit:<30}" for unit in curves))
    print(f"{'step':>5}" + "".join(f"{pid[:9]:>10}" for _ in curves for pid in policies))
    steps = len(next(iter(next(iter(curves.values())).values())))
    for t in range(steps):
        if t % every == 0 or t == steps - 1:
            print(f"{t:>5}" + "".join(f"{curves[u][p][t]:>10.2e}" for u in curves for p in policies))


def print_summary(curves: dict[str, dict[str, list[float]]], lr: float) -> None:
    """Per unit and policy: the first step whose lr is below 1 % of the base lr,
    and the largest lr after it."""
    print(
        "\nfirst step at < 1 % of the base lr, and the largest lr after it (a climb back: unclamped cosine)"
    )
    for unit, per_policy in curves.items():
        for pid, lrs in per_policy.items():
            low = next((t for t, x in enumerate(lrs) if t > 0 and x < 0.01 * lr), None)
            after = max(lrs[low:]) if low is not None else float("nan")
            print(f"  {unit:>15} {pid:>13}: " + (f"step {low:>3}, then up to {after:.3e} ({after / lr:.0%})"
                                                  if low is not None else "never"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--every", type=int, default=3, help="print every n-th step")
    p.add_argument("--schedule", choices=("cosine", "constant"), default="cosine")
    p.add_argument("--clamp", action="store_true", help="this project's clamped cosine instead of verl's")
    p.add_argument("--no-start-zero", dest="start_zero", action="store_false")
    p.add_argument("--real", action="store_true", help="also run the learners on builtin:tiny and compare")
    args = p.parse_args()
    cfgs = {unit: config(unit, args) for unit in UNITS}
    curves = {unit: expected_lrs(cfg) for unit, cfg in cfgs.items()}
    print(f"orch_workers, isolated: {args.steps} steps, warmup {args.warmup}, {args.schedule}, "
          f"start_zero={args.start_zero}, "
          f"cosine_clamp={args.clamp}; optimizer steps per call: "
          + ", ".join(f"{pid} {num_mini_batches(n * EPISODES, EPISODES)}" for pid, n in AGENTS.items()))
    print_table(curves, args.every)
    print_summary(curves, cfgs["step"].learner.optim.lr)
    if args.real:
        gaps = {unit: max(abs(a - b) for pid, lrs in logged_lrs(cfg).items()
                          for a, b in zip(lrs, curves[unit][pid], strict=True)) for unit, cfg in cfgs.items()}
        print("\nreal learners (builtin:tiny): largest |logged - expected| lr per unit: "
              + ", ".join(f"{unit} {gap:.1e}" for unit, gap in gaps.items()))


if __name__ == "__main__":
    main()
