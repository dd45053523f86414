"""One learner step at the paper's math shape, measured against the planner: a randomly initialised
Qwen3-shaped model built from its config (no download), Qwen3's vocabulary (151,936), LoRA r64/α32 on
all linear layers, bf16 DeepSpeed ZeRO-2, the LM head in chunks, one micro-batch of the paper's 40,960
tokens per GPU. Prints the peak GPU memory torch allocated next to the planner's estimate of the same
rank (learners/compute/memory.py, gpu coefficients) and the step's seconds. Run by
benchmarks/gpu_check.sh on a GPU machine.

`--cpu-smoke` runs the same path at a tiny shape on CPU (torch backend, fp32, peak RSS rise against the cpu
coefficients), so the script is exercised where no GPU is (tests/benchmarks/test_paper_step.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from jobs.models.shape import shape_of
from learners.compute.memory import GIB, LearnerSetup, learner_memory

GPU_MODEL = "builtin:qwen3-4b-shape?vocab=151936&max_positions=40960"
SMOKE_MODEL = (
    "builtin:qwen3-0.6b-shape?vocab=4096&layers=2&hidden=64&intermediate=128&heads=2&kv_heads=1&head_dim=32"
)


def overrides(model: str, tokens: int, rows: int, gpu: bool, checkpointing: bool) -> list[str]:
    """The learner's settings: the paper's on a GPU, the CPU stand-in's (torch backend, fp32) otherwise."""
    common = [f"model.path={model}", "model.lora.enabled=true", "model.lora.rank=64", "model.lora.alpha=32",
              f"learner.max_tokens_per_micro_batch={tokens}", f"algo.max_len={tokens // rows}",
              f"learner.gradient_checkpointing={checkpointing}", "learner.logits_chunk_tokens=1024",
              "learner.role_grad_diagnostics=false"]
    if gpu:
        return [
            *common,
            "model.dtype=bfloat16",
            "learner.backend=deepspeed",
            "learner.deepspeed.zero_stage=2",
        ]
    return [*common, "model.dtype=float32", "learner.backend=torch"]


def estimate(model: str, tokens: int, gpu: bool, checkpointing: bool) -> dict[str, float]:
    setup = LearnerSetup(
        tokens=tokens,
        lora_rank=64,
        zero_stage=2 if gpu else 0,
        ranks=1,
        checkpointing=checkpointing,
        logits_chunk=1024,
        role_rows=0,
        device="gpu" if gpu else "cpu",
    )
    m = learner_memory(shape_of(model), setup)
    return {"estimate_gib": m.allocated() / GIB, "estimate_rise_gib": (m.allocated() - m.weights) / GIB}


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field))


def make_learner(model: str, settings: list[str]):
    """A Learner of policy `p` on `model` with tiny.yaml's settings under `settings` (key=value overrides)."""
    from jobs.config import load_config
    from jobs.models.resolve import resolve_model
    from learners.learner import Learner
    from tests.builders import learner_spec

    cfg = load_config("jobs/configs/tiny.yaml", settings)
    return Learner(learner_spec(cfg, resolve_model(model)))


def random_batch(model: str, rows: int, width: int):
    """(TrainBatch, UpdatePlan) of `rows` random rows of `width` ids, every position attended, the loss on the
    last four fifths (a fifth prompt, the rest response: as the paper's math caps, 20,480 / 5,120)."""
    from learners.update.losses import local_normalizer
    from learners.update.ppo_plan import UpdatePlan
    from tests import builders

    batch = builders.random_batch(rows, width, width // 5, shape_of(model).vocab)
    return batch, UpdatePlan.whole(rows, local_normalizer(batch.loss_mask[:, 1:], "token_mean"))


def run(model: str, tokens: int, rows: int, gpu: bool, checkpointing: bool) -> dict[str, float]:
    """Build the learner, run one update on random ids; the measured peak and seconds."""
    import torch

    learner = make_learner(model, overrides(model, tokens, rows, gpu, checkpointing))
    batch, plan = random_batch(model, rows, tokens // rows)
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    else:
        with open("/proc/self/clear_refs", "w") as f:  # VmHWM back to the current RSS
            f.write("5")
    before, start = _rss_kib("VmRSS:"), time.perf_counter()
    metrics = learner.update(batch, plan)
    if gpu:
        torch.cuda.synchronize()
    out = {"step_s": time.perf_counter() - start, "loss": metrics.sums.loss, "tokens": float(tokens)}
    if gpu:
        out["measured_gib"] = torch.cuda.max_memory_allocated() / GIB
    else:
        out["measured_rise_gib"] = (_rss_kib("VmHWM:") - before) * 1024 / GIB
    return {**out, **estimate(model, tokens, gpu, checkpointing)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.paper_step", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--cpu-smoke", action="store_true", help="a tiny shape on CPU (no GPU needed)")
    parser.add_argument("--model", default=None, help=f"default {GPU_MODEL} (--cpu-smoke: {SMOKE_MODEL})")
    parser.add_argument(
        "--tokens", type=int, default=None, help="tokens of the micro-batch (default 40960; 512)"
    )
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--checkpointing", choices=("true", "false"), default="true")
    args = parser.parse_args(argv)
    gpu = not args.cpu_smoke
    model = args.model or (GPU_MODEL if gpu else SMOKE_MODEL)
    tokens = args.tokens or (40960 if gpu else 512)
    result = run(model, tokens, args.rows, gpu, args.checkpointing == "true")
    print("PAPER_STEP " + json.dumps({"model": model, "checkpointing": args.checkpointing, **result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
