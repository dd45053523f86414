"""Weights in flat byte buckets, laid out as vLLM 0.32's packed weight transfer lays them out
(vllm/distributed/weight_transfer/packed_tensor.py), in torch alone: the c10d path that CPU tests run (gloo),
the CUDA IPC producer the colocated sync sends with, and the GPU check (benchmarks/gpu_questions.py), none of
which may need vLLM to import.

Two bucket rules, each the one vLLM's consumer of that transport expects:
- broadcast (NCCL, gloo): tensors join a bucket in order until its bytes *exceed* the bucket size; the tensor
  that crosses the bound is the bucket's last (`plan`, vLLM's `packed_nccl_broadcast_consumer`). Both ends cut
  the stream from the same layout, so no offsets travel.
- IPC: one device buffer of exactly the bucket size, exported once; a bucket is flushed *before* a tensor
  would overflow it, and a tensor larger than the buffer is an error (vLLM's `packed_ipc_producer`).

Tensors travel as their raw bytes (`.view(torch.uint8)`), concatenated without padding, whatever their dtypes.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, cast

import torch
import torch.distributed as dist

Pairs = Iterable[tuple[str, torch.Tensor]]
Load = Callable[[list[tuple[str, torch.Tensor]]], None]  # one bucket's (name, view) pairs, loaded at once


@dataclass(frozen=True)
class Meta:
    """One tensor of the stream, as both ends know it before any byte moves."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # torch dtype name, e.g. "bfloat16"

    @property
    def nbytes(self) -> int:
        return int(math.prod(self.shape) * getattr(torch, self.dtype).itemsize)


def meta_of(name: str, tensor: torch.Tensor) -> Meta:
    return Meta(name, tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."))


def plan(metas: Iterable[Meta], bucket_bytes: int) -> list[list[Meta]]:
    """The broadcast buckets of `metas`, in order: each closes with the tensor that takes it past
    `bucket_bytes` (an oversized tensor closes the bucket it starts)."""
    buckets: list[list[Meta]] = [[]]
    used = 0
    for meta in metas:
        if used > bucket_bytes:
            buckets.append([])
            used = 0
        buckets[-1].append(meta)
        used += meta.nbytes
    return [b for b in buckets if b]


def flat(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes, [nbytes] uint8 (a copy only when it is not contiguous)."""
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def unpack(buffer: torch.Tensor, metas: list[Meta]) -> list[tuple[str, torch.Tensor]]:
    """(name, view into `buffer`) for each tensor of one bucket."""
    parts = torch.split(buffer[: sum(m.nbytes for m in metas)], [m.nbytes for m in metas])
    return [(m.name, _aligned(p, getattr(torch, m.dtype)).view(getattr(torch, m.dtype)).view(m.shape))
            for m, p in zip(metas, parts, strict=True)]


def _aligned(raw: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`raw` where a `dtype` view of it may start: buckets carry no padding, so a tensor after an odd-sized
    one (a 6-byte fp16 vector before fp32 weights) is copied once to a fresh, aligned buffer."""
    return raw.clone() if raw.storage_offset() % dtype.itemsize else raw


class Broadcaster(Protocol):
    """A channel's communicator: vLLM's PyNcclCommunicator has this method, `GlooGroup` too."""

    def broadcast(self, tensor: torch.Tensor, src: int) -> Any: ...


class GlooGroup:
    """A gloo process group of its own on a TCPStore (not torch.distributed's default group, which learners
    keep for data parallelism): the CPU stand-in for vLLM's stateless NCCL group, with its `broadcast`."""

    def __init__(self, host: str, port: int, rank: int, world_size: int, timeout_s: float):
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout)
        self.group: Any = dist.ProcessGroupGloo(dist.PrefixStore("marl/weights", store), rank, world_size,
                                                timeout)
        self.closed = False

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        if self.closed:
            raise RuntimeError("weight channel: this group was aborted (the channel was formed anew)")
        options = dist.BroadcastOptions()
        options.rootRank = src
        self.group.broadcast([tensor], options).wait()

    def destroy(self) -> None:
        """Abort: a member still blocked in this group fails instead of waiting for a peer that left."""
        self.closed = True
        abort = getattr(self.group, "abort", None)
        if callable(abort):
            abort()


def send(pairs: Pairs, group: Broadcaster, bucket_bytes: int, device: torch.device) -> int:
    """Broadcast `pairs` from rank 0 bucket by bucket (`plan`'s rule), each tensor moved to `device` as its
    bucket is packed; returns the bytes sent. One bucket is alive at a time."""
    sent, parts, used = 0, [], 0
    for _, tensor in pairs:
        parts.append(flat(tensor.to(device, non_blocking=True)))
        used += parts[-1].numel()
        if used > bucket_bytes:
            sent += _flush(parts, group)
            parts, used = [], 0
    return sent + (_flush(parts, group) if parts else 0)


def _flush(parts: list[torch.Tensor], group: Broadcaster) -> int:
    bucket = torch.cat(parts)
    group.broadcast(bucket, src=0)
    return bucket.numel()


def receive(metas: list[Meta], group: Broadcaster, bucket_bytes: int, device: torch.device,
            load: Load) -> int:
    """The receiving end of `send`: each bucket into a fresh buffer on `device`, handed to `load` as views
    and dropped before the next one arrives (`load` keeps what it needs, not the bucket). Returns the
    bytes."""
    got = 0
    for bucket in plan(metas, bucket_bytes):
        buffer = torch.empty(sum(m.nbytes for m in bucket), dtype=torch.uint8, device=device)
        group.broadcast(buffer, src=0)
        load(unpack(buffer, bucket))
        got += buffer.numel()
        del buffer
    return got


# -- CUDA IPC: one exported buffer, reused bucket after bucket ----------------------------------------------


def device_uuid(device: torch.device) -> str:
    """The key vLLM's IPC consumer looks its handle up by: the GPU's UUID ("cpu" for the CPU stand-in)."""
    return str(torch.cuda.get_device_properties(device).uuid) if device.type == "cuda" else "cpu"


def export_buffer(buffer: torch.Tensor) -> Any:
    """What another process on the same device opens `buffer` from: on CUDA the arguments of torch's
    `rebuild_cuda_tensor` (vLLM's `ipc_handles` value); on CPU the tensor itself, in shared memory (it travels
    through torch.multiprocessing's pickler)."""
    if buffer.device.type != "cuda":
        return buffer.share_memory_()  # type: ignore[no-untyped-call]
    from torch.multiprocessing.reductions import reduce_tensor

    return reduce_tensor(buffer)[1]  # type: ignore[no-untyped-call]


def open_buffer(handle: Any, device_index: int) -> torch.Tensor:
    """The receiving end of `export_buffer` (the device index is the receiver's own)."""
    if isinstance(handle, torch.Tensor):
        return handle
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    args = list(handle)
    args[6] = device_index  # the exporter's index; the receiver may number the same GPU otherwise
    return cast(torch.Tensor, rebuild_cuda_tensor(*args))  # type: ignore[no-untyped-call]


def ipc_buckets(pairs: Pairs, bucket_bytes: int, device: torch.device
                ) -> Generator[dict[str, Any], None, None]:
    """Pack `pairs` into one reusable buffer on `device` and yield, per bucket, vLLM's packed IPC update info
    ({"names", "dtype_names", "shapes", "tensor_sizes", "ipc_handles": {uuid: handle}}). The consumer must be
    done with a bucket before the generator is resumed: the next bucket overwrites the buffer."""
    buffer = torch.empty(bucket_bytes, dtype=torch.uint8, device=device)
    handle = {device_uuid(device): export_buffer(buffer)}
    metas: list[Meta] = []
    used = 0
    for name, tensor in pairs:
        raw = flat(tensor.to(device, non_blocking=True))
        if raw.numel() > bucket_bytes:
            raise ValueError(f"weight {name}: {raw.numel()} bytes exceed sync.bucket_mb ({bucket_bytes} "
                             "bytes); the IPC buffer holds whole tensors")
        if used and used + raw.numel() > bucket_bytes:
            yield _update_info(metas, handle, device)
            metas, used = [], 0
        buffer[used : used + raw.numel()].copy_(raw)
        metas.append(meta_of(name, tensor))
        used += raw.numel()
    if metas:
        yield _update_info(metas, handle, device)


def _update_info(metas: list[Meta], handle: dict[str, Any], device: torch.device) -> dict[str, Any]:
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()  # the consumer reads on another process's stream
    return {"names": [m.name for m in metas], "dtype_names": [m.dtype for m in metas],
            "shapes": [list(m.shape) for m in metas], "tensor_sizes": [m.nbytes for m in metas],
            "ipc_handles": handle}


def open_ipc_bucket(info: dict[str, Any], device: torch.device) -> list[tuple[str, torch.Tensor]]:
    """One `ipc_buckets` bucket as (name, view) pairs in the receiving process, views of the sender's
    buffer: copy what must outlive the bucket."""
    handle = info["ipc_handles"][device_uuid(device)]
    buffer = open_buffer(handle, device.index or 0)
    metas = [Meta(n, tuple(s), d) for n, s, d in zip(info["names"], info["shapes"], info["dtype_names"],
                                                      strict=True)]
    return unpack(buffer, metas)
