"""DeepSpeed learner rank (`learner.backend=deepspeed`): the Learner interface trained by a DeepSpeed engine.

The only module importing deepspeed, and only when a rank builds its engine. Loss, metrics, reference model,
weight views, export and the loop over a training step's optimizer steps (Learner.update) come from Learner;
this class changes how gradients are reduced and applied:
- Learner's torch AdamW is handed to `deepspeed.initialize`, which partitions its state over the ranks
  (ZeRO-2: optimizer states and gradients; ZeRO-3: the weights too) and steps it once per optimizer step
  (`managed_gradient_accumulation=False`: one `engine.step()` closes one accumulation window, whatever the
  number of micro-batches), with DeepSpeed's global-norm clipping. Learner's warmup/cosine LambdaLR stays
  outside the engine (it advances per training step or per optimizer step) and travels in the checkpoint's
  client state.
- The engine runs on the torch.distributed group the ranks joined through cluster.collective (gloo on CPU,
  nccl on GPU); a lone rank makes a one-member group of its own.
- The caller's global normaliser already makes micro-batch losses sum to the batch loss, so nothing is
  divided by accumulation steps (`scale_wrt_gas=False`); DeepSpeed averages gradients over ranks where the
  normaliser wants their sum, so each rank's loss is multiplied by the world size.
- Every rank runs the same number of forward/backward passes (ZeRO communicates inside them): shards with
  fewer micro-batches run zero-loss passes on one pad token.

Per-role gradients under ZeRO-2 (weights are whole on every rank): each role's gradient is taken by Learner's
own `_role_gradients` (torch.autograd.grad through the plain module, outside the engine's reduction hooks,
summed over ranks into one [roles × params] buffer), and handed to the engine as the gradient of the linear surrogate
Σ_p <p, g_p>; the step still goes through ZeRO's reduction, clipping and partitioned optimizer. Under ZeRO-3
the weights exist only inside forward, so no per-role buffer is built: grad/role_norm, grad/norm_share,
grad/dominance and grad/cos are not reported; every other metric (grad/mass_share, the per-role entropy,
KL, clip fraction) is. ZeRO-3 gathers the full weights once per training step on every rank (rank 0 keeps a copy
for get_weights/export, which the driver calls on rank 0 alone).
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM, AutoTokenizer

from cluster import collective
from learners.batch import TrainBatch
from learners.checkpoint import StateError, read_state, rng_file, write_fsynced
from learners.learner import Learner
from learners.member import LearnerSpec
from learners.weights import DTYPES, adapter_payload, is_lora, merge_for_serving

CHECKPOINT_TAG = "deepspeed"
_JOIN_TIMEOUT_S = 300.0


def deepspeed_config(learner: Any, dtype: str) -> dict[str, Any]:
    """The engine's config from the learner section (`learner.deepspeed.*`, micro-batch, clipping) and dtype."""
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
        # The optimizer is Learner's torch AdamW (also when offloaded), so both backends step alike.
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 2**31 - 1,
    }


class DeepSpeedLearner(Learner):
    def __init__(self, spec: LearnerSpec, rank: int = 0):
        super().__init__(spec, rank)
        self.engine: Any = None
        self.stage = spec.learner.deepspeed.zero_stage
        self._snapshot: dict[str, Any] | None = None  # ZeRO-3, rank 0: gathered weights of the last step
        self.pad_id = 0  # a token id for idle passes; the batch's own once one arrives

    # -- process group and engine --
    def join(self, backend: str, host: str, port: int, rank: int, world: int, timeout_s: float) -> None:
        super().join("nccl" if torch.cuda.is_available() else backend, host, port, rank, world, timeout_s)
        self._ensure_engine()

    def _ensure_engine(self) -> None:
        """Build the engine on first use (after `join`, or on a one-member group of this rank's own)."""
        if self.engine is not None:
            return
        if not dist.is_initialized():
            host, port = collective.rendezvous_address()
            backend = "nccl" if torch.cuda.is_available() else "gloo"
            collective.join(backend, host, port, 0, 1, _JOIN_TIMEOUT_S)
        for key, value in {"RANK": dist.get_rank(), "WORLD_SIZE": dist.get_world_size(), "LOCAL_RANK": 0}.items():
            os.environ.setdefault(key, str(value))  # read by parts of DeepSpeed that never see the group
        import deepspeed

        # The shared-memory allreduce op is compiled on first use (~45 s); gloo alone serves these ranks.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        # The LR scheduler stays Learner's: it advances per training step or per optimizer step
        # (learner.optim.schedule_unit), where an engine's scheduler would advance on every engine.step().
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=self.model, optimizer=self.optimizer,
            config=deepspeed_config(self.cfg, self.dtype), dist_init_required=False,
        )
        if self.reference is not None:  # the engine moved the policy to its device; the reference follows
            self.reference.to(self.engine.device)
        self._take_snapshot()

    _autocast_bf16 = False  # bf16 weights, with fp32 partitions in ZeRO's optimizer (its `bf16` config)

    # -- how gradients are reduced and applied (the optimizer-step loop is Learner.update's) --
    @property
    def _per_role_gradients(self) -> bool:  # type: ignore[override]
        return self.stage == 2

    @property
    def _device(self) -> torch.device:  # type: ignore[override]
        return self.engine.device

    def _prepare(self, data: TrainBatch) -> TrainBatch:
        self._ensure_engine()
        self.pad_id = data.pad_id
        return data.to(self.engine.device)

    def _after_update(self) -> None:
        self._take_snapshot()

    def _matched_passes(self, n: int) -> int:
        # ZeRO communicates inside forward and backward: every rank runs the global maximum of passes.
        return _global_max(n, self.engine.device)

    def _idle_pass(self) -> None:
        with torch.no_grad():
            self._idle_loss(self.pad_id)

    def _backward(self, data: TrainBatch, normalizer: float, sums: dict[str, float]) -> None:
        micro = data.micro_batches(self.cfg.micro_batch_size) if len(data) else []
        world = float(dist.get_world_size())
        for i in range(max(self._matched_passes(len(micro)), 1)):
            loss = self._micro_step(micro[i], normalizer, sums) if i < len(micro) else self._idle_loss(self.pad_id)
            self.engine.backward(loss * world, scale_wrt_gas=False)

    def _apply_gradient(self, total: torch.Tensor) -> None:
        """`total` [P] is identical on every rank: hand it to the engine as the gradient of the linear surrogate
        Σ_p <p, g_p> (DeepSpeed's average over ranks keeps it); ZeRO reduces, clips and steps as usual."""
        sizes = [p.numel() for p in self.params]
        surrogate = sum((p * g.view_as(p).to(p.dtype)).sum() for p, g in zip(self.params, total.split(sizes),
                                                                              strict=True))
        self.engine.backward(surrogate, scale_wrt_gas=False)

    def _current_lr(self) -> float:
        return float(self.engine.get_lr()[0])

    def _clip_and_step(self) -> float:
        self.engine.step()
        return float(self.engine.get_global_grad_norm() or 0.0)

    def _forward(self, mb: TrainBatch, plain: bool = False, keep: int = 0) -> torch.Tensor:
        runner = self.model if plain or self.engine is None else self.engine
        return runner(input_ids=mb.input_ids, attention_mask=mb.attention_mask, logits_to_keep=keep).logits

    def _idle_loss(self, pad_id: int) -> torch.Tensor:
        """A zero loss whose graph reaches every weight: this rank's share of a pass it has no rows for."""
        ids = torch.full((1, 1), pad_id, dtype=torch.long, device=self.engine.device)
        return self.engine(input_ids=ids, attention_mask=torch.ones_like(ids, dtype=torch.bool)).logits.sum() * 0.0

    # -- weights (ZeRO-3 keeps rank 0's gathered copy of the last step) --
    def _take_snapshot(self) -> None:
        if self.stage != 3 or self.engine is None:
            return
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(self.model.parameters())):
            if self.rank == 0:
                lora = is_lora(self.model)
                merged, rounding = merge_for_serving(self.model)
                self._snapshot = {
                    "merged": {k: v.detach().cpu().clone() for k, v in merged.items()}, "merge_rounding": rounding,
                    "adapter": adapter_payload(self.model, self.policy_id) if lora else None,
                    "lora_state": {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()
                                   if "lora_" in k} if lora else None,
                }

    def get_weights(self) -> dict[str, torch.Tensor]:
        self._check_serves_weights()
        if not self._snapshot:
            return super().get_weights()
        self.merge_rounding = self._snapshot["merge_rounding"]
        return self._snapshot["merged"]

    def get_adapter(self) -> dict[str, Any]:
        self._check_serves_weights()
        return self._snapshot["adapter"] if self._snapshot else super().get_adapter()

    def _check_serves_weights(self) -> None:
        if self.stage == 3 and self.engine is not None and self._snapshot is None:
            raise RuntimeError(f"learner rank {self.rank} holds a ZeRO-3 partition; rank 0 serves the weights")

    def export(self, out_dir: str) -> str:
        self._check_serves_weights()
        if not self._snapshot:
            return super().export(out_dir)
        plain = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=DTYPES[self.dtype])
        plain.load_state_dict(self._snapshot["merged"], strict=False)
        plain.save_pretrained(out_dir)
        AutoTokenizer.from_pretrained(self.model_path).save_pretrained(out_dir)
        if self._snapshot["lora_state"] is not None:
            self.model.save_pretrained(f"{out_dir}/adapter", state_dict=self._snapshot["lora_state"])
        return out_dir

    # -- checkpoint state (contract: learners/checkpoint.py; the engine writes its own partitioned layout) --
    def save_state(self, path: str) -> None:
        """Collective: the engine writes weights (the adapter alone for LoRA), each rank's optimizer partition
        and the scheduler under `<path>/deepspeed/`; every rank writes its RNG state; all of it fsynced."""
        self._ensure_engine()
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        client = {"step": self.step, "scheduler": self.scheduler.state_dict()}
        self.engine.save_checkpoint(str(folder), tag=CHECKPOINT_TAG, client_state=client,
                                    save_latest=False, exclude_frozen_parameters=is_lora(self.model))
        rng = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
        write_fsynced(folder / rng_file(self.rank), rng)
        _fsync_tree(folder / CHECKPOINT_TAG)
        dist.barrier()

    def load_state(self, path: str) -> None:
        self._ensure_engine()
        folder = Path(path)
        if not (folder / CHECKPOINT_TAG).is_dir():
            raise StateError(f"checkpoint folder missing: {folder / CHECKPOINT_TAG}")
        loaded, client = self.engine.load_checkpoint(str(folder), tag=CHECKPOINT_TAG,
                                                     load_module_strict=not is_lora(self.model))
        if loaded is None:
            raise StateError(f"checkpoint unreadable: {folder / CHECKPOINT_TAG}")
        self.step = int(client["step"])
        self.scheduler.load_state_dict(client["scheduler"])
        rng = read_state(folder / rng_file(self.rank))
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        self._take_snapshot()


def _global_max(n: int, device: torch.device) -> int:
    t = torch.tensor([n], dtype=torch.long, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def _fsync_tree(folder: Path) -> None:
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        with open(file, "rb") as f:
            os.fsync(f.fileno())

