"""How much of a LoRA update merged serving loses to the serving dtype: `sync/merge_rounding/<policy>` after
real optimizer steps, per model dtype and learning rate.

    .venv/bin/python -m benchmarks.merge_rounding [--model
    builtin:smollm2-135m-instruct] [--lrs 2e-5,2e-4,2e-3]
        [--dtypes bfloat16,float32] [--steps 3] [--rows 8] [--seq 128]

Workload: the project's torch Learner with LoRA r64/α32 on all linear layers (the paper's setting),
AdamW at a constant lr (no warmup), `rows` sequences of `seq` random tokens with advantages ±1, one
optimizer step per training step; after each step the weights a sync would ship are merged
(learners.state.weights.merge_for_serving) and the share of the LoRA update lost to rounding is printed
(learners.state.weights.update_lost: 1 = the engines serve the base model, 0 = the update arrives
whole). Adam's first step moves every entry of B by about lr whatever the gradient's scale, so random
data stands for real data here.
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.update import make_batch
from jobs.config import load_config
from jobs.models.resolve import resolve_model
from learners.learner import Learner
from learners.update.losses import local_normalizer
from learners.update.ppo_plan import UpdatePlan
from tests.builders import learner_spec


def lost_per_step(
    path: str, dtype: str, lr: float, steps: int, rows: int, seq: int, vocab: int
) -> list[float]:
    cfg = load_config(
        "jobs/configs/tiny.yaml",
        [
            f"model.dtype={dtype}",
            "model.lora.enabled=true",
            "model.lora.rank=64",
            "model.lora.alpha=32",
            "model.lora.target_modules=all-linear",
            f"learner.optim.lr={lr}",
            "learner.optim.warmup_steps=0",
            "learner.optim.schedule=constant",
            f"learner.micro_batch_size={rows}",
            "learner.role_grad_diagnostics=false",
            f"learner.torch_threads={torch.get_num_threads()}",
        ],
    )
    learner = Learner(learner_spec(cfg, path, total_steps=steps))
    lost = []
    for step in range(steps):
        batch = make_batch(rows, seq, seq // 4, vocab, seed=step)
        learner.update(batch, UpdatePlan.whole(len(batch), local_normalizer(batch.loss_mask[:, 1:],
                                                                                    cfg.algo.loss_agg)))
        learner.get_weights()
        lost.append(learner.sync_metrics()["sync/merge_rounding/p"])
    return lost


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:smollm2-135m-instruct")
    parser.add_argument("--lrs", default="2e-5,2e-4,2e-3")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    args = parser.parse_args()
    path = resolve_model(args.model)
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(path).vocab_size
    print(f"{args.model}, LoRA r64/α32 all-linear, AdamW constant lr, {args.rows} x {args.seq} random tokens")
    print(f"  {'dtype':<9} {'lr':>8}  update lost to rounding after step 1..{args.steps}")
    for dtype in args.dtypes.split(","):
        for lr in (float(x) for x in args.lrs.split(",")):
            lost = lost_per_step(path, dtype, lr, args.steps, args.rows, args.seq, vocab)
            print(f"  {dtype:<9} {lr:>8.0e}  " + "  ".join(f"{v:.4f}" for v in lost), flush=True)


if __name__ == "__main__":
    main()
