"""Lockstep against streaming rollouts, side by side, on the same engines.

    .venv/bin/python -m benchmarks.rollout_modes [--model builtin:smollm2-135m-instruct] [--prompts 4] [--n 4]
        [--tokens 256] [--reps 1] [--engines 1] [--threads 1] [--workflows eval_opt,voting,single_agent]
        [--backend vllm]

GSM8K test questions, `prompts` x `n` episodes per collection, at most `tokens` new tokens per turn at
temperature 1.0, through the real Collector. The default layout: an engine group per role
(rollout.engine_scope=role), each of `engines` vLLM engines as Ray actors, bound to cores of their own, or 0
for in-process engines; a workflow's engines start before its runs and stop after them. Each repetition runs
lockstep then streaming (alternating, so drift on a shared machine hits both); medians over `reps`. Printed
per workflow and mode: the collection's wall time, tokens generated (the two modes draw different samples, so
equal in expectation only), tokens/s, each engine group's busy fraction (rollout/engine_busy_frac: wall time
with a call in flight) and each role's p50/p99 turn latency; then the streaming/lockstep ratios.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads, for an in-process engine
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

from jobs.config import load_config  # noqa: E402
from jobs.models.resolve import resolve_model  # noqa: E402
from marl.engine_map import EngineMap  # noqa: E402
from marl.policy_map import PolicyMap  # noqa: E402
from marl.tasks import get_family  # noqa: E402
from marl.tasks.data import gsm8k_test  # noqa: E402
from marl.workflows import roles_of  # noqa: E402
from marl.workflows.common import WorkflowOptions  # noqa: E402
from rollout.collector import Collector  # noqa: E402
from rollout.engine import Sampling  # noqa: E402
from rollout.engine_group import EngineGroup  # noqa: E402

MODES = ("lockstep", "streaming")


def _engines(args: argparse.Namespace, path: str, workflow: str) -> dict[str, EngineGroup]:
    cfg = load_config(
        None,
        [
            f"model.path={args.model}",
            f"rollout.backend={args.backend}",
            f"rollout.engines_per_role={args.engines}",
            f"rollout.torch_threads={args.threads}",
            "rollout.vllm.kv_cache_gb=1",
            "rollout.engine_num_cpus=0",
            "rollout.max_batch_size=64",
            "data.train=digit",
            "data.train_size=1",
            "data.eval_size=0",
        ],
    )
    specs = EngineMap.build(PolicyMap.shared(roles_of(workflow), "pi"), "modes").groups
    return {spec.roles[0]: EngineGroup(spec, path, cfg.rollout, "float32", first_slot=k * args.engines)
            for k, spec in enumerate(specs)}


def _collect(engines: dict[str, EngineGroup], workflow: str, mode: str, tasks: list, args: argparse.Namespace,
             seed: int) -> dict[str, float]:
    collector = Collector(engines, workflow, get_family("math"), WorkflowOptions(), mode=mode)
    t0 = time.perf_counter()
    episodes, _, timings = collector.collect(tasks, args.n, Sampling(1.0, 1.0, args.tokens, seed=seed))
    wall = time.perf_counter() - t0
    tokens = sum(len(t.completion.response_ids) for e in episodes for t in e.turns)
    return {
        "wall_s": wall,
        "tokens": float(tokens),
        "tokens_per_s": tokens / wall,
        "turns": float(sum(len(e.turns) for e in episodes)),
        **{k: v for k, v in timings.items() if k.startswith("rollout/")},
    }


def _median(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def _by_role(r: dict[str, float], prefix: str, fmt: str) -> str:
    return " ".join(f"{k.split('/')[-1]} {fmt.format(r[k], r.get(k.replace('p50', 'p99'), 0.0))}"
                    for k in sorted(r) if k.startswith(prefix))


def _print(workflow: str, results: dict[str, dict[str, float]]) -> None:
    for mode in MODES:
        r = results[mode]
        print(f"{workflow:<13}{mode:<11}{r['wall_s']:>8.1f}{r['tokens']:>8.0f}{r['turns']:>7.0f}"
              f"{r['tokens_per_s']:>9.1f}   {_by_role(r, 'rollout/engine_busy_frac/', '{:.2f}'):<34}"
              f"{_by_role(r, 'rollout/turn_latency_p50_s/', '{:.1f}/{:.1f}')}", flush=True)
    s, lk = results["streaming"], results["lockstep"]
    print(f"{workflow:<13}{'ratio':<11}{lk['wall_s'] / s['wall_s']:>7.2f}x{s['tokens'] / lk['tokens']:>8.2f}"
          f"{'':>7}{s['tokens_per_s'] / lk['tokens_per_s']:>8.2f}x   "
          "(wall: lockstep/streaming; tokens, tokens/s: streaming/lockstep)", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="builtin:smollm2-135m-instruct")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--engines", type=int, default=1, help="engine actors; 0 = one in-process engine")
    p.add_argument("--threads", type=int, default=1, help="torch threads per engine")
    p.add_argument("--workflows", default="eval_opt,voting,single_agent")
    p.add_argument("--backend", default="vllm", help="vllm, or hf (the CPU stand-in)")
    args = p.parse_args()
    workflows = args.workflows.split(",")
    path = resolve_model(args.model)
    tasks = gsm8k_test(args.prompts)
    if args.engines:
        import ray

        ray.init(address="local", num_cpus=max(os.cpu_count() or 1, 2), include_dashboard=False)
    try:
        rows = {w: _runs(args, path, w, tasks) for w in workflows}
        layout = (f"{args.engines} {args.backend} engine actor(s)" if args.engines
                  else f"1 in-process {args.backend} engine")
        print(
            f"\n{args.model}, {layout}, {args.prompts} prompts x {args.n} samples, <= {args.tokens} tokens, "
            f"temperature 1.0, medians of {args.reps}"
        )
        print(f"{'workflow':<13}{'mode':<11}{'wall s':>8}{'tokens':>8}{'turns':>7}{'tok/s':>9}   "
              f"{'busy fraction by group':<34}turn latency p50/p99 s by role")
        for workflow in workflows:
            _print(workflow, {m: _median(rows[workflow][m]) for m in MODES})
    finally:
        _shutdown(args)


def _runs(
    args: argparse.Namespace, path: str, workflow: str, tasks: list
) -> dict[str, list[dict[str, float]]]:
    """`reps` collections per mode, alternating, on engines started for `workflow` (after one warm-up)."""
    engines = _engines(args, path, workflow)
    try:
        _collect(engines, workflow, "streaming", tasks[:1], args, seed=-1)
        rows: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
        for rep in range(args.reps):
            for mode in MODES:
                rows[mode].append(_collect(engines, workflow, mode, tasks, args, seed=rep))
                # partial results, should a run be cut short
                print(f"# rep {rep} {workflow} {mode}: " + " ".join(
                    f"{k.removeprefix('rollout/')}={v:.3g}" for k, v in rows[mode][-1].items()), flush=True)
        return rows
    finally:
        for group in engines.values():
            group.shutdown()


def _shutdown(args: Any) -> None:
    if args.engines:
        import ray

        ray.shutdown()


if __name__ == "__main__":
    main()
