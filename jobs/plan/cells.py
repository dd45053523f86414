"""The paper's cells (Qwen3 0.6B, 1.7B, 4B) planned in both GPU layouts side by side: the paper's colocated
hybrid engine (`jobs/configs/sweeps/paper_base.yaml`, rollout.layout=colocated: two engines and two learner
ranks taking turns on two GPUs) and the fractional layout the project ran before (one engine at half a GPU and
each policy's learner rank at half a GPU, all resident at once). For each: the GPUs the trial takes, each
phase's bytes on its fullest GPU (colocated) or the resident sum (fractional), whether it fits an 80 GB GPU at
the planner's 90 %, whether it needs gradient checkpointing to fit, the estimated step and the GPU-hours of
500 steps.

    python -m jobs.plan.cells            # the markdown table docs/rollout_learners.md shows
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from jobs.config import load_config
from jobs.plan.layout import run_layout
from jobs.plan.planner import Plan, make_plan
from learners.compute.memory import GIB

BASE = "jobs/configs/sweeps/paper_base.yaml"
SIZES = ("0.6B", "1.7B", "4B")
GPU_GB = 80.0
# The cells that bound memory: the longest (math eval_opt, 35,840 tokens) with one policy per role, and the
# single-agent baseline (paper_matrix.yaml's caps).
CELLS = {
    "eval_opt isolated": ["marl.workflow=eval_opt", "marl.sharing=isolated",
                          "rollout.max_prompt_tokens=30720", "rollout.sampling.max_new_tokens=5120",
                          "algo.max_len=35840", "marl.max_rounds=3"],
    "single_agent": ["marl.workflow=single_agent", "marl.sharing=shared", "learner.lora_colocate=false",
                     "rollout.max_prompt_tokens=15360", "rollout.sampling.max_new_tokens=5120",
                     "algo.max_len=20480"],
}
# The layout paper_base.yaml had before it was colocated: every member resident on half a GPU.
FRACTIONAL = ["rollout.layout=separate", "rollout.engines_per_role=1",
              "rollout.vllm.gpu_memory_utilization=0.45", "learner.ranks=1", "learner.lora_colocate=false"]
LAYOUTS = {"colocated": [], "fractional": FRACTIONAL}


@dataclass(frozen=True)
class CellPlan:
    """One cell in one layout: GiB on the fullest GPU (rollout and update phase when colocated, else None),
    seconds per step, GPU-hours of `steps` steps."""

    size: str
    cell: str
    layout: str
    gpus: float
    peak_gib: float
    rollout_gib: float | None
    update_gib: float | None
    fits: bool
    needs_checkpointing: bool
    peak_off_gib: float  # the fullest GPU without gradient checkpointing
    step_s: float
    gpu_hours: float


def cell_plan(size: str, cell: str, layout: str) -> CellPlan:
    """Plan `cell` of Qwen3-`size` in `layout` against GPU_GB GPUs, with checkpointing on and off."""
    cfg = load_config(BASE, [f"model.path=/models/Qwen3-{size}", "ray.gpu_memory_gb=0", *CELLS[cell],
                             *LAYOUTS[layout]])
    run = run_layout(cfg)
    pids = list(run.configs)
    on, off = (make_plan(run, GPU_GB * GIB, dict.fromkeys(pids, c)) for c in (True, False))
    best = off if off.fits() else on
    fullest = max(range(len(best.gpus)), key=lambda i: best.gpu_bytes()[i])
    phase = best.phases[fullest] if best.phases else None
    gpus = sum(m.gpus for m in best.members)
    step_s = _step_seconds(best)
    return CellPlan(size, cell, layout, gpus, best.gpu_bytes()[fullest] / GIB,
                    phase.rollout / GIB if phase else None, phase.update / GIB if phase else None,
                    on.fits(), on.fits() and not off.fits(), max(off.gpu_bytes()) / GIB, step_s,
                    cfg.steps * step_s * gpus / 3600)


def _step_seconds(plan: Plan) -> float:
    return plan.times.get("step_s", 0.0)


def cell_plans() -> list[CellPlan]:
    return [cell_plan(size, cell, layout) for size in SIZES for cell in CELLS for layout in LAYOUTS]


def markdown(plans: list[CellPlan]) -> str:
    """The side-by-side table (GiB, seconds, GPU-hours of the run)."""
    def gib(x: float | None) -> str:
        return "–" if x is None else f"{x:.1f}"

    lines = ["| model | cell | layout | GPUs | rollout phase GiB | update phase GiB | peak GiB "
             "| fits 2×80 GB | peak GiB without checkpointing | needs checkpointing | step s "
             "| GPU-h (500 steps) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in plans:
        lines.append(f"| Qwen3-{p.size} | {p.cell} | {p.layout} | {p.gpus:g} | {gib(p.rollout_gib)} "
                     f"| {gib(p.update_gib)} | {p.peak_gib:.1f} | {'yes' if p.fits else 'no'} | "
                     f"{p.peak_off_gib:.1f} | {'yes' if p.needs_checkpointing else 'no'} | {p.step_s:.0f} "
                     f"| {p.gpu_hours:.0f} |")
    return "\n".join(lines)


def main() -> int:
    sys.stdout.write(markdown(cell_plans()) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
