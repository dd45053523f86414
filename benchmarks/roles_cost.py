"""What roles cost: step time and peak memory for 1, 2 and 4 roles under shared,
isolated and multi-LoRA policies.

    .venv/bin/python -m benchmarks.roles_cost [--model builtin:smollm2-135m-instruct] [--backend vllm]
        [--steps 3] [--prompts 4] [--n 2] [--tokens 32] [--roles 1,2,4] [--turns 4] [--modes ...]
        [--cell-timeout 1800] [--min-free-gb 0.75]

So that only the number of roles changes, every cell runs the same benchmark workflow, `relay`: `turns`
sequential turns per episode (the first solves, each next one checks and rewrites the previous solution), turn
t spoken by role t mod R. With R = 1, 2 or 4 roles the episode has the same turns, prompts and length limits;
what changes is how many policies, engines and weight syncs serve them. The workflow is registered in the
benchmark's child processes only; the package does not ship it.

Each cell is one `jobs.train` run in its own subprocess with every group in-process (engines_per_role=0,
ranks=0), so the child's peak RSS is the whole system's memory; the step time is the median `time/step_s`
after the first step. Modes: shared (one full policy, an engine per role), shared 1-engine (one engine
serving every role: rollout.engine_scope=policy), isolated (a full model per role, one engine per role),
isolated LoRA (an adapter per role, one engine per role) and multi-LoRA (an adapter per role, ONE engine
serving all adapters). Prints a table and, per mode, how step time and memory grow from the fewest to the
most roles (linear in roles = 4.0x for 1 → 4). A cell that does not fit the machine's memory is stopped and
reported as such instead of thrashing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

MODES = {
    "shared": ["marl.sharing=shared"],
    "shared 1-engine": ["marl.sharing=shared", "rollout.engine_scope=policy"],
    "isolated": ["marl.sharing=isolated"],
    "isolated LoRA": ["marl.sharing=isolated", "model.lora.enabled=true", "model.lora.rank=16"],
    "multi-LoRA": ["marl.sharing=isolated", "model.lora.enabled=true", "model.lora.rank=16",
                   "rollout.lora_serving=multi"],
}
CHILD = """
import resource, sys
from benchmarks.roles_cost import register_relay
register_relay(int(sys.argv[1]), int(sys.argv[2]))
from jobs.train import main
rc = main(sys.argv[3:])
print("PEAK_RSS_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
sys.exit(rc)
"""
RELAY_SYSTEM = "You are a careful problem solver. Reason step by step, then give the final answer."


def register_relay(roles: int, turns: int) -> None:
    """Adds the `relay` workflow (`turns` sequential turns, turn t by role
    `r{t mod roles}`) to the registry."""
    from marl.types import Episode
    from marl.workflows import WORKFLOWS
    from marl.workflows.common import ask, set_final_answer, system, user, with_instruction

    names = tuple(f"r{i}" for i in range(roles))

    async def run(task, client, family, opts, sample_index):  # noqa: ARG001 - the Workflow signature
        episode = Episode(task=task, sample_index=sample_index, workflow="relay")
        text = ""
        for t in range(turns):
            ask_for = (
                task.prompt
                if t == 0
                else (
                    f"Problem:\n{task.prompt}\n\nA previous solution:\n{text}\n\nCheck it and write the "
                    "final solution."
                )
            )
            role = names[t % roles]
            turn = await ask(client, role, role, t, [system(RELAY_SYSTEM),
                                                     user(with_instruction(ask_for, family.instruction()))])
            episode.turns.append(turn)
            text = turn.text
        set_final_answer(episode, family, episode.turns[-1])
        return episode

    WORKFLOWS["relay"] = types.SimpleNamespace(ROLES=names, agents=lambda opts: list(names), run=run)


def _available_gb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return float("inf")


def _run_guarded(cmd: list[str], timeout_s: float, min_free_gb: float) -> tuple[int | str, str, str]:
    """Runs one cell; (exit code, stdout, stderr), or (reason, ...) when it was stopped. A cell that needs
    more memory than the machine has does not fail: without swap it thrashes on its own code pages for as long
    as one lets it. So the cell is stopped, and reported as not fitting, once free memory falls below
    `min_free_gb`, or when it runs past `timeout_s`."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        start, reason = time.monotonic(), None
        while proc.poll() is None:
            if _available_gb() < min_free_gb:
                reason = f"stopped: free memory fell below {min_free_gb} GB (does not fit this machine)"
            elif time.monotonic() - start > timeout_s:
                reason = f"stopped: ran past {timeout_s:.0f} s"
            if reason:
                proc.kill()
                proc.wait()
                break
            time.sleep(0.5)
        out.seek(0), err.seek(0)
        return reason or proc.returncode, out.read(), err.read()


def run_cell(a: argparse.Namespace, roles: int, mode: str, out: str) -> dict:
    name = f"r{roles}_{mode.replace(' ', '_').replace('-', '_')}"
    overrides = [
        f"model.path={a.model}",
        "data.task=math",
        "data.answer_fallback=last_number",
        "data.eval_size=0",
        "data.train=reasoning_gym:chain_sum?min_terms=2&max_terms=2&min_digits=1&max_digits=1",
        "data.train_size=64",
        "marl.workflow=relay",
        f"rollout.backend={a.backend}",
        "rollout.engines_per_role=0",
        f"rollout.prompts_per_step={a.prompts}",
        f"rollout.samples_per_prompt={a.n}",
        f"rollout.sampling.max_new_tokens={a.tokens}",
        "rollout.vllm.kv_cache_gb=0.5",
        "learner.ranks=0",
        "learner.micro_batch_size=8",
        f"steps={a.steps}",
        f"out_dir={out}",
        f"run_name={name}",
        # Every row trains, whatever the rewards: otherwise the update's work is the number of rows with a
        # non-zero advantage, which the reward draws (different per role name) decide, not the roles.
        "algo.skip_zero_advantage=false",
        *MODES[mode],
    ]
    rc, stdout, stderr = _run_guarded([sys.executable, "-c", CHILD, str(roles), str(a.turns), *overrides],
                                      a.cell_timeout, a.min_free_gb)
    if isinstance(rc, str):
        return {"error": rc}
    if rc != 0:
        return {"error": (stderr.strip().splitlines() or ["?"])[-1]}
    peak_kb = int(next(x for x in stdout.splitlines() if x.startswith("PEAK_RSS_KB")).split()[1])
    rows = [json.loads(x) for x in (Path(out) / name / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in rows if "time/step_s" in r]
    steps = steps[1:] or steps
    parts = ("step", "generate", "update", "sync")
    med = {f"{k}_s": statistics.median(r.get(f"time/{k}_s", 0.0) for r in steps) for k in parts}
    return {**med, "peak_gb": peak_kb / 2**20}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="builtin:smollm2-135m-instruct")
    p.add_argument("--backend", default="vllm")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--n", type=int, default=2)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--roles", default="1,2,4")
    p.add_argument("--cell-timeout", type=float, default=1800, help="seconds before a cell is stopped")
    p.add_argument("--min-free-gb", type=float, default=0.75,
                   help="a cell is stopped (reported as not fitting) when free memory falls below this")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of: " + ", ".join(MODES))
    a = p.parse_args()
    modes, counts = a.modes.split(","), [int(r) for r in a.roles.split(",")]
    results: dict[tuple[int, str], dict] = {}
    with tempfile.TemporaryDirectory() as out:
        for mode in modes:
            for roles in counts:
                results[roles, mode] = run_cell(a, roles, mode, out)
                print(f"  done: {roles} role(s), {mode}: {results[roles, mode]}", flush=True)
    report(a, modes, counts, results)


def report(
    a: argparse.Namespace, modes: list[str], counts: list[int], results: dict[tuple[int, str], dict]
) -> None:
    print(
        f"\n{a.model}, backend {a.backend}, relay of {a.turns} turns, {a.prompts} prompts x {a.n} samples x "
        f"<= {a.tokens} tokens; median of {a.steps - 1} steps after the first"
    )
    print(f"{'mode':<15}{'roles':>6}{'step s':>9}{'generate':>10}{'update':>9}{'sync':>8}{'peak GB':>9}")
    for mode in modes:
        for r in counts:
            c = results[r, mode]
            if "error" in c:
                print(f"{mode:<15}{r:>6}  failed: {c['error']}")
                continue
            print(f"{mode:<15}{r:>6}{c['step_s']:>9.2f}{c['generate_s']:>10.2f}{c['update_s']:>9.2f}"
                  f"{c['sync_s']:>8.2f}{c['peak_gb']:>9.2f}")
    lo, hi = counts[0], counts[-1]
    growth = []
    for mode in modes:
        few, many = results[lo, mode], results[hi, mode]
        if "error" not in few and "error" not in many:
            growth.append(f"{mode} {many['step_s'] / few['step_s']:.2f}x time / "
                          f"{many['peak_gb'] / few['peak_gb']:.2f}x memory")
    print(f"{lo} → {hi} roles (linear = {hi / lo:.1f}x): " + "; ".join(growth))


if __name__ == "__main__":
    main()
