"""Peak memory of R isolated LoRA policies: R separate learners (R copies of the base) against one colocated
learner group (`learner.lora_colocate`: one base, R adapters; learners/colocated_group.py), side by side.

Each layout and R runs in a fresh subprocess (`--one`), so one layout's allocations do not hide another's: it
builds the R policies' in-process learner groups, runs one update of each on the same small batch (so every
adapter has gradients and AdamW state), and reports the process's peak RSS (VmHWM) and its RSS after imports.
`python -m benchmarks.colocated_lora` prints the table; run it under the heavy lock (R=3 separate on
SmolLM2-135M in fp32 peaks near 3 GB). `--backend deepspeed`: every learner on DeepSpeed ZeRO-2 (colocated:
one engine per policy over the shared module), in-process on a one-rank gloo group.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

MODEL = "builtin:smollm2-135m-instruct"
ROLES = ("generator", "evaluator", "aggregator")
ROWS, WIDTH, PROMPT = 4, 128, 32  # the batch each policy updates on: rows x tokens, prompt tokens per row


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field))


BACKENDS = {"torch": [], "deepspeed": ["learner.backend=deepspeed", "learner.deepspeed.zero_stage=2"]}


def measure_one(policies: int, colocate: bool, dtype: str, backend: str = "torch") -> dict[str, float]:
    """In this process: R policies' learner groups in one layout, one update each; RSS in bytes."""
    import torch

    from jobs.config import load_config
    from jobs.models.resolve import resolve_model
    from learners.colocated_group import colocated_groups
    from learners.group import LearnerGroup
    from tests.builders import learner_spec, random_batch

    torch.set_num_threads(1)
    cfg = load_config(
        "jobs/configs/tiny.yaml",
        [
            f"model.path={MODEL}",
            f"model.dtype={dtype}",
            "model.lora.enabled=true",
            "model.lora.rank=64",
            "model.lora.alpha=32",
            "learner.ranks=0",
            "learner.torch_threads=1",
            f"learner.micro_batch_size={ROWS}",
            "learner.role_grad_diagnostics=false",
            "learner.policy_move=false",
            *BACKENDS[backend],
        ],
    )
    path = resolve_model(MODEL)
    imported = _rss_kib("VmRSS:")
    specs = [learner_spec(cfg, path, policy_id=pid, num_policies=policies, policy_index=i)
             for i, pid in enumerate(ROLES[:policies])]
    t0 = time.perf_counter()
    groups = (colocated_groups(specs, "bench", "bench:learner:colocated") if colocate
              else {s.policy_id: LearnerGroup(s, "bench") for s in specs})
    built_s = time.perf_counter() - t0
    batches = {pid: random_batch(ROWS, WIDTH, PROMPT, 49152, policy_id=pid, roles=(pid,)) for pid in groups}
    t0 = time.perf_counter()
    for pid, group in groups.items():
        group.update(batches[pid])
    update_s = time.perf_counter() - t0
    return {"peak": _rss_kib("VmHWM:") * 1024.0, "imported": imported * 1024.0, "build_s": built_s,
            "update_s": update_s}


def measure(policies: int, colocate: bool, dtype: str, backend: str = "torch") -> dict[str, float]:
    args = [sys.executable, "-m", "benchmarks.colocated_lora", "--one", str(policies), "--dtype", dtype,
            "--backend", backend]
    args += ["--colocate"] * colocate
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
    out = subprocess.run(args, capture_output=True, text=True, timeout=900, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.colocated_lora", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--one", type=int, help="R: measure one layout with R policies in this process, print JSON"
    )
    parser.add_argument("--colocate", action="store_true")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--max-policies", type=int, default=3)
    parser.add_argument("--backend", choices=list(BACKENDS), default="torch")
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(measure_one(args.one, args.colocate, args.dtype, args.backend)))
        return 0
    print(f"{MODEL} {args.dtype}, LoRA r64 all-linear, one update of {ROWS}x{WIDTH} per policy, in-process "
          f"{args.backend} learners")
    # Peak RSS in MB: the whole process, then above its RSS after imports. Separate learners as
    # Ray actors are R processes, each like R=1's: `R procs` is R x R=1's separate peak above
    # imports (arithmetic, not measured).
    print(f"{'R':>2} {'separate':>9} {'colocated':>10} {'ratio':>6} | above imports: {'separate':>9} "
          f"{'colocated':>10} {'ratio':>6} {'R procs':>8} | update s: {'separate':>9} {'colocated':>10}")
    one = 0.0
    for r in range(1, args.max_policies + 1):
        sep, col = measure(r, False, args.dtype, args.backend), measure(r, True, args.dtype, args.backend)
        above = [m["peak"] - m["imported"] for m in (sep, col)]
        one = one or above[0]
        print(
            f"{r:>2} {sep['peak'] / 1e6:9.0f} {col['peak'] / 1e6:10.0f} {col['peak'] / sep['peak']:6.2f} | "
            f"{'':15}{above[0] / 1e6:9.0f} {above[1] / 1e6:10.0f} {above[1] / above[0]:6.2f} "
            f"{r * one / 1e6:8.0f} | "
            f"{'':10}{sep['update_s']:9.2f} {col['update_s']:10.2f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
