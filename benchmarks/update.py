"""Learner update time, side by side: the DeepSpeed backend vs the torch backend vs a plain loop.

    .venv/bin/python -m benchmarks.update [--model builtin:smollm2-135m-instruct] [--rows 64] [--seq 128]
        [--prompt 32] [--micro 16] [--full] [--warmup 1] [--steps 3] [--stages 2[,3]] [--dtype float32]

Workload, identical for every variant: `rows` sequences of `seq` random tokens (prompt `prompt` tokens, loss
on the rest), two roles (generator / evaluator, alternating rows), advantages ±1, fp32, micro-batches of
`micro` rows, LoRA r64/α32 on all linear layers (the paper's setting; `--full` for full fine-tuning), one
optimizer step per training step, one in-process rank (learner.ranks=0). On a machine with CUDA everything
runs on the GPU (`--dtype bfloat16` there) and the torch backend, which is CPU-only, is left out. Variants:
- plain: model(...) → masked token-mean policy-gradient loss → backward per micro-batch → one AdamW step
  (the floor: no metrics, no normaliser plumbing, no reference, no engine);
- torch / deepspeed (ZeRO-`stage` for each of `--stages`): the project's Learner.update, with per-role
  gradient diagnostics off and on (ZeRO-2; ZeRO-3 without them).
All variants are built first and then stepped in turn, round after round, so a change in the machine's load
during the run hits every variant alike. Prints the median seconds per training step after `warmup` rounds,
and ratios.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from benchmarks.flop_rate import forward_flops, gemm_peak, step_flops, step_shapes, top_ops
from jobs.config import load_config
from jobs.models.resolve import resolve_model
from learners.batch import TrainBatch
from learners.diagnostic_sample import sample_diagnostics, sample_size
from learners.learner import Learner
from learners.state.weights import load_policy_model
from learners.update.losses import local_normalizer, token_logprobs
from learners.update.ppo_plan import UpdatePlan
from tests.builders import learner_spec, random_batch

ROLES = ("generator", "evaluator")


def make_batch(rows: int, seq: int, prompt: int, vocab: int, seed: int = 0) -> TrainBatch:
    """Random rows of the two roles in turn, advantages ±1 drawn from the ids' generator."""
    return random_batch(rows, seq, prompt, vocab, seed=seed, roles=ROLES,
                        advantages=lambda g: torch.randint(0, 2, (rows,), generator=g).float() * 2 - 1)


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def synchronized(step: Callable[[], object]) -> Callable[[], object]:
    """The step, waiting for the device's queued kernels so that the timer sees the whole step."""
    if device().type != "cuda":
        return step

    def run() -> None:
        step()
        torch.cuda.synchronize()

    return run


def plain_step(model_path: str, cfg, batch: TrainBatch) -> Callable[[], None]:
    model = load_policy_model(model_path, cfg.model.dtype, cfg.model.lora).to(device())
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.learner.optim.lr)
    micro = [mb.to(device()) for mb in batch.micro_batches(cfg.learner.micro_batch_size)]
    norm = float(batch.loss_mask[:, 1:].sum())

    def step() -> None:
        opt.zero_grad()
        for mb in micro:
            logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits[:, :-1]
            lp = token_logprobs(logits.float(), mb.input_ids[:, 1:])
            (-(lp * mb.advantages.unsqueeze(-1) * mb.loss_mask[:, 1:]).sum() / norm).backward()
        opt.step()

    return step


def learner_step(model_path: str, cfg, batch: TrainBatch, role_grads: bool) -> Callable[[], object]:
    """One training step of the project's Learner over `batch` (one optimizer step over every row), its
    diagnostics' sample drawn as LearnerGroup draws it (`learner.diagnostics.sample_rows`)."""
    learner = Learner(learner_spec(cfg, model_path, total_steps=1000))
    payload, norm = batch, local_normalizer(batch.loss_mask[:, 1:], cfg.algo.loss_agg)
    roles = sorted(set(batch.roles)) if role_grads else None
    plan = UpdatePlan.whole(len(batch), norm, roles)
    size = sample_size(cfg.learner.diagnostics.sample_rows)
    (plan,) = sample_diagnostics(batch.roles, batch.loss_mask[:, 1:].sum(-1), [list(range(len(batch)))],
                                 [plan], size, (1, 2), recompute=cfg.algo.old_logprobs == "recompute").plans
    return lambda: learner.update(payload, plan)


def median_step_s(
    steps: dict[str, Callable[[], object]], warmup: int, rounds: int
) -> dict[str, tuple[float, float]]:
    """name → (median wall s, median CPU s of this process) per step. On a shared machine the CPU time is the
    steadier measure of the work done; the wall time is what a run on that machine sees."""
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in steps}
    for r in range(warmup + rounds):
        for name, step in steps.items():
            wall, cpu = time.perf_counter(), time.process_time()
            step()
            if r >= warmup:
                times[name].append((time.perf_counter() - wall, time.process_time() - cpu))
        done = ", ".join(f"{n} {t[-1][0]:.1f}s" for n, t in times.items() if t)
        print(f"  round {r + 1}/{warmup + rounds}: {done}", flush=True)
    return {
        n: (statistics.median(w for w, _ in t), statistics.median(c for _, c in t)) for n, t in times.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:smollm2-135m-instruct")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--micro", type=int, default=16)
    parser.add_argument("--full", action="store_true", help="full fine-tuning instead of LoRA r64/α32")
    parser.add_argument("--stages", default="2", help="ZeRO stages to run, comma-separated (2, 3)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    path = resolve_model(args.model)
    common = [f"learner.micro_batch_size={args.micro}", f"model.dtype={args.dtype}",
              f"model.lora.enabled={not args.full}", "model.lora.rank=64", "model.lora.alpha=32",
              "model.lora.target_modules=all-linear", "learner.optim.warmup_steps=0", "algo.kl_coef=0.0",
              f"learner.torch_threads={torch.get_num_threads()}"]
    stages = [int(s) for s in args.stages.split(",")]
    cfg = {(b, s): load_config("jobs/configs/tiny.yaml",
                               [*common, f"learner.backend={b}", f"learner.deepspeed.zero_stage={s}"])
           for b in ("torch", "deepspeed") for s in stages}
    base = cfg["torch", stages[0]]
    vocab = load_policy_model(path, "float32", base.model.lora).config.vocab_size
    batch = make_batch(args.rows, args.seq, args.prompt, vocab)
    variants: dict[str, Callable[..., Callable[[], object]]] = {
        "plain fwd+bwd+AdamW": lambda: plain_step(path, base, batch)}
    if device().type == "cpu":  # the torch backend is the CPU learner
        variants["torch backend"] = lambda: learner_step(path, base, batch, False)
        variants["torch backend + role grads"] = lambda: learner_step(path, base, batch, True)
    for s in stages:
        variants[f"deepspeed ZeRO-{s}"] = lambda s=s: learner_step(path, cfg["deepspeed", s], batch, False)
        if s == 2:  # per-role gradients under ZeRO-3 gather every shard per role: not a configuration to time
            variants["deepspeed ZeRO-2 + role grads"] = lambda: learner_step(
                path, cfg["deepspeed", 2], batch, True
            )
    # The matmul rate is probed before and after the rounds and the faster probe kept: the machine's
    # capability, not whatever load happened to coincide with one probe.
    rate = matmul_flops_per_s(args.dtype)
    steps = {name: synchronized(build()) for name, build in variants.items()}
    results = median_step_s(steps, args.warmup, args.steps)
    report(results, args, vocab, flop_bound_s(path, args, max(rate, matmul_flops_per_s(args.dtype))))
    if "torch backend + role grads" in steps:  # the project's default CPU learner
        name = "torch backend + role grads"
        flop_report(path, args, base, results[name][0], steps[name])


def matmul_flops_per_s(dtype: str = "float32", reps: int = 20) -> float:
    """The machine's measured matmul rate in `dtype` (median of `reps` n×n
    products), the roof for the bound."""
    dev = device()
    n = 8192 if dev.type == "cuda" else 1024
    a, b = (torch.randn(n, n, device=dev, dtype=getattr(torch, dtype)) for _ in range(2))
    times = []
    for _ in range(reps + 1):  # the first is a warm-up
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        a @ b
        if dev.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times[1:])


def flop_bound_s(path: str, args, flops_per_s: float) -> tuple[float, float]:
    """(FLOPs, seconds at the measured matmul rate) of one step: 2·N per token forward, plus
    2·N backward to the activations and, for full fine-tuning, 2·N more for the weight
    gradients (N = non-embedding parameters;
    LoRA's own parameters are negligible next to N). Attention's sequence-squared
    term is left out (short seqs)."""
    model = load_policy_model(path, "float32", load_config("jobs/configs/tiny.yaml").model.lora)
    embed = model.get_input_embeddings().weight.numel()
    n = sum(p.numel() for p in model.parameters()) - embed
    flops = (6 if args.full else 4) * n * args.rows * args.seq
    return flops, flops / flops_per_s


def report(results: dict[str, tuple[float, float]], args, vocab: int, bound: tuple[float, float]) -> None:
    names = list(results)
    print(
        f"\n{args.model} ({'full fine-tuning' if args.full else 'LoRA r64'}, {args.dtype} on {device()}), "
        f"{args.rows} rows × {args.seq} tokens (loss on {args.seq - args.prompt}), micro-batch {args.micro}, "
        f"vocab {vocab}, {torch.get_num_threads()} threads; median of {args.steps} steps after {args.warmup} "
        "warm-up"
    )
    print(f"FLOP bound: {bound[0] / 1e12:.2f} TFLOP per step at the measured matmul rate "
          f"({bound[0] / bound[1] / 1e12:.2f} TFLOP/s) = {bound[1]:.3f} s")
    print(f"{'variant':<34}{'wall s':>8}{'vs plain':>10}{'CPU s':>8}{'vs plain':>10}{'vs bound':>10}")
    plain_wall, plain_cpu = results[names[0]]
    for name in names:
        wall, cpu = results[name]
        print(f"{name:<34}{wall:>8.3f}{wall / plain_wall:>9.2f}x{cpu:>8.2f}{cpu / plain_cpu:>9.2f}x"
              f"{wall / bound[1]:>9.2f}x")
    kind = "CPU" if device().type == "cpu" else "wall"  # a GPU step's CPU time is the launch overhead only
    i = 1 if kind == "CPU" else 0
    vs_plain = ", ".join(f"{n}/plain {results[n][i] / results[names[0]][i]:.2f}x" for n in names[1:]
                         if "role grads" not in n)
    pairs = [(n.removesuffix(" + role grads"), n) for n in names if n.endswith(" + role grads")]
    on_off = ", ".join(f"{off} {results[on][i] / results[off][i]:.2f}x" for off, on in pairs)
    print(f"summary ({kind}): {vs_plain}; role grads on/off: {on_off}")


def flop_report(path: str, args, cfg, wall: float, step: Callable[[], object]) -> None:
    """The step's achieved FLOP rate against fp32 torch.mm on the step's own GEMMs, and the largest gap."""
    shapes = step_shapes(load_policy_model(path, "float32", cfg.model.lora))
    tokens, loss_tokens = args.rows * args.seq, args.rows * (args.seq - args.prompt)
    train = step_flops(shapes, tokens, loss_tokens, args.seq, args.full)
    size = sample_size(cfg.learner.diagnostics.sample_rows)
    moved = args.rows if size is None else min(args.rows, size)  # the movement's sampled rows
    extra = forward_flops(shapes, moved * args.seq, moved * (args.seq - args.prompt), args.seq)
    peak = gemm_peak(shapes, args.micro * args.seq, cfg.learner.logits_chunk_tokens)
    achieved = (train + extra) / wall
    print(f"\nFLOPs of the torch backend + role grads step: {train / 1e12:.3f} T fwd+bwd "
          f"({'6' if args.full else '4'}·N·tokens, N = {shapes.params / 1e6:.1f} M linear weights "
          f"with the head; "
          f"head on loss tokens, recomputed in backward; attention) + {extra / 1e12:.3f} T extra "
          f"(the policy movement's forward over {moved} sampled rows)")
    print(f"achieved {achieved / 1e9:.1f} GFLOP/s in {wall:.2f} s; fp32 torch.mm on the step's GEMMs "
          f"({args.micro * args.seq} rows) {peak / 1e9:.1f} GFLOP/s; ratio {achieved / peak:.2f}")
    shares = top_ops(step)
    print("largest self-CPU shares of one profiled step: " + ", ".join(f"{k} {s:.0%}" for k, s in shares))


if __name__ == "__main__":
    main()
