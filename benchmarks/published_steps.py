"""Learner steps at the published single-GPU baselines (jobs/plan/published.py: prime-rl's H100 trainer
benchmarks), measured with this project's learner: a random Qwen3-shaped model built from its config (no
download, Qwen3's vocabulary), bf16 DeepSpeed ZeRO-2, checkpointing on, the LM head in the paper cells'
chunks, two micro-batches of one sequence each per step (as the baselines), the loss on each sequence's
last four fifths, the engine's log-probs as old ones. Attention: the model's sdpa with its math backend
excluded (torch's flash or memory-efficient kernels, causal without an [N, N] mask: one sequence per
micro-batch needs none), so no path the planner does not model can run silently. Prints one
`PUBLISHED_STEP {json}` line per configuration: the measured step seconds (median after warm-up), tok/s,
MFU (the baselines' FLOP count, against the dense bf16 peak), torch's peak allocated and reserved GiB,
beside the published figures and the planner's estimate.
Run by benchmarks/gpu_check.sh, one configuration per process. The 8-GPU baselines need 8 GPUs: not run here.

`--cpu-tiny` runs the same path on CPU at a tiny shape (torch backend, fp32), so
it is exercised where no GPU is.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

from benchmarks.paper_step import make_learner, random_batch
from jobs.plan.published import LOGITS_CHUNK, MICRO_BATCHES, PUBLISHED, Published, estimate, mfu
from learners.compute.memory import GIB

TINY_MODEL = (
    "builtin:qwen3-0.6b-shape?vocab=4096&layers=2&hidden=64&intermediate=128&heads=2&kv_heads=1&head_dim=32"
)
SINGLE_GPU = [i for i, p in enumerate(PUBLISHED) if p.gpus == 1]


def settings(model: str, p: Published, tokens: int, gpu: bool) -> list[str]:
    """The learner's overrides of jobs/configs/tiny.yaml for a baseline (a tiny CPU stand-in: torch, fp32)."""
    lora = [f"model.lora.enabled={p.lora_rank > 0}"] + (
        [f"model.lora.rank={p.lora_rank}", f"model.lora.alpha={2 * p.lora_rank}"] if p.lora_rank else [])
    common = [
        f"model.path={model}",
        *lora,
        f"learner.max_tokens_per_micro_batch={tokens}",
        f"algo.max_len={tokens}",
        "learner.gradient_checkpointing=true",
        f"learner.logits_chunk_tokens={min(LOGITS_CHUNK, tokens // 2)}",
        "learner.role_grad_diagnostics=false",
        "algo.old_logprobs=rollout",
        "algo.kl_coef=0.0",
    ]
    if gpu:
        return [
            *common,
            "model.dtype=bfloat16",
            "learner.backend=deepspeed",
            "learner.deepspeed.zero_stage=2",
        ]
    return [*common, "model.dtype=float32", "learner.backend=torch"]


def attention_context(gpu: bool) -> Any:
    """sdpa without its math backend on a GPU (an [N, N] score matrix at 65,536
    tokens would not fit anyway)."""
    import contextlib

    if not gpu:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(
        [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]
    )


def measure(p: Published, model: str, tokens: int, gpu: bool, steps: int) -> dict[str, Any]:
    """Build the learner, one warm-up step, then `steps` steps; seconds per step and peak memory over all."""
    import torch

    learner = make_learner(model, settings(model, p, tokens, gpu))
    batch, plan = random_batch(model, MICRO_BATCHES, tokens)
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    times = []
    with attention_context(gpu):
        for _ in range(steps + 1):
            start = time.perf_counter()
            metrics = learner.update(batch, plan)
            if gpu:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    step = statistics.median(times[1:])
    out: dict[str, Any] = {"step_s": step, "warmup_s": times[0], "steps": steps, "loss": metrics.sums.loss,
                           "tok_s": MICRO_BATCHES * tokens / step, "attention": attention_name(learner, gpu)}
    if gpu:
        out |= {"peak_allocated_gib": torch.cuda.max_memory_allocated() / GIB,
                "peak_reserved_gib": torch.cuda.max_memory_reserved() / GIB, "mfu": mfu(p, out["tok_s"])}
    return out


def attention_name(learner: Any, gpu: bool) -> str:
    config = getattr(learner.model, "config", None)
    impl = getattr(config, "_attn_implementation", None) or "unknown"
    return f"{impl} (math backend excluded)" if gpu else impl


def row(index: int, gpu: bool, steps: int) -> dict[str, Any]:
    """One configuration's record: measured, published, planned, and their ratios."""
    p = PUBLISHED[index]
    model, tokens = (p.model(), p.tokens) if gpu else (TINY_MODEL, 256)
    planned = estimate(p)
    out: dict[str, Any] = {
        "config": f"{p.name} {p.tokens} tokens, {p.gpus} GPU",
        "model": model,
        "tokens": tokens,
        "published": {"step_s": p.step_s, "tok_s": p.tok_s, "mfu": p.mfu, "peak_gib": p.peak_gib},
        "planned": planned,
    }
    try:
        measured = measure(p, model, tokens, gpu, steps)
    except Exception as e:  # noqa: BLE001 - an out-of-memory or kernel error is a result here
        return out | {"error": f"{type(e).__name__}: {str(e)[:400]}"}
    out["measured"] = measured
    if gpu:
        out["ratios"] = {
            "planned/measured allocated": planned["allocated_gib"] / measured["peak_allocated_gib"],
            "measured reserved/published": measured["peak_reserved_gib"] / p.peak_gib,
            "planned/published memory": planned["peak_gib"] / p.peak_gib,
            "planned/measured step": planned["step_s"] / measured["step_s"],
            "measured/published step": measured["step_s"] / p.step_s,
        }
    return out


def build(indices: list[int], gpu: bool) -> int:
    """Build (or find in the cache) each configuration's random model, saying how long each took."""
    from jobs.models.resolve import resolve_model

    for model in dict.fromkeys(PUBLISHED[i].model() if gpu else TINY_MODEL for i in indices):
        start = time.perf_counter()
        print(f"BUILT {model} -> {resolve_model(model)} in {time.perf_counter() - start:.1f} s", flush=True)
    return 0


def summary(r: dict[str, Any]) -> str:
    """One line of a record for the GPU check's summary."""
    if "error" in r:
        return f"{r['config']}: {r['error']}"
    m, p, e = r["measured"], r["published"], r["planned"]
    peaks = (f"{m['peak_allocated_gib']:.1f} GiB allocated / {m['peak_reserved_gib']:.1f} reserved, "
             if "peak_allocated_gib" in m else "")
    return (
        f"{r['config']}: measured {peaks}{m['step_s']:.2f} s/step, {m['tok_s']:.0f} tok/s, MFU "
        f"{m.get('mfu', float('nan')):.3f} ({m['attention']}); published {p['peak_gib']} GiB, {p['step_s']} "
        "s, "
        f"MFU {p['mfu']}; planned {e['allocated_gib']:.1f} GiB allocated ({e['peak_gib']:.1f} with the "
        f"runtime term), {e['step_s']:.2f} s"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.published_steps", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--config",
        type=int,
        choices=SINGLE_GPU,
        action="append",
        help="index into jobs/plan/published.py PUBLISHED (repeatable; default every 1-GPU one)",
    )
    parser.add_argument("--steps", type=int, default=2, help="measured steps after the warm-up")
    parser.add_argument("--cpu-tiny", action="store_true", help="a tiny shape on CPU (no GPU needed)")
    parser.add_argument("--build", action="store_true", help="only build the configurations' random models")
    args = parser.parse_args(argv)
    if args.build:
        return build(args.config or SINGLE_GPU, not args.cpu_tiny)
    for index in args.config or SINGLE_GPU:
        record = row(index, not args.cpu_tiny, args.steps)
        print("PUBLISHED_STEP " + json.dumps(record), flush=True)
        print("SUMMARY " + summary(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
