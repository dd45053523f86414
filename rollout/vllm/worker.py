"""vLLM's weight-transfer engines (vllm/distributed/weight_transfer/), with the project's check on top: the
worker side of cluster.weight_transfer. Imported by vLLM inside its worker (`worker_extension_cls`), which
registers the two engines before the worker builds its `weight_transfer_config` engine; the adapter
(rollout/vllm/engine.py) drives them through vLLM's own worker methods (`init_weight_transfer_engine`,
`start_weight_update`, `update_weights`, `finish_weight_update`) and reads the report through
`WeightTransferExtension`.

What the subclasses change of vLLM's engines: each bucket goes to a rollout.vllm.receive.BucketLoader, which
loads it and keeps only its fingerprint terms and checked sketches (the bucket itself is dropped before the
next one); after the last bucket the served tensors are read back against them. Loads are in place where the
model's loaders copy in place (CUDA, unquantized: what verl and OpenRLHF do), else inside vLLM's layerwise
reload (its engines' own path; also the CPU's, whose GEMM handles own packed copies). The NCCL engine also
runs its group over gloo (cluster.buckets.GlooGroup, same bucket rule) for the CPU tests; a second init aborts
the group it replaces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
from vllm.distributed.weight_transfer.ipc_engine import IPCWeightTransferEngine, IPCWeightTransferUpdateInfo
from vllm.distributed.weight_transfer.nccl_common import NCCLWeightTransferInitInfo
from vllm.distributed.weight_transfer.nccl_engine import (
    NCCLWeightTransferEngine,
    NCCLWeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.packed_tensor import packed_ipc_consumer, packed_nccl_broadcast_consumer

from cluster import buckets
from rollout.vllm.receive import TRANSFER_BACKENDS, Bucket, BucketLoader


@dataclass(kw_only=True)
class ChannelInitInfo(NCCLWeightTransferInitInfo):
    """vLLM's NCCL init info, and what the project adds: the c10d backend the driver chose for every end
    (gloo in CPU tests), the join deadline, and whether loads go in place."""

    backend: str = "nccl"
    timeout_s: float = 300.0
    in_place: bool = True


class _Checked:
    """What both engines add to vLLM's: a BucketLoader per update, in place or inside the layerwise reload."""

    model: torch.nn.Module
    device: torch.device
    loader: BucketLoader | None = None
    in_place = True
    report: dict[str, Any] | None = None

    def _layerwise(self) -> bool:
        return not (self.in_place and torch.cuda.is_available() and _unquantized(self.model))

    def _start(self) -> None:
        self.loader = BucketLoader(self.model, self._load, self.device)
        self.report = None

    def _load(self, bucket: Bucket) -> None:
        self.model.load_weights(bucket)  # type: ignore[operator]

    def update_weights(self, update_info: dict[str, Any]) -> None:
        """vLLM's, but the device sync only where there is a device (the gloo path runs on CPU)."""
        self.receive_weights(self.parse_update_info(update_info))  # type: ignore[attr-defined]
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def _finish(self) -> None:
        assert self.loader is not None, "finish_weight_update before start_weight_update"
        self.report, self.loader = self.loader.report(), None


class CheckedNcclEngine(_Checked, NCCLWeightTransferEngine):
    init_info_cls = ChannelInitInfo

    def init_transfer_engine(self, init_info: ChannelInitInfo) -> None:  # type: ignore[override]
        self.shutdown()  # a re-formed channel: the old group is aborted, never left waiting
        self.in_place = init_info.in_place
        self.channel_backend = init_info.backend
        if init_info.backend == "nccl":
            super().init_transfer_engine(init_info)
            return
        self.packed, self.packed_buffer_size_bytes = True, init_info.packed_buffer_size_bytes
        assert init_info.master_address is not None and init_info.master_port is not None
        rank = init_info.rank_offset + self.parallel_config.rank
        self.model_update_group = buckets.GlooGroup(  # type: ignore[assignment]
            init_info.master_address, init_info.master_port, rank, init_info.world_size, init_info.timeout_s)

    def start_weight_update(self) -> None:
        self._start()
        if self._layerwise():
            super().start_weight_update()

    def receive_weights(self, update_info: NCCLWeightTransferUpdateInfo) -> None:
        if self.model_update_group is None:
            raise RuntimeError("weight channel: update before init_weight_transfer_engine")
        assert self.loader is not None, "update_weights before start_weight_update"
        metas = [buckets.Meta(n, tuple(s), d) for n, d, s in
                 zip(update_info.names, update_info.dtype_names, update_info.shapes, strict=True)]
        if self.channel_backend != "nccl":
            buckets.receive(metas, self.model_update_group, self.packed_buffer_size_bytes, self.device,
                            self.loader)
            return
        packed_nccl_broadcast_consumer(
            iterator=((m.name, (list(m.shape), getattr(torch, m.dtype))) for m in metas),
            group=self.model_update_group, src=0, post_unpack_func=self.loader,
            buffer_size_bytes=self.packed_buffer_size_bytes, num_buffers=self.packed_num_buffers,
            device=self.device)

    def finish_weight_update(self) -> None:
        if self._layerwise():
            super().finish_weight_update()
        self._finish()


class CheckedIpcEngine(_Checked, IPCWeightTransferEngine):
    def start_weight_update(self) -> None:
        self._start()
        if self._layerwise():
            super().start_weight_update()

    def receive_weights(self, update_info: IPCWeightTransferUpdateInfo) -> None:
        assert self.loader is not None, "update_weights before start_weight_update"
        assert isinstance(update_info.ipc_handles, dict) and update_info.tensor_sizes is not None
        self.loader(packed_ipc_consumer(
            ipc_handle=update_info.ipc_handles, names=update_info.names, shapes=update_info.shapes,
            dtype_names=update_info.dtype_names, tensor_sizes=update_info.tensor_sizes,
            device_index=self.device.index or 0, importer=self._packed_importer))

    def finish_weight_update(self) -> None:
        if self._layerwise():
            super().finish_weight_update()
        else:
            self._packed_importer.close()  # the sender's buffer is released once per update
        self._finish()


def _unquantized(model: torch.nn.Module) -> bool:
    from rollout.vllm.engine import vllm_kernels
    from rollout.vllm.repack import unquantized

    return unquantized(model, vllm_kernels())


class WeightTransferExtension:
    """Mixed into vLLM's Worker class (`self` is the worker): the report of the last update."""

    def weight_transfer_report(self) -> dict[str, Any]:
        engine = getattr(self, "weight_transfer_engine", None)
        report = getattr(engine, "report", None)
        if report is None:
            raise RuntimeError("weight transfer: no finished update to report")
        return report


for _name, _cls in ((TRANSFER_BACKENDS["nccl"], CheckedNcclEngine),
                    (TRANSFER_BACKENDS["ipc"], CheckedIpcEngine)):
    if _name not in WeightTransferEngineFactory._registry:  # a second import (a new engine) registers nothing
        WeightTransferEngineFactory.register_engine(_name, _cls)
