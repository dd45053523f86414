"""DeepSpeed gradient backend (`learner.backend=deepspeed`): a Learner rank whose gradients a DeepSpeed engine
reduces and applies.

The only module importing deepspeed, and only when a rank builds its engine. Loss, metrics,
reference model, weight views, export and the loop over a training step's optimizer steps
(Learner.update) are the Learner's; this
backend changes how gradients are reduced and applied:
- The learner's torch AdamW is handed to `deepspeed.initialize`, which partitions its state over the ranks
  (ZeRO-2: optimizer states and gradients; ZeRO-3: the weights too) and steps it once per optimizer step
  (`managed_gradient_accumulation=False`: one `engine.step()` closes one accumulation window, whatever the
  number of micro-batches), with DeepSpeed's global-norm clipping. The learner's warmup/cosine LambdaLR stays
  outside the engine (it advances per training step or per optimizer step) and travels in the checkpoint's
  client state.
- The engine runs on the torch.distributed group the ranks joined through cluster.collective (gloo on CPU,
  nccl on GPU); a lone rank makes a one-member group of its own. Colocated LoRA policies
  (learners/colocated_group.py) build one engine each over their shared module, their own adapter bound.
- The caller's global normaliser already makes micro-batch losses sum to the batch loss, so nothing is
  divided by accumulation steps (`scale_wrt_gas=False`); DeepSpeed averages gradients over ranks where the
  normaliser wants their sum, so each rank's loss is multiplied by the world size.
- Every rank runs the same number of forward/backward passes (ZeRO communicates inside them):
  shards with fewer micro-batches run zero-loss passes on one pad token (the Learner's idle
  passes, up to `matched_passes`).

Per-role gradients under ZeRO-2 (weights are whole on every rank): each role's gradient is taken by the
Learner (torch.autograd.grad through the plain module, outside the engine's reduction hooks, summed over ranks
into one [roles × params] buffer), and handed to the engine as the gradient of the linear surrogate Σ_p <p,
g_p>; the step still goes through ZeRO's reduction, clipping and partitioned optimizer. Under ZeRO-3 the
weights exist only inside forward, so no per-role buffer is built: grad/role_norm, grad/norm_share,
grad/dominance and grad/cos are not reported; every other metric (grad/mass_share, the per-role entropy, KL,
clip fraction) is. ZeRO-3 gathers the weights once per training step, one module at a time on every rank
(rank 0 keeps a host copy for get_weights/export, which the driver calls on rank 0 alone).
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar, cast

import numpy as np
import torch
import torch.distributed as dist

from cluster import collective
from learners.batch import TrainBatch
from learners.config import LearnerConfig
from learners.gradients.backends import BackendCapabilities, LearnerParts
from learners.state.export import snapshot_by_module
from learners.state.state_io import StateError, read_state, rng_file, write_fsynced
from learners.state.weights import WeightSnapshot, is_lora
from marl.types import JsonRecord

CHECKPOINT_TAG = "deepspeed"
_JOIN_TIMEOUT_S = 300.0


def deepspeed_config(learner: LearnerConfig, dtype: str) -> JsonRecord:
    """The engine's config from the learner section (`learner.deepspeed.*`,
    micro-batch, clipping) and dtype."""
    ds = learner.deepspeed
    zero: dict[str, Any] = {"stage": ds.zero_stage, "overlap_comm": False, "contiguous_gradients": True}
    if ds.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu"}
    if ds.offload_param:
        zero["offload_param"] = {"device": "cpu"}
    return {
        "train_micro_batch_size_per_gpu": learner.micro_batch_size,
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,
        "gradient_clipping": learner.optim.grad_clip,
        "zero_optimization": zero,
        "bf16": {"enabled": dtype == "bfloat16"},
        # The optimizer is the learner's torch AdamW (also when offloaded), so both backends step alike.
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 2**31 - 1,
    }


class DeepSpeedBackend:
    """learners.gradients.backends.GradientBackend through a DeepSpeed engine, built on first use."""

    # GPUs and CPU (gloo); float16 would need DeepSpeed's dynamic loss scaling, which rescales the caller's
    # normalised loss; bf16 weights, with fp32 partitions in ZeRO's optimizer (its `bf16`).
    capabilities: ClassVar[BackendCapabilities] = BackendCapabilities(
        gpus=True, zero_stages=(2, 3), float16=False, autocast_bf16=False)
    # The engine steps only after a backward: a window with no rows on any rank still runs one idle pass.
    min_backward_passes: ClassVar[int] = 1

    def __init__(self, parts: LearnerParts):
        self.parts = parts
        self.cfg = parts.spec.learner
        self.rank = parts.rank
        self.dtype = parts.spec.model.dtype
        self.policy_id = parts.spec.policy_id
        self.stage = self.cfg.deepspeed.zero_stage
        self.per_role_gradients = self.stage == 2  # ZeRO-3 holds no whole weights outside forward
        self.engine: Any = None
        self._snapshot: WeightSnapshot | None = None  # ZeRO-3, rank 0: gathered weights of the last step

    # -- process group and engine --
    def join(self, backend: str, host: str, port: int, rank: int, world: int, timeout_s: float) -> None:
        collective.join("nccl" if torch.cuda.is_available() else backend, host, port, rank, world, timeout_s)
        self.build()

    def build(self) -> None:
        """Build the engine (after `join`, or on a one-member group of this
        rank's own); a no-op once built."""
        if self.engine is not None:
            return
        if not dist.is_initialized():
            host, port = collective.rendezvous_address()
            backend = "nccl" if torch.cuda.is_available() else "gloo"
            collective.join(backend, host, port, 0, 1, _JOIN_TIMEOUT_S)
        for key, value in {
            "RANK": dist.get_rank(),
            "WORLD_SIZE": dist.get_world_size(),
            "LOCAL_RANK": 0,
        }.items():
            os.environ.setdefault(key, str(value))  # read by parts of DeepSpeed that never see the group
        import deepspeed

        # The shared-memory allreduce op is compiled on first use (~45 s); gloo alone serves these ranks.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        # The LR scheduler stays the learner's: it advances per training step or per optimizer step
        # (learner.optim.schedule_unit), where an engine's scheduler would advance on every engine.step().
        self.engine, _, _, _ = deepspeed.initialize(
            model=self.parts.model, optimizer=self.parts.optimizer,
            config=deepspeed_config(self.cfg, self.dtype), dist_init_required=False,
        )
        # the engine moved the policy to its device; the reference follows
        if self.parts.reference is not None:
            self.parts.reference.to(self.engine.device)
        self._take_snapshot()

    # -- how gradients are reduced and applied (the optimizer-step loop is Learner.update's) --
    @property
    def device(self) -> torch.device:
        return cast(torch.device, self.engine.device)

    def prepare(self, data: TrainBatch) -> TrainBatch:
        self.build()
        return data.to(self.engine.device)

    def runner(self, plain: bool) -> torch.nn.Module:
        return self.parts.model if plain or self.engine is None else cast(torch.nn.Module, self.engine)

    def matched_passes(self, n: int) -> int:
        # ZeRO communicates inside forward and backward: every rank runs the global maximum of passes.
        return _global_max(n, self.engine.device)

    def backward(self, losses: Iterable[torch.Tensor]) -> None:
        world = float(dist.get_world_size())
        for loss in losses:
            self.engine.backward(loss * world, scale_wrt_gas=False)

    def apply_gradient(self, total: torch.Tensor) -> None:
        """`total` [P] is identical on every rank: hand it to the engine as the gradient of
        the linear surrogate Σ_p <p, g_p> (DeepSpeed's average over ranks keeps it); ZeRO
        reduces, clips and steps as usual."""
        params = self.parts.params
        sizes = [p.numel() for p in params]
        surrogate = sum((p * g.view_as(p).to(p.dtype)).sum() for p, g in zip(params, total.split(sizes),
                                                                              strict=True))
        self.engine.backward(surrogate, scale_wrt_gas=False)

    def step(self) -> tuple[float, float, bool]:
        lr = float(self.engine.get_lr()[0])
        skipped = self.engine.skipped_steps
        self.engine.step()
        # An overflowed (fp16) or non-finite (bf16 check_grad_overflow) gradient: DeepSpeed skips the step
        # ("OVERFLOW! Skipping step") and counts it in engine.skipped_steps, which this step's delta reads.
        applied = self.engine.skipped_steps == skipped
        return lr, float(self.engine.get_global_grad_norm() or 0.0), applied

    def after_update(self) -> None:
        self._take_snapshot()

    # -- weights (ZeRO-3 keeps rank 0's gathered copy of the last step) --
    def _take_snapshot(self) -> None:
        if self.stage != 3 or self.engine is None:
            return
        import deepspeed

        # Module by module (learners/state/export.py): the transient is the largest module gathered, not the
        # model; every rank enters each gather, rank 0 alone copies to the host.
        self._snapshot = snapshot_by_module(self.parts.model, self.policy_id,
                                            lambda params: deepspeed.zero.GatheredParameters(params),
                                            copies=self.rank == 0)

    def snapshot(self) -> WeightSnapshot | None:
        if self.stage == 3 and self.engine is not None and self._snapshot is None:
            raise RuntimeError(
                f"learner rank {self.rank} holds a ZeRO-3 partition; rank 0 serves the weights"
            )
        return self._snapshot

    # -- checkpoint state (contract: learners/state/state_io.py; the engine writes
    # its own partitioned layout) --
    def save_state(self, path: str, step: int) -> None:
        """Collective: the engine writes weights (the adapter alone for LoRA), each rank's optimizer partition
        and the scheduler under `<path>/deepspeed/`; every rank writes its RNG state; all of it fsynced."""
        self.build()
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        client = {"step": step, "scheduler": self.parts.scheduler.state_dict()}
        self.engine.save_checkpoint(str(folder), tag=CHECKPOINT_TAG, client_state=client,
                                    save_latest=False, exclude_frozen_parameters=is_lora(self.parts.model))
        rng = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
        write_fsynced(folder / rng_file(self.rank), rng)
        _fsync_tree(folder / CHECKPOINT_TAG)
        dist.barrier()

    def load_state(self, path: str) -> int:
        self.build()
        folder = Path(path)
        if not (folder / CHECKPOINT_TAG).is_dir():
            raise StateError(f"checkpoint folder missing: {folder / CHECKPOINT_TAG}")
        loaded, client = self.engine.load_checkpoint(str(folder), tag=CHECKPOINT_TAG,
                                                     load_module_strict=not is_lora(self.parts.model))
        if loaded is None:
            raise StateError(f"checkpoint unreadable: {folder / CHECKPOINT_TAG}")
        self.parts.scheduler.load_state_dict(client["scheduler"])
        rng = read_state(folder / rng_file(self.rank))
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        self._take_snapshot()
        return int(client["step"])


    # -- rollout.layout=colocated: the engine's own offload (ZeRO-1/2: stage_1_and_2.offload_states; ZeRO-3:
    # stage3.offload_states). Every state the ZeRO optimizer owns goes (fp32 master weights, optimizer
    # states, the gradient buffers) but the bf16 module weights, which the sync after the update reads.
    def offload_states(self) -> float:
        if self.engine is None:  # not built yet: no ZeRO state exists to move
            return 0.0
        from deepspeed.runtime.zero.offload_config import OffloadDeviceEnum, OffloadStateTypeEnum

        keep = {OffloadStateTypeEnum.lp_params}
        before = _device_bytes()
        self.engine.offload_states(include=[s for s in OffloadStateTypeEnum if s not in keep],
                                   device=OffloadDeviceEnum.cpu, pin_memory=torch.cuda.is_available())
        return float(before - _device_bytes())

    def reload_states(self) -> float:
        if self.engine is None:
            return 0.0
        before = _device_bytes()
        self.engine.reload_states()
        return float(_device_bytes() - before)

def _global_max(n: int, device: torch.device) -> int:
    t = torch.tensor([n], dtype=torch.long, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def _fsync_tree(folder: Path) -> None:
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        with open(file, "rb") as f:
            os.fsync(f.fileno())


def _device_bytes() -> int:
    """The device memory this process's tensors hold (0 on CPU, where DeepSpeed's moves are host to host)."""
    return int(torch.cuda.memory_allocated()) if torch.cuda.is_available() else 0
