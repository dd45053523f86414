"""NCCL weight transport: learner rank 0 broadcasts bucketed weights to every engine over a process group of
their own, with the same contract as cluster.transport.broadcast (versions and fingerprints verified).

The channel is a c10d backend built directly on a TCPStore (torch's ProcessGroupNCCL, or ProcessGroupGloo
for CPU tests), not torch.distributed's default group: learners keep theirs for data parallelism and vLLM
keeps its own. Calls go to the backend object, so ranks are the channel's own (sender 0, engines 1..N).

Tensors travel as raw bytes packed into flat uint8 buckets of at most `bucket_bytes` (a larger tensor gets a
bucket of its own): one collective per bucket, whatever the dtypes. The sender puts the layout (names,
shapes, dtypes) in the store under the version, so receivers need no extra round trip through the driver.

The sender satisfies `WeightSender`, every receiver `WeightReceiver`.
"""

from __future__ import annotations

import datetime
import pickle
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist

from cluster.member import Call

if TYPE_CHECKING:  # the member side (WeightChannel) runs in processes that need no Ray import
    from cluster.group import Group

ALIGN = 16  # every tensor starts on a 16-byte boundary of its bucket, so a byte slice views as any dtype


@dataclass(frozen=True)
class Slot:
    """Where one tensor lies in its bucket."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # torch dtype name, e.g. "float32"
    offset: int
    nbytes: int


class WeightSender(Protocol):
    """The sending member (a learner's rank 0): opens the channel as rank 0 and sends its weights."""

    def rendezvous_address(self) -> tuple[str, int]: ...

    def nccl_join(self, host: str, port: int, rank: int, world_size: int, timeout_s: float, backend: str,
                  /) -> None: ...

    def nccl_send(self, version: int, bucket_bytes: int,
                  fingerprint: Callable[[Mapping[str, Any]], float], /) -> dict[str, float]:
        """Send the weights; returns {"fingerprint": fingerprint(weights sent), "bytes"}."""
        ...


class WeightReceiver(Protocol):
    """A receiving member (an engine): joins the channel and serves what arrives."""

    def nccl_join(self, host: str, port: int, rank: int, world_size: int, timeout_s: float, backend: str,
                  /) -> None: ...

    def nccl_receive(self, version: int, bucket_bytes: int, /) -> dict[str, float]:
        """Receive one broadcast and serve it; returns {"version", "bytes",
        "fingerprint"} of what it serves."""
        ...


def plan_buckets(
    layout: Sequence[tuple[str, tuple[int, ...], str, int]], bucket_bytes: int
) -> list[list[Slot]]:
    """Pack (name, shape, dtype, nbytes) entries, in order, into buckets of at most `bucket_bytes`."""
    buckets: list[list[Slot]] = [[]]
    used = 0
    for name, shape, dtype, nbytes in layout:
        start = -(-used // ALIGN) * ALIGN
        if buckets[-1] and start + nbytes > bucket_bytes:
            buckets.append([])
            start = 0
        buckets[-1].append(Slot(name, tuple(shape), dtype, start, nbytes))
        used = start + nbytes
    return [b for b in buckets if b]


def bucket_size(bucket: list[Slot]) -> int:
    return bucket[-1].offset + bucket[-1].nbytes


def layout_of(weights: dict[str, torch.Tensor]) -> list[tuple[str, tuple[int, ...], str, int]]:
    return [(n, tuple(t.shape), str(t.dtype).removeprefix("torch."), t.numel() * t.element_size())
            for n, t in weights.items()]


class WeightChannel:
    """One member's end of the channel. Rank 0 sends; every other rank receives."""

    def __init__(
        self, host: str, port: int, rank: int, world_size: int, timeout_s: float, backend: str = "nccl"
    ):
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout)
        self.store = dist.PrefixStore("marl/weights", store)
        self.rank = rank
        # torch's stubs give the two backends no common type with `broadcast`; both have it.
        self.backend: Any
        if backend == "nccl":
            self.device = torch.device("cuda", torch.cuda.current_device())
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            self.backend = dist.ProcessGroupNCCL(self.store, rank, world_size, options)
        else:
            self.device = torch.device("cpu")
            self.backend = dist.ProcessGroupGloo(self.store, rank, world_size, timeout)

    def _broadcast(self, buffer: torch.Tensor) -> None:
        options = dist.BroadcastOptions()
        options.rootRank = 0
        self.backend.broadcast([buffer], options).wait()

    def send(self, weights: dict[str, torch.Tensor], version: int, bucket_bytes: int) -> int:
        layout = layout_of(weights)
        # bytes are stored as-is
        self.store.set(f"layout/{version}", pickle.dumps(layout))  # type: ignore[arg-type]
        for bucket in plan_buckets(layout, bucket_bytes):
            buffer = torch.empty(bucket_size(bucket), dtype=torch.uint8, device=self.device)
            for slot in bucket:
                flat = weights[slot.name].detach().contiguous().reshape(-1).view(torch.uint8)
                buffer[slot.offset:slot.offset + slot.nbytes].copy_(flat)
            self._broadcast(buffer)
        return sum(entry[3] for entry in layout)

    def receive(self, version: int, bucket_bytes: int) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, tensor) pairs on this member's device, as each bucket arrives (views into the bucket)."""
        layout = pickle.loads(self.store.get(f"layout/{version}"))
        for bucket in plan_buckets(layout, bucket_bytes):
            buffer = torch.empty(bucket_size(bucket), dtype=torch.uint8, device=self.device)
            self._broadcast(buffer)
            for slot in bucket:
                raw = buffer[slot.offset:slot.offset + slot.nbytes]
                yield slot.name, raw.view(getattr(torch, slot.dtype)).reshape(slot.shape)


def form_channel(src: Group[WeightSender], dsts: Sequence[Group[WeightReceiver]], timeout: float,
                 backend: str) -> int:
    """Form the channel once: src member 0 is rank 0, the destinations' members follow in order, every one on
    the c10d `backend` the caller decided once for all of them (jobs/config/gpu_rules.channel_backend: no end
    re-derives it from its own device). Returns the world size."""
    deadline = time.monotonic() + timeout
    host, port = src.submit_to([0], WeightSender.rendezvous_address).result(timeout)[0]
    world = 1 + sum(d.size for d in dsts)
    joins = [src.submit_to([0], WeightSender.nccl_join, host, port, 0, world, timeout, backend)]
    rank = 1
    for dst in dsts:
        joins.append(dst.submit_each([
            Call(WeightReceiver.nccl_join, host, port, rank + i, world, timeout, backend)
            for i in range(dst.size)]))
        rank += dst.size
    for pending in joins:
        pending.result(max(deadline - time.monotonic(), 0.01))
    return world


def broadcast_nccl(
    src: Group[WeightSender],
    dsts: Sequence[Group[WeightReceiver]],
    version: int,
    timeout: float,
    fingerprint: Callable[[Mapping[str, Any]], float],
    bucket_bytes: int,
) -> dict[str, float]:
    """cluster.transport.broadcast over a channel formed by `form_channel`: every member of `dsts` receives
    src member 0's weights as `version` and must report that version and the sender's fingerprint."""
    t0 = time.perf_counter()
    deadline = time.monotonic() + timeout
    sent = src.submit_to([0], WeightSender.nccl_send, version, bucket_bytes, fingerprint)
    pendings = [(dst, dst.submit(WeightReceiver.nccl_receive, version, bucket_bytes)) for dst in dsts]
    expected = sent.result(timeout)[0]["fingerprint"]
    from cluster.transport import collect_reports  # driver side only: it imports Ray

    moved, verified = collect_reports(pendings, version, expected, deadline)
    return {"sync_s": time.perf_counter() - t0, "bytes": float(moved), "verified": float(verified)}
