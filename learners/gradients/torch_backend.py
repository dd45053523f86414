"""The plain torch gradient backend (`learner.backend=torch`): each rank's gradient is summed over
the data-parallel ranks with one all-reduce per optimizer step, clipped by its global norm and
applied by the learner's torch AdamW.
Checkpoints are learners/state/state_io.py's files.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, ClassVar

import torch

from cluster import collective
from learners.batch import TrainBatch
from learners.gradients.backends import BackendCapabilities, LearnerParts
from learners.gradients.offload import OptimizerStash
from learners.role_grads import assign_flat_grads, flat_grads
from learners.state.state_io import load_learner_state, save_learner_state

if TYPE_CHECKING:
    from learners.state.weights import WeightSnapshot


class TorchBackend:
    """learners.gradients.backends.GradientBackend on plain torch modules (CPU)."""

    capabilities: ClassVar[BackendCapabilities] = BackendCapabilities(gpus=False)  # CPU only, no ZeRO
    min_backward_passes: ClassVar[int] = 0  # ranks never communicate inside forward or backward
    per_role_gradients = True  # every rank holds whole weights
    device = torch.device("cpu")

    def __init__(self, parts: LearnerParts):
        self.parts = parts
        self.grad_clip = parts.spec.learner.optim.grad_clip
        self.stash = OptimizerStash(parts.optimizer)

    def join(self, backend: str, host: str, port: int, rank: int, world: int, timeout_s: float) -> None:
        collective.join(backend, host, port, rank, world, timeout_s)

    def build(self) -> None:
        pass  # the learner's AdamW is all there is

    def prepare(self, data: TrainBatch) -> TrainBatch:
        return data

    def runner(self, plain: bool) -> torch.nn.Module:
        return self.parts.model

    def matched_passes(self, n: int) -> int:
        return n

    def backward(self, losses: Iterable[torch.Tensor]) -> None:
        self.parts.optimizer.zero_grad(set_to_none=False)
        for loss in losses:
            loss.backward()
        flat = flat_grads(self.parts.params)  # zeros on a rank with an empty shard: it still joins the step
        collective.all_reduce_sum(flat)
        self.apply_gradient(flat)

    def apply_gradient(self, total: torch.Tensor) -> None:
        assign_flat_grads(self.parts.params, total)

    def step(self) -> tuple[float, float, bool]:
        lr = float(self.parts.optimizer.param_groups[0]["lr"])
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.parts.params, self.grad_clip or float("inf")))
        if not math.isfinite(grad_norm):  # as DeepSpeed skips an overflowed step: AdamW would write NaN
            return lr, grad_norm, False
        self.parts.optimizer.step()
        return lr, grad_norm, True

    def after_update(self) -> None:
        pass

    def snapshot(self) -> WeightSnapshot | None:
        return None

    def save_state(self, path: str, step: int) -> None:
        p = self.parts
        save_learner_state(path, p.rank, p.model, p.optimizer, p.scheduler, step)

    def load_state(self, path: str) -> int:
        p = self.parts
        return load_learner_state(path, p.rank, p.model, p.optimizer, p.scheduler)

    # -- rollout.layout=colocated: the optimizer states off the device during the rollout --
    def offload_states(self) -> float:
        return self.stash.offload()

    def reload_states(self) -> float:
        return self.stash.reload()
