"""WeightServer: the part of a learner rank that hands its policy's weights out, composed
into learners.learner.Learner.

What it serves: the weights engines serve (LoRA merged into the serving dtype), in one byte buffer for the
object store, bucketed over vLLM's weight transfer (rank 0 over NCCL, every rank over CUDA IPC to the engine
on its GPU: cluster.weight_transfer, streamed module by module from device memory), the LoRA adapter alone
(multi-LoRA serving), an
adapter delta with the names of the served weights (adapter-only syncs of merged serving), the probe sketch of
the merge each engine must serve after such a delta, and an HF folder of the current weights. It keeps what
serving needs between syncs (the served names, the frozen base's sketches) and what the weights last handed
out lost to the serving dtype (`sync/merge_rounding/<policy>`). It reads the module and, when the module holds
only a partition (ZeRO-3), the backend's snapshot; it never changes either.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from cluster.buckets import meta_of
from cluster.packing import PackedTensors, pack, share
from cluster.payloads import AdapterPayload, LoraDelta
from cluster.sketch import sketch
from cluster.weight_transfer import IpcSender, Layout, SendChannel
from learners.gradients.backends import GradientBackend
from learners.state.export import serving_layout, serving_tensors
from learners.state.weights import MergedSketch, export_hf, serving_adapter, serving_weights, update_lost
from marl.dtypes import DTYPES


class WeightServer:
    """Serves policy `policy_id`'s `model`, loaded from `model_path`, in dtype `dtype`; `backend.snapshot()`
    is the weights the rank's gradient backend gathered, or None when the module itself holds them whole."""

    def __init__(self, model: torch.nn.Module, policy_id: str, model_path: str, dtype: str,
                 backend: GradientBackend):
        self.model, self.policy_id, self.model_path, self.dtype = model, policy_id, model_path, dtype
        self.backend = backend
        # What the weights last handed out lost to the serving dtype (None: nothing merged, or fp32 serving).
        self.merge_rounding: float | None = None
        # fixed by the model's structure: merged once, on the first delta
        self.served_names: list[str] | None = None
        self.sketcher = MergedSketch()  # keeps the frozen base's sketches between syncs
        self.channel: SendChannel | None = None  # rank 0's channel to its engines, once joined
        self.ipc: IpcSender | None = None  # a colocated sync in progress

    def get_weights(self) -> dict[str, torch.Tensor]:
        """Host tensors: the object store and the engines' loaders take CPU memory, whatever the learner's
        device (a no-op on a CPU learner; the NCCL and IPC syncs send device tensors: `_stream`)."""
        merged, self.merge_rounding = serving_weights(self.model, DTYPES[self.dtype], self.backend.snapshot())
        return merged

    def sync_metrics(self) -> dict[str, float]:
        """What the weights last handed out by get_weights lost: with LoRA merged into the serving dtype,
        `sync/merge_rounding/<policy>` (learners.state.weights.update_lost); nothing for full weights."""
        rounding = self.merge_rounding
        return {} if rounding is None else {f"sync/merge_rounding/{self.policy_id}": rounding}

    def get_packed_weights(self) -> PackedTensors:
        """`get_weights` as the wire format's buffers, each host tensor's own bytes (cluster.packing.share):
        what a sync through the object store sends. Ray copies them into the store once, straight from the
        served tensors (a pack into one buffer first would copy every byte twice), and engines read them
        zero-copy; a dict would be pickled tensor by tensor and copied on both sides."""
        return share(self.get_weights())

    def get_lora_delta(self) -> LoraDelta:
        """Merged serving with adapter-only syncs: the adapter and the names of the weights the engines serve.
        What they must serve (`merged_sketch`) is asked for after, so engines start loading first."""
        if self.served_names is None:
            self.served_names = list(self.get_weights())
        return LoraDelta(self.get_adapter(), self.served_names)

    def merged_sketch(self) -> PackedTensors:
        """The probe sketch (cluster.sketch) of the merged weights each engine must serve after merging the
        adapter into its own base, taken without merging (learners.state.weights.MergedSketch; a ZeRO-3
        rank reads its snapshot, merged already). Served in a dtype that rounds (bf16), the merge still
        runs, for `sync/merge_rounding`;
        fp32 serving skips it (its rounding is fp32's own, ~1e-7 of the weights) and reports none."""
        snapshot = self.backend.snapshot()
        if snapshot is not None:
            self.merge_rounding = snapshot.merge_rounding
            return pack({name: sketch(name, tensor) for name, tensor in snapshot.merged.items()})
        if DTYPES[self.dtype] != torch.float32:
            self.get_weights()  # sets merge_rounding
        else:
            self.merge_rounding = None
        return pack(self.sketcher(self.model))  # one buffer back to the driver, not a pickle per sketch

    def get_adapter(self) -> AdapterPayload:
        """The LoRA adapter alone (multi-LoRA serving: engines keep the base and load adapters)."""
        return serving_adapter(self.model, self.policy_id, self.backend.snapshot())

    def nccl_join(self, host: str, port: int, world_size: int, timeout_s: float, backend: str,
                  bucket_bytes: int) -> None:
        """Rank 0 opens the weight channel to its engines (cluster.weight_transfer); called again after an
        engine was replaced (a channel's members are fixed), which aborts the old one first."""
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        self.channel = SendChannel(host, port, world_size, timeout_s, backend, bucket_bytes)

    def weight_layout(self) -> Layout:
        """What `nccl_send` and the IPC sync send, in order, without gathering or merging."""
        snapshot = self.backend.snapshot()
        if snapshot is not None:
            return [meta_of(n, t) for n, t in snapshot.merged.items()]
        return serving_layout(self.model, DTYPES[self.dtype])

    def nccl_send(self, version: int) -> dict[str, float]:
        """The served weights broadcast over the channel (as `version`): {"fingerprint", "bytes"}."""
        if self.channel is None:
            raise RuntimeError(
                f"learner {self.policy_id}: nccl_send before nccl_join opened the weight channel"
            )
        return self.channel.send(self._stream(), self.weight_layout())

    def ipc_open(self, bucket_bytes: int) -> None:
        self.ipc = IpcSender(self._stream(), bucket_bytes, self._device())

    def ipc_next(self) -> dict[str, Any] | None:
        if self.ipc is None:
            raise RuntimeError(f"learner {self.policy_id}: ipc_next before ipc_open")
        return self.ipc.next()

    def ipc_close(self) -> dict[str, float]:
        if self.ipc is None:
            raise RuntimeError(f"learner {self.policy_id}: ipc_close before ipc_open")
        out, self.ipc = self.ipc.close(), None
        return out

    def _stream(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The served weights one module at a time, on the learner's device (a ZeRO-3 rank 0: from its host
        snapshot, moved to the device as each bucket is packed); sets merge_rounding at the end."""
        snapshot = self.backend.snapshot()
        if snapshot is not None:
            yield from snapshot.merged.items()
            self.merge_rounding = snapshot.merge_rounding
            return
        norms: list[torch.Tensor] = []
        yield from serving_tensors(self.model, DTYPES[self.dtype], norms=norms)
        if norms:
            error_sq, delta_sq = torch.stack(norms).sum(0).tolist()
            self.merge_rounding = update_lost(error_sq, delta_sq)

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    def export(self, out_dir: str) -> str:
        """An HF model folder of the current weights (and the adapter, for LoRA); returns the folder."""
        export_hf(self.model, self.model_path, self.dtype, out_dir, self.backend.snapshot())
        return out_dir
