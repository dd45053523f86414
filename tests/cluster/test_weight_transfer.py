"""cluster.buckets and cluster.weight_transfer: the bucket rules (vLLM's, checked against vLLM's own packer),
the channel over gloo on CPU (the same roles as NCCL: layout ahead, buckets, version and fingerprint checks),
a re-formed channel aborting the old group, the CUDA IPC producer's format and its driver loop on CPU, and
NCCL itself on GPUs."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from cluster import buckets, collective
from cluster.buckets import Meta, meta_of
from cluster.fingerprint import Running, fingerprint
from cluster.group import Group
from cluster.transport import SyncError
from cluster.weight_transfer import IpcSender, SendChannel, broadcast_ipc, broadcast_nccl, form_channel

TIMEOUT = 60.0


def _weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(37, 8, generator=g),
        "norm.weight": torch.randn(8, generator=g).to(torch.bfloat16),
        "odd.weight": torch.randn(3, generator=g).to(torch.float16),  # 6 bytes: no alignment on the wire
        "layer.weight": torch.randn(8, 8, generator=g, dtype=torch.float64),
        "steps": torch.arange(5),
    }


def test_broadcast_buckets_close_with_the_tensor_that_crosses_the_bound():
    metas = [Meta("a", (10,), "float32"), Meta("b", (3,), "float16"), Meta("c", (4,), "float32"),
             Meta("big", (100,), "float32"), Meta("d", (2,), "int64")]
    cut = [[m.name for m in b] for b in buckets.plan(metas, bucket_bytes=44)]
    assert cut == [["a", "b"], ["c", "big"], ["d"]]  # 40 ≤ 44, 46 > 44 closes; 16 then 416 > 44 closes
    assert [[m.name for m in b] for b in buckets.plan(metas, 1 << 20)] == [["a", "b", "c", "big", "d"]]
    assert buckets.plan([], 64) == []


def test_the_bucket_rule_is_vllms_packer():
    """vLLM's receiver cuts the stream by this rule: our plan must split as its pack_tensors packs."""
    from vllm.distributed.weight_transfer.packed_tensor import pack_tensors

    weights = _weights(0)
    for size in (16, 64, 200, 1 << 20):
        it = iter(weights.items())
        theirs = []
        while (chunk := pack_tensors(it, lambda item: item[1], size)) is not None:
            theirs.append(chunk.names)
        ours = [[m.name for m in b] for b in buckets.plan([meta_of(n, t) for n, t in weights.items()], size)]
        assert ours == theirs, size


class Recorder:
    """An in-process stand-in for the group: the sender's broadcasts are recorded, then replayed to a
    receiver."""

    def __init__(self) -> None:
        self.sent: list[torch.Tensor] = []
        self.replaying = False

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        if self.replaying:
            tensor.copy_(self.sent.pop(0))
        else:
            self.sent.append(tensor.clone())


def _replayed(weights: dict[str, torch.Tensor], bucket_bytes: int, load) -> int:
    group = Recorder()
    sent = buckets.send(iter(weights.items()), group, bucket_bytes, torch.device("cpu"))
    group.replaying = True
    got = buckets.receive([meta_of(n, t) for n, t in weights.items()], group, bucket_bytes,
                          torch.device("cpu"), load)
    assert sent == got == sum(t.numel() * t.element_size() for t in weights.values())
    return got


def test_send_and_receive_move_exact_tensors_bucket_by_bucket():
    served: dict[str, torch.Tensor] = {}
    _replayed(_weights(1), 64, lambda bucket: served.update({n: t.clone() for n, t in bucket}))
    assert served.keys() == _weights(1).keys()
    assert all(served[n].dtype == w.dtype and torch.equal(served[n], w) for n, w in _weights(1).items())


def test_running_fingerprint_equals_the_whole_sets():
    running = Running()
    passed = list(running.through(_weights(2).items()))
    assert [n for n, _ in passed] == list(_weights(2))
    assert all(torch.equal(t, _weights(2)[n]) for n, t in passed)
    assert running.value() == fingerprint(_weights(2))


class Sender:
    """Stands in for learner rank 0: the WeightSender methods (gloo on CPU); `old_groups` keeps every group it
    replaced."""

    def __init__(self, weights: dict[str, torch.Tensor], backend: str = "gloo"):
        self.weights, self.backend = weights, backend
        self.channel: SendChannel | None = None
        self.old_groups: list = []

    def rendezvous_address(self) -> tuple[str, int]:
        return collective.rendezvous_address()

    def nccl_join(self, host, port, world_size, timeout_s, backend, bucket_bytes) -> None:
        assert backend == self.backend, "every end of a channel is handed the one backend"
        if self.channel is not None:
            self.channel.close()
            self.old_groups.append(self.channel.group)
        self.channel = SendChannel(host, port, world_size, timeout_s, backend, bucket_bytes)

    def weight_layout(self) -> list[Meta]:
        return [meta_of(n, t) for n, t in self.weights.items()]

    def nccl_send(self, version: int) -> dict[str, float]:
        assert self.channel is not None
        return self.channel.send(iter(self.weights.items()), self.weight_layout())

    def ipc_open(self, bucket_bytes: int) -> None:
        self.ipc = IpcSender(iter(self.weights.items()), bucket_bytes, torch.device("cpu"))

    def ipc_next(self):
        return self.ipc.next()

    def ipc_close(self) -> dict[str, float]:
        return self.ipc.close()

    def aborted(self) -> list[bool]:
        return [g.closed for g in self.old_groups]

    def old_group_refuses(self) -> str:
        try:
            self.old_groups[0].broadcast(torch.zeros(1), src=0)
        except RuntimeError as e:
            return str(e)
        return ""


class Receiver:
    """Stands in for an engine: receives bucket by bucket (cluster.buckets.receive, the engine worker's
    gloo path); a `corrupting` one flips a sign of what it received before serving it."""

    def __init__(self, corrupting: bool = False, backend: str = "gloo"):
        self.corrupting, self.backend = corrupting, backend
        self.served: dict[str, torch.Tensor] = {}
        self.group: Any = None

    def nccl_join(self, host, port, rank, world_size, timeout_s, backend, bucket_bytes) -> None:
        assert backend == self.backend
        if self.group is not None:
            self.group.destroy()
        self.bucket_bytes = bucket_bytes
        self.group = buckets.GlooGroup(host, port, rank, world_size, timeout_s)

    def _store(self, bucket) -> None:
        self.served.update({n: t.clone() for n, t in bucket})

    def _report(self, version: int) -> dict[str, float]:
        if self.corrupting:
            self.served["embed.weight"].neg_()
        return {"version": version, "bytes": sum(t.numel() * t.element_size() for t in self.served.values()),
                "fingerprint": fingerprint(self.served)}

    def nccl_receive(self, version: int, layout: list[Meta]) -> dict[str, float]:
        buckets.receive(layout, self.group, self.bucket_bytes, torch.device("cpu"), self._store)
        return self._report(version)

    def ipc_start(self) -> None:
        self.served = {}

    def ipc_load(self, info) -> None:
        self._store(buckets.open_ipc_bucket(info, torch.device("cpu")))

    def ipc_finish(self, version: int) -> dict[str, float]:
        return self._report(version)

    def get(self) -> dict[str, torch.Tensor]:
        return dict(self.served)


def _groups(n_receivers: int, corrupting_last: bool = False) -> tuple[Group, list[Group]]:
    src = Group(Sender, 0, "run:learner:pi", per_member_kwargs=[{"weights": _weights(0)}])
    dsts = [Group(Receiver, 0, f"run:engine:r{i}",
                  per_member_kwargs=[{"corrupting": corrupting_last and i == n_receivers - 1}])
            for i in range(n_receivers)]
    return src, dsts


def _shutdown(*groups: Group) -> None:
    for g in groups:
        g.shutdown()


def _served_exactly(dsts: list[Group]) -> None:
    for dst in dsts:
        got = dst.submit(Receiver.get).result(TIMEOUT)[0]
        assert got.keys() == _weights(0).keys()
        assert all(got[n].dtype == w.dtype and torch.equal(got[n], w) for n, w in _weights(0).items())


def test_every_receiver_gets_exact_tensors_over_several_buckets_and_versions():
    src, dsts = _groups(2)
    try:
        for version, bucket in ((1, 64), (2, 1 << 20)):  # many small buckets, then one
            assert form_channel(src, dsts, TIMEOUT, bucket, "gloo") == 3
            out = broadcast_nccl(src, dsts, version, TIMEOUT)
            assert out["verified"] == 2.0
            assert out["bytes"] == 2.0 * sum(t.numel() * t.element_size() for t in _weights(0).values())
            _served_exactly(dsts)
    finally:
        _shutdown(src, *dsts)


def test_a_reformed_channel_aborts_the_old_group():
    src, dsts = _groups(1)
    try:
        form_channel(src, dsts, TIMEOUT, 64, "gloo")
        broadcast_nccl(src, dsts, 1, TIMEOUT)
        form_channel(src, dsts, TIMEOUT, 64, "gloo")  # an engine was replaced: members are fixed
        assert src.submit(Sender.aborted).result(TIMEOUT)[0] == [True]
        assert "aborted" in src.submit(Sender.old_group_refuses).result(TIMEOUT)[0]
        assert broadcast_nccl(src, dsts, 2, TIMEOUT)["verified"] == 1.0  # the new one works
    finally:
        _shutdown(src, *dsts)


def test_a_receiver_serving_other_values_is_named():
    src, dsts = _groups(2, corrupting_last=True)
    try:
        form_channel(src, dsts, TIMEOUT, 256, "gloo")
        with pytest.raises(SyncError, match=r"^run:engine:r1:0 serves weights with fingerprint"):
            broadcast_nccl(src, dsts, 1, TIMEOUT)
    finally:
        _shutdown(src, *dsts)


def test_a_stream_that_disagrees_with_its_layout_is_refused():
    from cluster.weight_transfer import checked_pairs

    layout = [meta_of(n, t) for n, t in _weights(0).items()]
    with pytest.raises(ValueError, match="tensor 1 is"):
        pairs = [("embed.weight", _weights(0)["embed.weight"]), ("x", torch.zeros(2))]
        list(checked_pairs(iter(pairs), layout))
    with pytest.raises(ValueError, match="1 tensors sent, the layout sent ahead has 5"):
        list(checked_pairs(iter(list(_weights(0).items())[:1]), layout))


def test_ipc_buckets_flush_before_the_buffer_overflows_and_refuse_a_tensor_larger_than_it():
    weights = _weights(3)
    infos = list(buckets.ipc_buckets(iter(weights.items()), 1190, torch.device("cpu")))
    # 1,184 bytes of embedding, then 16 more would make 1,200: flushed first
    assert [i["names"] for i in infos] == [["embed.weight"],
                                           ["norm.weight", "odd.weight", "layer.weight", "steps"]]
    assert [sum(i["tensor_sizes"]) for i in infos] == [1184, 574]
    assert infos[0]["ipc_handles"].keys() == {"cpu"} and infos[0]["dtype_names"] == ["float32"]
    with pytest.raises(ValueError, match="exceed sync.bucket_mb"):
        list(buckets.ipc_buckets(iter(weights.items()), 1000, torch.device("cpu")))


def test_broadcast_ipc_hands_every_bucket_to_every_engine_and_checks_the_fingerprint():
    src, dsts = _groups(2)
    try:
        out = broadcast_ipc(src, dsts, 4, TIMEOUT, bucket_bytes=1190)
        assert out["verified"] == 2.0
        _served_exactly(dsts)
    finally:
        _shutdown(src, *dsts)
    src, dsts = _groups(1, corrupting_last=True)
    try:
        with pytest.raises(SyncError, match="serves weights with fingerprint"):
            broadcast_ipc(src, dsts, 1, TIMEOUT, bucket_bytes=1190)
    finally:
        _shutdown(src, *dsts)


@pytest.mark.gpu
def test_nccl_broadcast_between_two_gpus(ray_gpus):
    """Learner on one GPU, engine on another (NCCL refuses two ranks on one device): vLLM's trainer endpoint
    and packed producer against the same bucket rule on the receiving end."""
    from cluster.group import MemberOptions

    gpu = MemberOptions(num_cpus=1, num_gpus=1)
    src = Group(Sender, 1, "gpu:learner:pi", options=gpu,
                per_member_kwargs=[{"backend": "nccl", "weights": _weights(0)}])
    dst = Group(NcclReceiver, 1, "gpu:engine:r0", options=gpu, per_member_kwargs=[{"backend": "nccl"}])
    try:
        form_channel(src, [dst], TIMEOUT, 64, "nccl")
        assert broadcast_nccl(src, [dst], 7, TIMEOUT)["verified"] == 1.0
        _served_exactly([dst])
    finally:
        _shutdown(src, dst)


class NcclReceiver(Receiver):
    """The GPU receiver: vLLM's stateless NCCL group as the engine worker builds it, the same receive loop."""

    def nccl_join(self, host, port, rank, world_size, timeout_s, backend, bucket_bytes) -> None:
        from vllm.distributed.weight_transfer.nccl_common import stateless_init_process_group

        self.bucket_bytes = bucket_bytes
        self.group = stateless_init_process_group(host, port, rank, world_size, torch.cuda.current_device())

    def nccl_receive(self, version: int, layout: list[Meta]) -> dict[str, float]:
        buckets.receive(layout, self.group, self.bucket_bytes, torch.device("cuda"), self._store)
        self.served = {n: t.cpu() for n, t in self.served.items()}
        return self._report(version)
