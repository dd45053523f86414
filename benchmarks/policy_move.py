"""Cost of `learner.policy_move` (update/policy_move: one extra no-grad forward over
the step's rows), side by side.

    .venv/bin/python -m benchmarks.policy_move [--rows 64] [--seq 96] [--prompt 64] [--micro 8] [--steps 3]

The quickstart's learner shape by default: SmolLM2-135M-Instruct with LoRA r16/α32, 8 prompts × 8 samples =
64 rows of ~64 prompt + 32 response tokens, micro-batches of 8, per-role gradient diagnostics on, one
optimizer step per training step, one in-process torch rank. The two variants (movement off / on) are
stepped in turn, round after round, so a change in the machine's load hits both alike; prints median wall
and CPU seconds per step and ratios.
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.update import learner_step, make_batch, median_step_s
from jobs.config import load_config
from jobs.models.resolve import resolve_model
from learners.state.weights import load_policy_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:smollm2-135m-instruct")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--seq", type=int, default=96)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--micro", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    path = resolve_model(args.model)
    common = [f"learner.micro_batch_size={args.micro}", "model.lora.enabled=true", "model.lora.rank=16",
              "model.lora.alpha=32", "learner.optim.warmup_steps=0", "algo.kl_coef=0.0",
              f"learner.torch_threads={torch.get_num_threads()}"]
    cfg = {
        on: load_config("jobs/configs/tiny.yaml", [*common, f"learner.policy_move={on}"])
        for on in (False, True)
    }
    vocab = load_policy_model(path, "float32", cfg[False].model.lora).config.vocab_size
    batch = make_batch(args.rows, args.seq, args.prompt, vocab)
    steps = {"policy_move off": learner_step(path, cfg[False], batch, True),
             "policy_move on": learner_step(path, cfg[True], batch, True)}
    results = median_step_s(steps, args.warmup, args.steps)
    (off_wall, off_cpu), (on_wall, on_cpu) = results["policy_move off"], results["policy_move on"]
    print(
        f"\n{args.model} LoRA r16, {args.rows} rows × {args.seq} tokens (loss on {args.seq - args.prompt}), "
        f"micro-batch {args.micro}, {torch.get_num_threads()} threads; median of {args.steps} steps"
    )
    print(f"{'variant':<20}{'wall s':>8}{'CPU s':>8}")
    for name, (wall, cpu) in results.items():
        print(f"{name:<20}{wall:>8.2f}{cpu:>8.2f}")
    print(f"on/off: wall {on_wall / off_wall:.2f}x, CPU {on_cpu / off_cpu:.2f}x")


if __name__ == "__main__":
    main()
