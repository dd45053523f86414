"""Whether `model.dtype` suits where a run computes: bfloat16 on CPU needs a CPU with bf16 instructions.

A part computes on CPU when its backend runs on CPU alone (its class's capabilities: the torch learner
backend, the HF engine), a Ray actor asking
for no GPU (`learner.rank_num_gpus`, `rollout.engine_num_gpus`), or an in-process member (`learner.ranks=0`,
`rollout.engines_per_role=0`) of a driver that sees no CUDA device. The CPU is the one loading the config (the
driver's): on a cluster whose nodes differ, give CPU parts the same CPU as the driver or set
`model.allow_emulated_bf16`.
"""

from __future__ import annotations

from collections.abc import Callable

from cluster.cpu import has_bf16, read_cpuinfo
from jobs.config.schema import TrainConfig
from learners.gradients.backends import capabilities
from rollout.engine import engine_capabilities


def cpu_parts(cfg: TrainConfig, cuda: Callable[[], bool]) -> list[str]:
    """The parts of one policy's config (`jobs.config.policies.policy_config`) that compute on
    CPU, each with the setting that puts it there. `cuda()`: whether this process sees a CUDA
    device (asked only when needed)."""
    learner, rollout = cfg.learner, cfg.rollout
    parts = []
    if not capabilities(learner.backend).gpus:
        parts.append(f"the learner (learner.backend={learner.backend})")
    elif _on_cpu(learner.ranks, learner.rank_num_gpus, cuda):
        parts.append("the learner (learner.rank_num_gpus=0)")
    if not engine_capabilities(rollout.backend).gpus:
        parts.append(f"the engines (rollout.backend={rollout.backend})")
    elif _on_cpu(rollout.engines_per_role, rollout.engine_num_gpus, cuda):
        parts.append("the engines (rollout.engine_num_gpus=0)")
    return parts


def _on_cpu(members: int, num_gpus: float, cuda: Callable[[], bool]) -> bool:
    # In-process members (0) run on the driver's device; Ray actors get a GPU only when they ask for one.
    return not cuda() if members == 0 else num_gpus == 0


def dtype_problem(
    cfg: TrainConfig, cpuinfo: str | None = None, cuda: Callable[[], bool] | None = None
) -> str | None:
    """Why one policy's config cannot run its model.dtype where its parts compute, or None. `cpuinfo`: the
    text of /proc/cpuinfo (this machine's by default); `cuda`: as in `cpu_parts` (torch's view by default)."""
    if cfg.model.dtype != "bfloat16" or cfg.model.allow_emulated_bf16:
        return None
    if has_bf16(read_cpuinfo() if cpuinfo is None else cpuinfo):
        return None
    parts = cpu_parts(cfg, cuda or _cuda_available)
    if not parts:
        return None
    return (
        "model.dtype=bfloat16 on CPU needs avx512_bf16 or amx_bf16 in /proc/cpuinfo flags; this CPU has "
        f"neither: use float32 (on CPU here: {', '.join(parts)}), or set model.allow_emulated_bf16=true to "
        "run "
        "bf16 in software (slow; for numerics checks)"
    )


def _cuda_available() -> bool:
    import torch  # only here: loading a config needs no torch otherwise

    return torch.cuda.is_available()
