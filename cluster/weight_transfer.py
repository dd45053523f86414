"""Weight sync through vLLM 0.32's weight-transfer engines (vllm/distributed/weight_transfer/): the trainer
side of them, and the driver's orchestration of both sides, with the project's versioning and verification
on top.

- `sync.transport=nccl` (engines on GPUs of their own): learner rank 0 opens vLLM's trainer endpoint (rank 0
  of a stateless NCCL group, `nccl_common.trainer_init`) and broadcasts with vLLM's packed producer
  (`packed_nccl_broadcast_producer`: double-buffered buckets on their own streams); every engine's worker
  receives with vLLM's NCCL engine (rollout/vllm/worker.py, `CheckedNcclEngine`), bucket by bucket into the
  model. On CPU the same roles run over gloo (cluster.buckets, the same bucket rule), which is what tests run.
- `sync.transport=ipc` (rollout.layout=colocated: engine i on learner rank i's GPU): every rank packs its
  device weights into one exported buffer (cluster.buckets.ipc_buckets, vLLM's packed IPC format) and the
  engine on the same GPU opens each bucket with vLLM's IPC engine (`CheckedIpcEngine`).

The driver hands each engine the layout first (names, shapes, dtypes: vLLM's update info), as vLLM's trainer
engines do through their client; then sender and receivers run together. Every engine reports the version it
serves, the fingerprint of what it received (cluster.fingerprint, taken bucket by bucket) and its own sketch
check of what it serves (rollout.vllm.readback); the sender's fingerprint must match. A channel's members are
fixed: forming it again (after an engine was replaced) aborts the old group on every member first.

vLLM is imported lazily, on the CUDA path only: this module runs on machines without it (the gloo path, the
driver).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import torch

from cluster import buckets
from cluster.buckets import Meta
from cluster.fingerprint import Running
from cluster.member import Call

if TYPE_CHECKING:  # the member side runs in processes that need no Ray import
    from cluster.group import Group

Layout = list[Meta]
Source = Callable[[], Iterator[tuple[str, torch.Tensor]]]  # a fresh pass over the weights, each call


class WeightSender(Protocol):
    """The sending member (a learner's rank 0)."""

    def rendezvous_address(self) -> tuple[str, int]: ...

    def nccl_join(self, host: str, port: int, world_size: int, timeout_s: float, backend: str,
                  bucket_bytes: int, /) -> None: ...

    def weight_layout(self) -> Layout:
        """What the next send holds, in order, without gathering anything."""
        ...

    def nccl_send(self, version: int, /) -> dict[str, float]:
        """Broadcast the weights; {"fingerprint", "bytes"} of what was sent."""
        ...

    def ipc_open(self, bucket_bytes: int, /) -> None: ...

    def ipc_next(self) -> dict[str, Any] | None:
        """The next bucket's update info (the previous bucket's buffer is reused), None after the last."""
        ...

    def ipc_close(self) -> dict[str, float]: ...


class WeightReceiver(Protocol):
    """A receiving member (an engine)."""

    def nccl_join(self, host: str, port: int, rank: int, world_size: int, timeout_s: float, backend: str,
                  bucket_bytes: int, /) -> None: ...

    def nccl_receive(self, version: int, layout: Layout, /) -> dict[str, float]:
        """Receive one broadcast into the model; {"version", "bytes", "fingerprint"} of it."""
        ...

    def ipc_start(self) -> None: ...

    def ipc_load(self, info: dict[str, Any], /) -> None: ...

    def ipc_finish(self, version: int, /) -> dict[str, float]: ...


class SendChannel:
    """Learner rank 0's end: vLLM's trainer-side NCCL endpoint and packed producer, or gloo on CPU."""

    def __init__(self, host: str, port: int, world_size: int, timeout_s: float, backend: str,
                 bucket_bytes: int):
        self.backend, self.bucket_bytes = backend, bucket_bytes
        self.group: Any
        if backend == "nccl":
            from vllm.distributed.weight_transfer.nccl_common import trainer_init

            self.device = torch.device("cuda", torch.cuda.current_device())
            self.group = trainer_init({"master_address": host, "master_port": port, "world_size": world_size})
        else:
            self.device = torch.device("cpu")
            self.group = buckets.GlooGroup(host, port, 0, world_size, timeout_s)

    def send(self, pairs: Iterator[tuple[str, torch.Tensor]], layout: Layout) -> dict[str, float]:
        """Broadcast `pairs` (checked against `layout`, which the receivers cut the stream by);
        {"fingerprint", "bytes"}."""
        running = Running()
        checked = running.through(checked_pairs(pairs, layout))
        if self.backend != "nccl":
            sent = buckets.send(checked, self.group, self.bucket_bytes, self.device)
            return {"fingerprint": running.value(), "bytes": float(sent)}
        from vllm.distributed.weight_transfer.packed_tensor import packed_nccl_broadcast_producer

        packed_nccl_broadcast_producer(iterator=checked, group=self.group, src=0,
                                       post_iter_func=lambda item: item[1].to(self.device, non_blocking=True),
                                       buffer_size_bytes=self.bucket_bytes, num_buffers=2)
        torch.cuda.current_stream().synchronize()
        return {"fingerprint": running.value(), "bytes": float(sum(m.nbytes for m in layout))}

    def close(self) -> None:
        self.group.destroy()


def checked_pairs(pairs: Iterator[tuple[str, torch.Tensor]], layout: Layout
                  ) -> Iterator[tuple[str, torch.Tensor]]:
    """`pairs` as they go, each checked against the layout the receivers were given: a stream that disagrees
    would be cut differently on the two ends (a hang or garbage), so it is an error naming the tensor."""
    n = 0
    for name, tensor in pairs:
        want = layout[n] if n < len(layout) else None
        if want != buckets.meta_of(name, tensor):
            raise ValueError(f"weight sync: tensor {n} is {buckets.meta_of(name, tensor)}, the layout sent "
                             f"ahead says {want}")
        n += 1
        yield name, tensor
    if n != len(layout):
        raise ValueError(f"weight sync: {n} tensors sent, the layout sent ahead has {len(layout)}")


class IpcSender:
    """Learner rank i's end of a colocated sync: its weights through one exported buffer on its GPU."""

    def __init__(self, pairs: Iterator[tuple[str, torch.Tensor]], bucket_bytes: int, device: torch.device):
        self.running = Running()
        self.sent = 0
        self._buckets = buckets.ipc_buckets(self.running.through(pairs), bucket_bytes, device)

    def next(self) -> dict[str, Any] | None:
        info = next(self._buckets, None)
        if info is not None:
            self.sent += sum(info["tensor_sizes"])
        return info

    def close(self) -> dict[str, float]:
        self._buckets.close()
        if torch.cuda.is_available():
            torch.cuda.ipc_collect()  # type: ignore[no-untyped-call]  # the receivers closed their mappings: the buffer can go
        return {"fingerprint": self.running.value(), "bytes": float(self.sent)}


# -- the driver's side --------------------------------------------------------------------------------------


def form_channel(src: Group[WeightSender], dsts: Sequence[Group[WeightReceiver]], timeout: float,
                 bucket_bytes: int, backend: str) -> int:
    """Form the channel: src member 0 is rank 0, the destinations' members follow in order, every one on the
    c10d `backend` decided once for all of them (jobs/config/gpu_rules.channel_backend). A member that held
    a channel aborts it first, so a re-formed channel never leaves the old group waiting. Returns the world
    size."""
    deadline = time.monotonic() + timeout
    host, port = src.submit_to([0], WeightSender.rendezvous_address).result(timeout)[0]
    world = 1 + sum(d.size for d in dsts)
    joins = [src.submit_to([0], WeightSender.nccl_join, host, port, world, timeout, backend, bucket_bytes)]
    rank = 1
    for dst in dsts:
        joins.append(dst.submit_each([
            Call(WeightReceiver.nccl_join, host, port, rank + i, world, timeout, backend, bucket_bytes)
            for i in range(dst.size)]))
        rank += dst.size
    for pending in joins:
        pending.result(_left(deadline))
    return world


def broadcast_nccl(src: Group[WeightSender], dsts: Sequence[Group[WeightReceiver]], version: int,
                   timeout: float) -> dict[str, float]:
    """One sync over a channel formed by `form_channel`: every member of `dsts` receives src member 0's
    weights as `version` and must report that version and the sender's fingerprint."""
    t0 = time.perf_counter()
    deadline = time.monotonic() + timeout
    layout = src.submit_to([0], WeightSender.weight_layout).result(timeout)[0]
    sent = src.submit_to([0], WeightSender.nccl_send, version)
    pendings = [(dst, dst.submit(WeightReceiver.nccl_receive, version, layout)) for dst in dsts]
    for _, pending in pendings:  # a receiver that fails fails the sync now, not at the sender's deadline
        pending.result(_left(deadline))
    expected = sent.result(_left(deadline))[0]["fingerprint"]
    from cluster.transport import collect_reports  # driver side only: it imports Ray

    moved, verified = collect_reports(pendings, version, expected, deadline)
    return {"sync_s": time.perf_counter() - t0, "bytes": float(moved), "verified": float(verified)}


def broadcast_ipc(src: Group[WeightSender], dsts: Sequence[Group[WeightReceiver]], version: int,
                  timeout: float, bucket_bytes: int) -> dict[str, float]:
    """One colocated sync: learner rank i → engine i on the same GPU, bucket by bucket (each rank's bucket
    handles merged by GPU, as vLLM's IPC trainer engine merges them, and handed to every engine, which opens
    its own GPU's). The next bucket is asked for only once every engine has loaded this one."""
    t0 = time.perf_counter()
    deadline = time.monotonic() + timeout
    ranks = list(range(src.size))
    src.submit_to(ranks, WeightSender.ipc_open, bucket_bytes).result(timeout)
    for dst in dsts:
        dst.submit(WeightReceiver.ipc_start).result(_left(deadline))
    while True:
        infos = src.submit_to(ranks, WeightSender.ipc_next).result(_left(deadline))
        if infos[0] is None:
            break
        merged = {**infos[0], "ipc_handles": {k: v for i in infos if i for k, v in i["ipc_handles"].items()}}
        for pending in [dst.submit(WeightReceiver.ipc_load, merged) for dst in dsts]:
            pending.result(_left(deadline))
    pendings = [(dst, dst.submit(WeightReceiver.ipc_finish, version)) for dst in dsts]
    expected = src.submit_to(ranks, WeightSender.ipc_close).result(_left(deadline))[0]["fingerprint"]
    from cluster.transport import collect_reports

    moved, verified = collect_reports(pendings, version, expected, deadline)
    return {"sync_s": time.perf_counter() - t0, "bytes": float(moved), "verified": float(verified)}


def _left(deadline: float) -> float:
    return max(deadline - time.monotonic(), 0.01)
