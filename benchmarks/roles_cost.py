"""What roles cost: step time and peak memory for 1, 2 and 3 roles under shared, isolated and multi-LoRA policies.

    .venv/bin/python -m benchmarks.roles_cost [--model builtin:smollm2-135m-instruct] [--backend vllm]
        [--steps 3] [--prompts 4] [--n 2] [--tokens 32]

The built-in workflows have 1 (single_agent), 2 (eval_opt) and 3 (orch_workers) roles. Each cell is one
`jobs.train` run in its own subprocess with every group in-process (engines_per_role=0, ranks=0), so the
child's peak RSS is the whole system's memory; the step time is the median `time/step_s` after the first
step. Modes: shared (one full policy), isolated (a full model per role, one engine per role), isolated LoRA
(an adapter per role, one engine per role) and multi-LoRA (an adapter per role, ONE engine serving all
adapters). Prints a table and, per mode, how step time and memory grow from 1 to 3 roles (linear = 3.0x).
More roles also means more turns per episode (orch_workers makes 1 + up to 3 + 1 calls), so the step-time growth
is an upper bound on what the roles themselves cost; the memory growth is the roles' weights and engines.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

WORKFLOWS = {1: "single_agent", 2: "eval_opt", 3: "orch_workers"}
MODES = {
    "shared": ["marl.sharing=shared"],
    "isolated": ["marl.sharing=isolated"],
    "isolated LoRA": ["marl.sharing=isolated", "model.lora.enabled=true", "model.lora.rank=16"],
    "multi-LoRA": ["marl.sharing=isolated", "model.lora.enabled=true", "model.lora.rank=16",
                   "rollout.lora_serving=multi"],
}
CHILD = """
import resource, sys
from jobs.train import main
rc = main(sys.argv[1:])
print("PEAK_RSS_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
sys.exit(rc)
"""


def run_cell(a: argparse.Namespace, roles: int, mode: str, out: str) -> dict:
    name = f"r{roles}_{mode.replace(' ', '_').replace('-', '_')}"
    overrides = [
        f"model.path={a.model}", "data.task=math", "data.answer_fallback=last_number", "data.eval_size=0",
        "data.train=reasoning_gym:chain_sum?min_terms=2&max_terms=2&min_digits=1&max_digits=1",
        "data.train_size=64", f"marl.workflow={WORKFLOWS[roles]}", "marl.max_rounds=1",
        f"rollout.backend={a.backend}", "rollout.engines_per_role=0", f"rollout.prompts_per_step={a.prompts}",
        f"rollout.samples_per_prompt={a.n}", f"rollout.sampling.max_new_tokens={a.tokens}",
        "rollout.kv_cache_gb=0.5", "learner.ranks=0", "learner.micro_batch_size=8", f"steps={a.steps}",
        f"out_dir={out}", f"run_name={name}", *MODES[mode],
    ]
    proc = subprocess.run([sys.executable, "-c", CHILD, *overrides], capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
    peak_kb = int(next(x for x in proc.stdout.splitlines() if x.startswith("PEAK_RSS_KB")).split()[1])
    rows = [json.loads(x) for x in (Path(out) / name / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r["time/step_s"] for r in rows if "time/step_s" in r]
    return {"step_s": statistics.median(steps[1:] or steps), "peak_gb": peak_kb / 2**20}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="builtin:smollm2-135m-instruct")
    p.add_argument("--backend", default="vllm")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--n", type=int, default=2)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of: " + ", ".join(MODES))
    a = p.parse_args()
    modes = a.modes.split(",")
    results: dict[tuple[int, str], dict] = {}
    with tempfile.TemporaryDirectory() as out:
        for mode in modes:
            for roles in WORKFLOWS:
                results[roles, mode] = run_cell(a, roles, mode, out)
                print(f"  done: {roles} role(s), {mode}: {results[roles, mode]}", flush=True)
    print(f"\n{a.model}, backend {a.backend}, {a.prompts} prompts x {a.n} samples x <= {a.tokens} tokens")
    print(f"{'mode':<15}" + "".join(f"{f'{r} role(s) s / GB':>22}" for r in WORKFLOWS) + f"{'3 vs 1 roles':>22}")
    for mode in modes:
        cells = [results[r, mode] for r in WORKFLOWS]
        line = "".join(f"{c['step_s']:>14.1f} / {c['peak_gb']:5.2f}" if "error" not in c else f"{'failed':>22}"
                       for c in cells)
        one, three = cells[0], cells[-1]
        growth = (f"{three['step_s'] / one['step_s']:>9.2f}x / {three['peak_gb'] / one['peak_gb']:4.2f}x"
                  if "error" not in one and "error" not in three else "")
        print(f"{mode:<15}{line}{growth:>22}")
    for (r, mode), c in results.items():
        if "error" in c:
            print(f"{r} role(s), {mode}: {c['error']}")


if __name__ == "__main__":
    main()
