"""Learner memory and speed at long rows, side by side: the unchunked path (the model's full [B, T, V] logits,
the whole batch as row-count micro-batches) against the chunked head with token-budget micro-batches.

    flock /tmp/marl-heavy.lock .venv/bin/python -m benchmarks.long_context [--chunks 512,1024] [--budget 8192]
        [--repeats 5] [--only NAME,...]

Each configuration runs one in-process Learner.update (torch backend, fp32, temperature 1) in a fresh
subprocess, which reports its peak RSS (VmHWM), so one configuration cannot pollute another and an
out-of-memory kill ends only that one. Workload: `rows` rows of `tokens` random ids in [0, vocab), the first
64 (or `prompt`) of them prompt, advantages ±1, old log-probs recomputed (one no-grad pass when there are two
mini-batches: not here, one optimizer step). Cases:
- qwen3 body at vocabulary 151,936 (builtin:qwen3-0.6b-shape with 2 layers, hidden 64), full fine-tuning, at
  4 × 1,024, 8 × 2,048 and 8 × 5,120 tokens. The unchunked path is run where it fits this shared 24 GiB box;
  elsewhere its peak is predicted from the 4 × 1,024 one (it grows with rows × tokens) and it is not started.
- SmolLM2-135M at 8 × 1,024 (LoRA r16 as the quickstart; the unchunked path in micro-batches of 2 rows, the
  chunked one within the token budget).
- the quickstart's shape (jobs/configs/quickstart.yaml: SmolLM2 LoRA r16, 64 rows of ~96 tokens, micro-batches
  of 8 rows, budget off): the default chunked head against the unchunked one, median of `repeats` updates.
Prints per case and path: peak RSS, seconds per 1,000 trained tokens (the median update), loss and grad norm,
then the new/old ratios and the loss and grad-norm differences.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

QWEN_BODY = ("builtin:qwen3-0.6b-shape?vocab=151936&layers=2&hidden=64&intermediate=128&heads=2&kv_heads=1"
             "&head_dim=32&max_positions=8192")
SMOLLM2 = "builtin:smollm2-135m-instruct"
LORA = ["model.lora.enabled=true", "model.lora.rank=16", "model.lora.alpha=32", "model.lora.dropout=0.0"]
BOX_GB = 24.0


@dataclass(frozen=True)
class Run:
    """One subprocess: a model, a workload and the learner keys of one path."""

    model: str
    rows: int
    tokens: int
    prompt: int
    overrides: list[str]
    repeats: int = 1


@dataclass(frozen=True)
class Case:
    name: str
    model: str
    rows: int
    tokens: int
    prompt: int = 64
    extra: tuple[str, ...] = ()
    old_micro: int = 0  # rows per unchunked micro-batch; 0 = the whole batch
    new_budget: bool = True  # the chunked path packs by token budget
    repeats: int = 1


def cases(repeats: int) -> list[Case]:
    return [
        Case("qwen3-body 4x1024", QWEN_BODY, 4, 1024),
        Case("qwen3-body 8x2048", QWEN_BODY, 8, 2048),
        Case("qwen3-body 8x5120", QWEN_BODY, 8, 5120),
        Case("smollm2 8x1024 lora", SMOLLM2, 8, 1024, extra=tuple(LORA), old_micro=2),
        Case("quickstart 64x96", SMOLLM2, 64, 96, extra=tuple(LORA), old_micro=8, new_budget=False,
             repeats=repeats),
    ]


def paths(case: Case, chunks: list[int], budget: int) -> dict[str, list[str]]:
    """"old" and, per chunk size, "new@<chunk>": the learner keys of each path."""
    micro = case.old_micro or case.rows
    out = {"old": [*case.extra, "learner.logits_chunk_tokens=0", f"learner.micro_batch_size={micro}"]}
    for chunk in chunks:
        new = [*case.extra, f"learner.logits_chunk_tokens={chunk}", f"learner.micro_batch_size={micro}"]
        if case.new_budget:
            new.append(f"learner.max_tokens_per_micro_batch={max(budget, case.tokens)}")
        out[f"new@{chunk}"] = new
    return out


def child(run: Run) -> dict[str, object]:
    """In the subprocess: build the learner, run `repeats` updates, report
    times, loss, grad norm, peak RSS."""
    from benchmarks.update import make_batch
    from jobs.config import load_config
    from jobs.models.resolve import resolve_model
    from learners.learner import Learner
    from learners.update.losses import local_normalizer
    from learners.update.ppo_plan import UpdatePlan
    from tests.builders import learner_spec

    path = resolve_model(run.model)
    cfg = load_config("jobs/configs/tiny.yaml", [f"algo.max_len={run.tokens}", "learner.ranks=0",
                                                 "model.dtype=float32", *run.overrides])
    learner = Learner(learner_spec(cfg, path))
    vocab = learner.model.get_output_embeddings().weight.shape[0]
    batch = make_batch(run.rows, run.tokens, run.prompt, vocab)
    plan = UpdatePlan.whole(len(batch), local_normalizer(batch.loss_mask[:, 1:], "token_mean"))
    seconds, first = [], None
    for _ in range(run.repeats):
        start = time.perf_counter()
        metrics = learner.update(batch, plan)
        seconds.append(time.perf_counter() - start)
        first = first or metrics
    assert first is not None
    return {"peak_gb": _peak_gb(), "s": seconds, "loss": first.sums.loss, "grad_norm": first.step.grad_norm}


def _peak_gb() -> float:
    with open("/proc/self/status") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    return kb / 2**20


def spawn(run: Run, timeout_s: float) -> dict[str, object] | str:
    """The child's report, or why there is none (killed: out of memory, most likely)."""
    cmd = [sys.executable, "-m", "benchmarks.long_context", "--child", json.dumps(asdict(run))]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout_s:.0f} s"
    if done.returncode != 0:
        return (
            f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ''}"
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


def row(name: str, path: str, r: dict[str, object] | str, tokens: int) -> str:
    if isinstance(r, str):
        return f"{name:22s} {path:9s} {r}"
    s = statistics.median(r["s"])  # type: ignore[arg-type]
    return (f"{name:22s} {path:9s} peak {r['peak_gb']:6.2f} GB   {1000 * s / tokens:8.3f} s/1k tokens   "
            f"loss {r['loss']:+.6f}   grad norm {r['grad_norm']:.6f}")


def compare(path: str, old: dict[str, object] | str, new: dict[str, object] | str) -> str:
    if isinstance(old, str) or isinstance(new, str):
        return ""
    time_ratio = statistics.median(new["s"]) / statistics.median(old["s"])  # type: ignore[arg-type]
    keys = ("peak_gb", "loss", "grad_norm")
    peak, loss, norm = (float(new[k]) for k in keys)  # type: ignore[arg-type]
    old_peak, old_loss, old_norm = (float(old[k]) for k in keys)  # type: ignore[arg-type]
    return (
        f"{'':22s} {path}/old: peak {peak / old_peak:.3f}x  time {time_ratio:.3f}x  "
        f"|Δloss| {abs(loss - old_loss):.2e}  |Δgrad norm|/norm {abs(norm - old_norm) / old_norm:.2e}"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child")
    ap.add_argument("--chunks", default="512", help="comma-separated chunk sizes of the new path")
    ap.add_argument("--budget", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--only", default="")
    ap.add_argument("--timeout-s", type=float, default=900.0)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(Run(**json.loads(args.child)))))
        return
    base_old_gb, base_tokens = None, 0
    for case in cases(args.repeats):
        if args.only and not any(o in case.name for o in args.only.split(",")):
            continue
        tokens = case.rows * case.tokens
        results: dict[str, dict[str, object] | str] = {}
        for path, overrides in paths(case, [int(c) for c in args.chunks.split(",")], args.budget).items():
            predicted = base_old_gb * tokens / base_tokens if base_old_gb and path == "old" else 0.0
            if case.model == QWEN_BODY and predicted > BOX_GB / 2:
                results[path] = (
                    f"not run: predicted peak ≈ {predicted:.0f} GB (4x1024's, scaled by tokens), "
                    f"on a shared {BOX_GB:.0f} GB box"
                )
            else:
                results[path] = spawn(
                    Run(case.model, case.rows, case.tokens, case.prompt, overrides, case.repeats),
                    args.timeout_s,
                )
            print(row(case.name, path, results[path], tokens), flush=True)
        if case.model == QWEN_BODY and base_old_gb is None and not isinstance(results["old"], str):
            base_old_gb, base_tokens = float(results["old"]["peak_gb"]), tokens  # type: ignore[arg-type]
        for path in results:
            if path != "old" and compare(path, results["old"], results[path]):
                print(compare(path, results["old"], results[path]), flush=True)


if __name__ == "__main__":
    main()
