"""The memory plan in words: per GPU, what each engine and learner rank holds, term by term, and the step-time
estimates (`python -m jobs.train --plan`, `python -m jobs.sweep --dry-run`)."""

from __future__ import annotations

from jobs.config.schema import TrainConfig
from jobs.plan.phases import GpuPhases
from jobs.plan.planner import FIT_FRACTION, Member, Plan, longest_sequence, member_share
from jobs.plan.rollout_estimate import EXPECTED_FILL
from learners.compute.memory import GIB


def gib(x: float) -> str:
    return f"{x / GIB:.1f}"


def describe_member(m: Member, plan: Plan) -> str:
    """One line: the member, its GPU request and its peak, term by term (GiB)."""
    where = f"{m.gpus:g} GPU" if m.gpus > 0 else "CPU"
    if m.engine is not None:
        e = m.engine
        return (
            f"{m.name} ({where}) share {gib(e.share)} = weights {gib(e.weights)} + LoRA slots "
            f"{gib(e.adapters)} "
            f"+ reserve {gib(e.reserve)} (estimate) + KV {gib(e.kv)}: {e.kv_sequences} sequences at once of "
            "the "
            "longest prompt + response"
        )
    assert m.learner is not None and m.policy is not None
    lm, ckpt = m.learner, plan.checkpointing[m.policy]
    on, off = (x.activations for x in plan.either_way[m.policy])
    return (
        f"{m.name} ({where}) {gib(m.peak)} = weights {gib(lm.weights)} + gradients {gib(lm.gradients)} + "
        f"optimizer {gib(lm.optimizer)} + role grads {gib(lm.role_grads)} + activations "
        f"{gib(lm.activations)} "
        f"(checkpointing {'on' if ckpt else 'off'}; on {gib(on)}, off {gib(off)}) + logits {gib(lm.logits)} "
        "+ "
        f"runtime {gib(lm.runtime)} + allocator pool {gib(lm.pool)}"
    )


def format_plan(cfg: TrainConfig, plan: Plan) -> str:
    """The whole plan: memory per GPU (and the CPU members), then the per-step time estimates."""
    limit = (
        f"{plan.memory / GIB:g} GiB GPUs, refused above {FIT_FRACTION:.0%} = "
        f"{gib(FIT_FRACTION * plan.memory)} GiB"
        if plan.memory
        else "no GPU memory declared (ray.gpu_memory_gb) or detected: not checked"
    )
    lr = cfg.learner
    tokens = (f"{lr.max_tokens_per_micro_batch:,} tokens per micro-batch (learner.max_tokens_per_micro_batch)"
              if lr.max_tokens_per_micro_batch else f"{lr.micro_batch_size * cfg.algo.max_len:,} tokens per "
              "micro-batch at most (learner.micro_batch_size x algo.max_len)")
    lines = [f"[{cfg.run_name}] plan: {limit}; longest sequence {longest_sequence(cfg):,} tokens; {tokens}"]
    for i, (gpu, used) in enumerate(zip(plan.gpus, plan.gpu_bytes(), strict=True)):
        share = f" ({used / plan.memory:.0%})" if plan.memory else ""
        lines.append(f"GPU {i}: {gib(used)} GiB{share}" + (_phases(plan.phases[i]) if plan.phases else ""))
        lines += [f"  {describe_member(m, plan)}" for m in gpu]
    cpu = [m for m in plan.members if m.gpus <= 0]
    if cpu:
        lines.append(
            "CPU (not checked): " + "; ".join(f"{m.name} {gib(m.peak * member_share(m))} GiB" for m in cpu)
        )
    if plan.times:
        lines.append(format_times(plan.times))
    lines.append("fits" if plan.fits() else "DOES NOT FIT")
    return "\n".join(lines)


def _phases(p: GpuPhases) -> str:
    """A colocated GPU's two phases (jobs/plan/phases.py)."""
    return (f", the larger of its phases: rollout {gib(p.rollout)} GiB (engine awake, learner states "
            f"offloaded), update {gib(p.update)} GiB (engine asleep, learner at its peak); resident in both "
            f"{gib(p.resident)} GiB")


def format_times(t: dict[str, float]) -> str:
    """Per-step seconds (estimates on H100s; sources in
    jobs/plan/rollout_estimate.py and jobs/plan/planner.py)."""
    updates = ", ".join(f"{k.split('/', 1)[1]} {v:.0f} s" for k, v in t.items() if k.startswith("update_s/"))
    return (
        f"estimated per step (H100, turns at {EXPECTED_FILL:.0%} of their caps): rollout "
        f"{t['rollout_s']:.0f} s "
        f"({t['generated_tokens']:,.0f} tokens at {t['decode_tokens_per_s']:,.0f} tokens/s, "
        f"{t['concurrency']:.0f} sequences per engine), update {t['update_s']:.0f} s ({updates}), step "
        f"{t['step_s']:.0f} s; every turn at its caps: step {t['step_s_at_caps']:.0f} s"
        + (f"; phase switches {t['switch_s']:.0f} s of each step (colocated)" if "switch_s" in t else "")
    )
