"""The colocated layout's memory plan, phase by phase (rollout.layout=colocated: engine i and rank i of every
learner group time-share GPU i, jobs/driver/phases.py). A GPU holds at its peak the larger of its two phases:

- rollout: the engine awake (its whole share: weights, LoRA slots, reserve, KV cache) beside what the learner
  ranks keep resident (their module weights and CUDA runtime: optimizer states and gradients are offloaded);
- update: every learner rank at its peak (states reloaded, activations at the token budget) beside what the
  sleeping engine keeps (its reserve: CUDA context and graphs; weights are in host memory at sleep level 1,
  the KV cache is freed).

What stays resident in both phases (learner weights and runtime, the engine's reserve) is in both sums. The
switch between phases moves the engine's weights and the offloaded learner states over the host link twice per
step; `switch_seconds` estimates it at HOST_LINK_BYTES_PER_S.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the planner imports this module
    from jobs.plan.planner import Member

# Pinned host <-> device copies on an H100's PCIe gen5 x16 link, well below its 64 GB/s peak (estimate; vLLM's
# sleep and DeepSpeed's offload_states copy tensor by tensor).
HOST_LINK_BYTES_PER_S = 25e9


@dataclass(frozen=True)
class GpuPhases:
    """One GPU's bytes in each phase (bytes)."""

    rollout: float
    update: float
    resident: float  # held in both phases (inside both sums)

    @property
    def peak(self) -> float:
        return max(self.rollout, self.update)


def colocated_gpus(members: Sequence[Member]) -> list[list[Member]]:
    """GPU i holds member i of every group (`<group>#<i>`): engine i and rank i of each learner group."""
    gpus: dict[int, list[Member]] = {}
    for m in members:
        if m.gpus > 0:
            gpus.setdefault(int(m.name.rsplit("#", 1)[1]), []).append(m)
    return [gpus[i] for i in sorted(gpus)]


def learner_resident(m: Member) -> float:
    """What a learner rank keeps on its GPU during the rollout: its module weights and CUDA runtime."""
    assert m.learner is not None
    return m.learner.weights + m.learner.runtime


def offloaded_bytes(m: Member) -> float:
    """What a learner rank moves off its GPU for the rollout: gradients and optimizer states."""
    assert m.learner is not None
    return m.learner.gradients + m.learner.optimizer


def gpu_phases(gpu: Sequence[Member]) -> GpuPhases:
    """The two phases of one colocated GPU (its engine and learner ranks)."""
    engines = [m.engine for m in gpu if m.engine is not None]
    learners = [m for m in gpu if m.learner is not None]
    kept = sum(learner_resident(m) for m in learners)
    asleep = sum(e.reserve for e in engines)
    return GpuPhases(rollout=sum(e.share for e in engines) + kept,
                     update=sum(m.peak for m in learners) + asleep,
                     resident=kept + asleep)


def switch_seconds(members: Sequence[Member]) -> float:
    """One step's phase switches on the busiest GPU: each engine's weights and LoRA slots to host and back,
    each learner rank's offloaded states to host and back (both ways, so twice the bytes)."""
    per_gpu = [2.0 * (sum(m.engine.weights + m.engine.adapters for m in gpu if m.engine is not None)
                      + sum(offloaded_bytes(m) for m in gpu if m.learner is not None))
               for gpu in colocated_gpus(members)]
    return max(per_gpu, default=0.0) / HOST_LINK_BYTES_PER_S
