"""End-to-end step throughput: our driver (single_agent workflow) vs TRL's GRPOTrainer, same workload.

    .venv/bin/python -m benchmarks.vs_trl [--model builtin:smollm2-135m-instruct] [--steps 4] [--warmup 1]
        [--prompts 16] [--n 4] [--tokens 128] [--backend vllm]

Workload per optimizer step, identical for both: `prompts` prompts × `n` samples × at most `tokens`
new tokens, the same prompts (reasoning-gym chain_sum, seeded), the same system/user messages and the
same reward (our math family's scorer), GRPO without KL, clip (0.2, 0.28), micro-batches of 16
sequences, fp32 on CPU, 2 torch threads.
TRL generates with transformers `generate` (its default without a vLLM server); ours with the configured
rollout backend. Each side runs in its own subprocess of this one invocation (so neither inherits the other's
memory or threads); a step's time is the wall time between consecutive step-end callbacks, and the medians
exclude the warm-up steps. TRL is a benchmark-only extra (`pip install -e .[bench]`); the package never
imports it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DATA = "reasoning_gym:chain_sum?min_terms=2&max_terms=2&min_digits=1&max_digits=2"


def _overrides(a: argparse.Namespace, out: str) -> list[str]:
    return [
        f"model.path={a.model}",
        "data.task=math",
        f"data.train={DATA}",
        "data.train_size=256",
        "data.eval_size=0",
        "data.answer_fallback=last_number",
        "marl.workflow=single_agent",
        "marl.sharing=shared",
        f"rollout.backend={a.backend}",
        "rollout.engines_per_role=0",
        f"rollout.prompts_per_step={a.prompts}",
        f"rollout.samples_per_prompt={a.n}",
        f"rollout.sampling.max_new_tokens={a.tokens}",
        "rollout.sampling.temperature=1.0",
        "rollout.vllm.kv_cache_gb=1.0",
        "algo.kl_coef=0.0",
        "learner.ranks=0",
        "learner.micro_batch_size=16",
        "learner.role_grad_diagnostics=false",
        "learner.optim.lr=1e-6",
        "learner.optim.warmup_steps=0",
        f"steps={a.warmup + a.steps}",
        f"out_dir={out}",
        "run_name=bench_ours",
    ]


def run_ours(a: argparse.Namespace, extra: tuple[str, ...] = (), keep: tuple[str, ...] = ()) -> dict:
    from jobs.config import load_config
    from jobs.train import train

    stamps: list[float] = []
    phases: list[dict] = []

    class _Clock:
        def on_step(self, step, metrics, checkpoint):  # noqa: ARG002 - StepCallback signature
            stamps.append(time.perf_counter())
            phases.append({k: v for k, v in metrics.items() if k.startswith(("time/", *keep))})

    with tempfile.TemporaryDirectory() as out:
        cfg = load_config(None, [*_overrides(a, out), *extra])
        t0 = time.perf_counter()
        train(cfg, callbacks=(_Clock(),))
    steps = [b - a_ for a_, b in zip([t0, *stamps], stamps, strict=False)]
    return {"step_s": steps, "phases": phases}


def _trl_dataset(a: argparse.Namespace):
    from datasets import Dataset

    from marl.prompts import load_prompt_set
    from marl.tasks import get_family
    from marl.tasks.data import load_tasks
    from marl.tasks.sampler import PromptSampler
    from marl.workflows.common import with_instruction

    family = get_family("math", "last_number")
    # Same sampler and seed as the driver, so both sides see the same prompts in the same order.
    sampler = PromptSampler(load_tasks(DATA, 256, 0, "math"), 0)
    tasks = [t for _ in range(a.warmup + a.steps) for t in sampler.next(a.prompts)]
    solver_system = load_prompt_set("default").wording("single_agent", "math").role("solver").system
    rows = [{"prompt": [{"role": "system", "content": solver_system},
                        {"role": "user", "content": with_instruction(t.prompt, family.instruction())}],
             "answer": t.answer} for t in tasks]
    return Dataset.from_list(rows), family, {t.answer: t for t in tasks}


def run_trl(a: argparse.Namespace) -> dict:
    import torch
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from jobs.models.resolve import resolve_model

    torch.set_num_threads(2)
    dataset, family, by_answer = _trl_dataset(a)

    def reward(completions, answer, **_):
        return [family.score(by_answer[g], family.extract_answer(c[-1]["content"])) for c, g in
                zip(completions, answer, strict=True)]

    stamps: list[float] = []

    class _Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):  # noqa: ARG002 - TrainerCallback signature
            stamps.append(time.perf_counter())

    micro = min(16, a.prompts * a.n)
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out,
            use_cpu=True,
            bf16=False,
            fp16=False,
            learning_rate=1e-6,
            beta=0.0,
            epsilon=0.2,
            epsilon_high=0.28,
            num_iterations=1,
            num_generations=a.n,
            per_device_train_batch_size=micro,
            gradient_accumulation_steps=a.prompts * a.n // micro,
            max_completion_length=a.tokens,
            temperature=1.0,
            max_steps=a.warmup + a.steps,
            shuffle_dataset=False,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            seed=0,
            dataloader_num_workers=0,
        )
        trainer = GRPOTrainer(
            model=resolve_model(a.model),
            reward_funcs=reward,
            args=args,
            train_dataset=dataset,
            callbacks=[_Clock()],
        )
        t0 = time.perf_counter()
        trainer.train()
    return {"step_s": [b - a_ for a_, b in zip([t0, *stamps], stamps, strict=False)]}


def _child(which: str, argv: list[str]) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([sys.executable, "-m", "benchmarks.vs_trl", *argv, "--only", which, "--json", f.name],
                       check=True)
        return json.loads(Path(f.name).read_text())


def breakdown(step_walls: list[float], phases: list[dict]) -> list[tuple[str, float]]:
    """(part, median seconds) of our step. The parts add up to the step's wall time: generation (an engine
    call in flight), the rest of the rollout (episode logic, scoring, batching), store, advantage, update (the
    learners' step, Ray hop included), sync (verified weight broadcast), and the driver outside the phases."""
    parts: dict[str, list[float]] = {}
    for wall, p in zip(step_walls, phases, strict=True):
        rows = {
            "generate": p["time/generate_s"], "rollout, rest": p["time/rollout_s"] - p["time/generate_s"],
            "store": p["time/store_s"], "advantage": p["time/advantage_s"], "update": p["time/update_s"],
            "sync": p.get("time/sync_s", 0.0), "driver, outside phases": wall - p["time/step_s"],
        }
        for k, v in rows.items():
            parts.setdefault(k, []).append(v)
    return [(k, statistics.median(v)) for k, v in parts.items()]


ENGINE_AND_LEARNER = ("generate", "update", "sync")


def workload_parser(description: str) -> argparse.ArgumentParser:
    """The step workload's arguments, shared by the benchmarks that run this workload."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--model", default="builtin:smollm2-135m-instruct")
    p.add_argument("--backend", default="vllm")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--tokens", type=int, default=128)
    return p


def main() -> None:
    p = workload_parser(__doc__.splitlines()[0])
    p.add_argument("--only", choices=["ours", "trl"], help=argparse.SUPPRESS)
    p.add_argument("--json", help=argparse.SUPPRESS)
    a, argv = p.parse_args(), [x for x in sys.argv[1:]]
    if a.only:
        Path(a.json).write_text(json.dumps(run_ours(a) if a.only == "ours" else run_trl(a)))
        return
    ours, trl = _child("ours", argv), _child("trl", argv)
    samples = a.prompts * a.n
    med = {k: statistics.median(r["step_s"][a.warmup:]) for k, r in (("ours", ours), ("trl", trl))}
    print(f"\nworkload: {a.prompts} prompts x {a.n} samples x <= {a.tokens} tokens, {a.model}, "
          f"{a.steps} measured steps after {a.warmup} warm-up; ours with rollout.backend={a.backend}")
    print(f"{'':<8}{'median step s':>14}{'samples/s':>12}   steps (s)")
    for k in ("ours", "trl"):
        steps = " ".join(f"{s:.1f}" for s in (ours if k == "ours" else trl)["step_s"])
        print(f"{k:<8}{med[k]:>14.1f}{samples / med[k]:>12.2f}   {steps}")
    parts = breakdown(ours["step_s"][a.warmup:], ours["phases"][a.warmup:])
    print("our step, median seconds per part (of the median step):")
    for k, v in parts:
        print(f"  {k:<24}{v:8.2f} s  {v / med['ours']:6.1%}")
    # Orchestration: everything but the engines generating, the learners stepping and the weights moving.
    overhead = sum(v for k, v in parts if k not in ENGINE_AND_LEARNER)
    print(f"orchestration overhead (all but {', '.join(ENGINE_AND_LEARNER)}): {overhead:.2f} s = "
          f"{overhead / med['ours']:.1%} of the step (target <= 10%)")
    print(f"samples/s ours / TRL: {med['trl'] / med['ours']:.2f}x (target >= 2x); orchestration "
          f"{overhead / med['ours']:.1%} of our step (target <= 10%)")


if __name__ == "__main__":
    main()
