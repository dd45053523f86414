"""The cost of measuring the diagnostics on rows skipped for a zero advantage, side by side in one run.

    .venv/bin/python -m benchmarks.skipped_rows [--model
    builtin:smollm2-135m-instruct] [--rows 32] [--seq 128]
        [--prompt 32] [--micro 16] [--zero 0.5] [--warmup 1] [--steps 3]

Workload (benchmarks/update.py's make_batch): `rows` sequences of `seq` random tokens, loss on the
last `seq - prompt`, a fraction `zero` of the rows with advantage 0 (GRPO groups whose samples all
scored alike), LoRA r64/α32 (`--lora-rank`) on all linear layers, fp32, one optimizer step, one
in-process torch rank, per-role gradients and the policy movement on (the defaults). Variants, each
the project's Learner.update on its own
learner:
- no pass: the zero-advantage rows never reach the learner (their entropy and engine gap go unmeasured), the
  policy movement over every trained row (the learner before the metrics pass);
- sampled (default): `learner.diagnostics.sample_rows=8`, the metrics pass and the movement's forward over a
  seeded per-role sample of 8 rows each (learners/diagnostic_sample.py), as the group scatters them;
- all rows: `sample_rows=all`, one no-grad forward over every skipped row and the movement over every trained
  row (the default before the sample);
- off: `sample_rows=0`, neither forward;
- train all: `algo.skip_zero_advantage=false`, every row through the training passes (the same metrics, the
  same update, at full cost).
Prints the median wall and CPU seconds per training step after `warmup` rounds, and the ratios to `no pass`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable

import torch

from benchmarks.update import make_batch, median_step_s
from jobs.config import load_config
from jobs.models.resolve import resolve_model
from learners.diagnostic_sample import sample_diagnostics, sample_size
from learners.learner import Learner
from learners.state.weights import load_policy_model
from learners.update.ppo_plan import plan_update
from tests.builders import learner_spec


def step_of(
    path: str, overrides: list[str], batch, keep: torch.Tensor, metrics_pass: bool
) -> Callable[[], object]:
    cfg = load_config("jobs/configs/tiny.yaml", overrides)
    learner = Learner(learner_spec(cfg, path, total_steps=1000))
    (rows,), (plan,) = plan_update(batch.loss_mask[:, 1:], keep, 1, 0, 1, cfg.algo.loss_agg, 0,
                                   sorted(set(batch.roles)))
    if not metrics_pass:  # the learner before the metrics-only pass: dropped rows were never sent
        rows = rows[:len(rows) - len(plan.metric_rows or [])]
        plan = dataclasses.replace(plan, metric_rows=None)
    else:  # as LearnerGroup scatters them: the diagnostics' sample of this config (all: the plan as it is)
        sample = sample_diagnostics(batch.roles, batch.loss_mask[:, 1:].sum(-1), [rows], [plan],
                                    sample_size(cfg.learner.diagnostics.sample_rows), (1, 2), recompute=True)
        (rows,), (plan,) = sample.rows, sample.plans
    payload = batch.select(rows)
    return lambda: learner.update(payload, plan)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="builtin:smollm2-135m-instruct")
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--micro", type=int, default=16)
    p.add_argument("--zero", type=float, default=0.5, help="fraction of rows with advantage 0")
    p.add_argument("--lora-rank", type=int, default=64, help="LoRA rank (the quickstart's: 16)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args()
    path = resolve_model(args.model)
    common = [
        f"learner.micro_batch_size={args.micro}",
        "model.dtype=float32",
        "model.lora.enabled=true",
        f"model.lora.rank={args.lora_rank}",
        "model.lora.alpha=32",
        "model.lora.target_modules=all-linear",
        "learner.optim.warmup_steps=0",
        "algo.kl_coef=0.0",
        f"learner.torch_threads={torch.get_num_threads()}",
    ]
    vocab = load_policy_model(path, "float32", load_config("jobs/configs/tiny.yaml", common).model.lora
                              ).config.vocab_size
    batch = make_batch(args.rows, args.seq, args.prompt, vocab)
    zero = int(round(args.zero * args.rows))
    batch = dataclasses.replace(batch, advantages=torch.cat([torch.zeros(zero), batch.advantages[zero:]]))
    keep = batch.advantages != 0
    sampled = "learner.diagnostics.sample_rows"
    steps = {
        "no pass": step_of(path, [*common, f"{sampled}=all"], batch, keep, False),
        "sampled (default)": step_of(path, common, batch, keep, True),
        "all rows": step_of(path, [*common, f"{sampled}=all"], batch, keep, True),
        "off": step_of(path, [*common, f"{sampled}=0"], batch, keep, True),
        "train all": step_of(path, [*common, "algo.skip_zero_advantage=false", f"{sampled}=all"], batch,
                             torch.ones(args.rows, dtype=torch.bool), False),
    }
    results = median_step_s(steps, args.warmup, args.steps)
    print(f"\n{args.model} (LoRA r{args.lora_rank}, fp32), {args.rows} rows x {args.seq} tokens "
          f"(loss on {args.seq - args.prompt}), "
          f"{zero} with advantage 0, micro-batch {args.micro}, {torch.get_num_threads()} threads; "
          f"median of {args.steps} steps after {args.warmup} warm-up")
    print(f"{'variant':<20}{'wall s':>8}{'vs no pass':>12}{'CPU s':>8}{'vs no pass':>12}")
    base_wall, base_cpu = results["no pass"]
    for name, (wall, cpu) in results.items():
        print(f"{name:<20}{wall:>8.2f}{wall / base_wall:>11.2f}x{cpu:>8.2f}{cpu / base_cpu:>11.2f}x")
    print(f"load average (1 min): {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
