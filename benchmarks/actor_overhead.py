"""The layout users run against the in-process one: the vs_trl workload with engines and learners in the
driver's process, then as Ray actors (one engine actor, one learner actor), then with a LoRA r16 policy (the
quickstart's layout), then voting with isolated LoRA policies (actors), then bf16 where the CPU has it. One
invocation, each mode in its own subprocess; medians after warm-up, ratios side by side.

    .venv/bin/python -m benchmarks.actor_overhead [--steps 4] [--warmup 1]
    [--prompts 16] [--n 4] [--tokens 128]

Actors get 2 CPUs each on an embedded cluster of 2 x the cores (engines and learners take turns: an engine
waits passively while its learner updates), so each has as many threads as the in-process run.
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

ACTORS = (
    "rollout.engines_per_role=1",
    "learner.ranks=1",
    "rollout.engine_num_cpus=2",
    "learner.rank_num_cpus=2",
    "ray.num_cpus=8",
)
LORA = ("model.lora.enabled=true", "model.lora.rank=16", "model.lora.alpha=32", "learner.optim.lr=1e-3")
MODES = {
    "in-process": (),
    "actors": ACTORS,
    "actors+LoRA": (*ACTORS, *LORA),  # the quickstart's layout
    "voting isolated LoRA": (*ACTORS, "marl.workflow=voting", "marl.sharing=isolated", *LORA),
    "actors+bf16": (*ACTORS, "model.dtype=bfloat16"),
}


def _child(mode: str, argv: list[str]) -> dict | None:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        done = subprocess.run([sys.executable, "-m", "benchmarks.actor_overhead", *argv, "--only", mode,
                               "--json", f.name], check=False)
        text = Path(f.name).read_text()
        return json.loads(text) if done.returncode == 0 and text else None


def _sync_figures(phases: list[dict]) -> tuple[float, float]:
    return (statistics.median(p.get("time/sync_s", 0.0) for p in phases),
            statistics.median(p.get("sync/bytes", 0.0) for p in phases))


def main() -> None:
    p = workload_parser(__doc__.splitlines()[0])
    p.add_argument("--only", choices=list(MODES), help=argparse.SUPPRESS)
    p.add_argument("--json", help=argparse.SUPPRESS)
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of: " + ", ".join(MODES))
    a, argv = p.parse_args(), [x for x in sys.argv[1:]]
    if a.only:
        Path(a.json).write_text(json.dumps(run_ours(a, MODES[a.only], keep=("sync/bytes",))))
        return
    results = {m: _child(m, argv) for m in a.modes.split(",")}
    base = results.get("in-process")
    base_s = statistics.median(base["step_s"][a.warmup:]) if base else float("nan")
    print(f"\nworkload: {a.prompts} prompts x {a.n} samples x <= {a.tokens} tokens, {a.model}, {a.backend}, "
          f"{a.steps} measured steps after {a.warmup} warm-up")
    print(f"{'mode':<20}{'step s':>8}{'vs in-process':>15}{'sync s':>9}{'sync MB':>10}   parts (median s)")
    for mode, r in results.items():
        if r is None:
            print(f"{mode:<20}{'failed or not supported here (see its output above)':>40}")
            continue
        step = statistics.median(r["step_s"][a.warmup:])
        sync_s, sync_b = _sync_figures(r["phases"][a.warmup:])
        parts = " ".join(f"{k}={v:.1f}" for k, v in breakdown(r["step_s"][a.warmup:], r["phases"][a.warmup:]))
        print(f"{mode:<20}{step:>8.1f}{step / base_s:>14.2f}x{sync_s:>9.2f}{sync_b / 1e6:>10.1f}   {parts}")
    print("targets: actors <= 1.15x in-process; sync <= 2% of the step with LoRA")


if __name__ == "__main__":
    main()
