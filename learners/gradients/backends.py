"""The learner backends' registry (`learner.backend`), their capabilities and contract: how a Learner rank
reduces and applies its gradients.

Every rank is a learners.learner.Learner: it owns the model, the forward passes, the loss and the loop over a
training step's optimizer steps. Its `backend` (a `GradientBackend`, chosen at setup:
`BACKENDS[learner.backend]`) owns only what differs between plain torch (learners/gradients/torch_backend.py:
one all-reduce, AdamW, clipping) and DeepSpeed (learners/gradients/deepspeed_backend.py: the ZeRO engine, its
idle passes, ZeRO-3's weight snapshot and checkpoint layout). Each backend class declares what it can run
(`BackendCapabilities`); the config checks and the planner read that, never the backend's name. The registry
names the built-ins' classes as strings and imports one on first use, so the config reads BACKENDS on a
machine without deepspeed. A new backend is its own module plus one line in `BACKENDS`; from outside this
package, a module that declares its class as `BACKEND`, named by its path in `learner.backend` (every rank
imports it, a Ray actor too), or `BACKENDS.register(name, cls)` in one process (marl/registry.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol

from marl.registry import Registry

if TYPE_CHECKING:  # the config imports this module; models and optimizers are the ranks' business
    import torch
    from torch import Tensor

    from learners.batch import TrainBatch
    from learners.member import LearnerSpec
    from learners.state.weights import WeightSnapshot

@dataclass(frozen=True, kw_only=True)
class BackendCapabilities:
    """What a gradient backend can run, declared on its class (`capabilities`): the config checks
    (jobs/config/loading.py, colocation.py, precision.py) and the planner's memory terms
    (jobs/plan/planner.py, learners/compute/memory.py) read these instead of comparing backend names."""

    gpus: bool  # trains on GPUs (learner.rank_num_gpus > 0); False: a CPU backend, whatever the ranks ask for
    # learner.deepspeed.zero_stage values it runs; (): no ZeRO, every rank holds whole weights, gradients and
    # optimizer states in fp32 (the memory model's stage 0).
    zero_stages: tuple[int, ...] = ()
    float16: bool = True  # trains model.dtype=float16
    lora_colocate: bool = True  # holds learner.lora_colocate policies: one base module, every adapter bound
    # bf16 as fp32 master weights under CPU autocast, run by the Learner (False: the backend's own bf16).
    autocast_bf16: bool = True

    def zero_stage(self, configured: int) -> int:
        """The ZeRO stage a rank runs under `learner.deepspeed.zero_stage=configured`: 0 without ZeRO."""
        return configured if self.zero_stages else 0


@dataclass(frozen=True, kw_only=True)
class LearnerParts:
    """What a Learner builds and hands its backend: the policy module and its trainable parameters, the torch
    AdamW and LR schedule (every backend steps the same optimizer; the schedule stays the learner's), and the
    frozen reference (None without one, or for LoRA, whose reference is the base with the adapter off)."""

    spec: LearnerSpec
    rank: int
    model: torch.nn.Module
    params: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    reference: torch.nn.Module | None


class GradientBackend(Protocol):
    """How one rank's gradient is summed over the data-parallel ranks and applied, and what that changes about
    forward passes, weights and checkpoints."""

    capabilities: ClassVar[BackendCapabilities]
    # Backward passes every rank runs at least once per optimizer step, even with no rows anywhere.
    min_backward_passes: ClassVar[int]

    def __init__(self, parts: LearnerParts) -> None: ...

    @property
    def per_role_gradients(self) -> bool:
        """Whether whole weights exist outside forward, so that each role's gradient can be taken apart."""
        ...

    @property
    def device(self) -> torch.device:
        """Where the batch and gradient buffers live."""
        ...

    def join(self, backend: str, host: str, port: int, rank: int, world: int, timeout_s: float) -> None:
        """Join the ranks' process group (cluster.collective)."""
        ...

    def build(self) -> None:
        """Build what reduces and applies the gradients (DeepSpeed: its engine) on the joined
        process group, or on a one-rank group of this process's own; a no-op once built. A rank
        builds on `join` or on first use;
        colocated policies build at once, each with its adapter bound (learners/colocated_group.py)."""
        ...

    def prepare(self, data: TrainBatch) -> TrainBatch:
        """Ready for an update (the engine built): `data` on `device`."""
        ...

    def runner(self, plain: bool) -> torch.nn.Module:
        """The module a forward pass goes through: an engine's wrapper (its hooks), or the plain module."""
        ...

    def matched_passes(self, n: int) -> int:
        """Forward passes this rank runs when it has `n` of its own (ranks that communicate inside forward
        must run equally many; the Learner fills the rest with idle passes)."""
        ...

    def backward(self, losses: Iterable[Tensor]) -> None:
        """Backward through each micro-batch loss as it is yielded; the sum over losses and ranks becomes the
        step's gradient."""
        ...

    def apply_gradient(self, total: Tensor) -> None:
        """Make `total` [P], a gradient already summed over ranks (identical on every
        rank), the step's gradient."""
        ...

    def step(self) -> tuple[float, float, bool]:
        """Clip the step's gradient and take the optimizer step: (the lr it used, the gradient norm, whether
        the step applied: False when the gradient was not finite and the weights were left as they were)."""
        ...

    def after_update(self) -> None:
        """After a training step's last optimizer step."""
        ...

    def snapshot(self) -> WeightSnapshot | None:
        """Weights this rank gathered for serving, when its module holds only a
        partition; None: read the module."""
        ...

    def save_state(self, path: str, step: int) -> None:
        """This rank's part of the policy's state (contract:
        learners/state/state_io.py), with the update counter."""
        ...

    def load_state(self, path: str) -> int:
        """Restore what save_state wrote; returns the update counter."""
        ...

    def offload_states(self) -> float:
        """Move the optimizer's states off the device (rollout.layout=colocated, during the rollout);
        returns the bytes moved (device bytes freed on GPU)."""
        ...

    def reload_states(self) -> float:
        """Bring back what offload_states moved, bit for bit; returns the bytes moved."""
        ...



# Open: `learner.backend` also takes a module path, whose module declares its class as BACKEND.
BACKENDS: Registry[type[GradientBackend]] = Registry("learner.backend", {
    "torch": "learners.gradients.torch_backend:TorchBackend",
    "deepspeed": "learners.gradients.deepspeed_backend:DeepSpeedBackend",
}, declares="BACKEND")


def capabilities(backend: str) -> BackendCapabilities:
    """What the backend registered as `backend` can run (its class imported now, deepspeed itself not)."""
    return BACKENDS[backend].capabilities
