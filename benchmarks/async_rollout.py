"""One-step-off-policy rollout vs synchronous, same workload, in one run.

    .venv/bin/python -m benchmarks.async_rollout [--model
    builtin:smollm2-135m-instruct] [--steps 4] [--warmup 1]
        [--prompts 16] [--n 4] [--tokens 128] [--backend vllm] [--actors]

The workload and configuration of `benchmarks.vs_trl` (single_agent, GRPO, fp32, 2 threads per engine and per
learner), run twice, each in its own subprocess: synchronous (collect → update → sync) and with
`rollout.one_step_off_policy=true` (the next step's rollout runs while the learners update). Groups are
in-process by default (the engine in the driver, the learner on a thread of its own) or, with `--actors`, one
engine actor and one learner actor. Prints the median step wall time of each, their ratio, and where the time
of each goes; the off-policy run's step should approach max(rollout, update) + sync.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.vs_trl import breakdown, run_ours, workload_parser

MODES = {
    "synchronous": (),
    "one-step off-policy": ("rollout.one_step_off_policy=true", "algo.old_logprobs=rollout"),
}


def main() -> None:
    p = workload_parser(__doc__.splitlines()[0])
    p.add_argument("--actors", action="store_true", help="one engine actor and one learner actor")
    p.add_argument("--only", choices=list(MODES), help=argparse.SUPPRESS)
    p.add_argument("--json", help=argparse.SUPPRESS)
    a = p.parse_args()
    placement = ("rollout.engines_per_role=1", "learner.ranks=1") if a.actors else ()
    # Every row trains in both runs: the two see different samples, so skipping zero-advantage rows would make
    # their updates differ in size by chance.
    placement = (*placement, "algo.skip_zero_advantage=false")
    if a.only:
        Path(a.json).write_text(json.dumps(run_ours(a, (*placement, *MODES[a.only]))))
        return
    results = {}
    for mode in MODES:
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            subprocess.run([sys.executable, "-m", "benchmarks.async_rollout", *sys.argv[1:], "--only", mode,
                            "--json", f.name], check=True)
            results[mode] = json.loads(Path(f.name).read_text())
    report(a, results)


def report(a: argparse.Namespace, results: dict[str, dict]) -> None:
    print(
        f"\nworkload: {a.prompts} prompts x {a.n} samples x <= {a.tokens} tokens, {a.model}, rollout.backend="
        f"{a.backend}, {'actors' if a.actors else 'in-process groups'}; {a.steps} measured steps after "
        f"{a.warmup} warm-up"
    )
    med = {}
    for mode, r in results.items():
        walls, phases = r["step_s"][a.warmup:], r["phases"][a.warmup:]
        med[mode] = statistics.median(walls)
        parts = ", ".join(f"{k} {v:.1f}" for k, v in breakdown(walls, phases) if v >= 0.05)
        prefetch = statistics.median(p["time/prefetch_s"] for p in phases)
        print(f"  {mode:<22} median step {med[mode]:6.1f} s  ({' '.join(f'{w:.1f}' for w in r['step_s'])})")
        print(f"  {'':<22} parts (s): {parts}; of the update, next rollout {prefetch:.1f}")
    sync, off = med["synchronous"], med["one-step off-policy"]
    print(f"one-step off-policy / synchronous: {sync / off:.2f}x steps/s")


if __name__ == "__main__":
    main()
