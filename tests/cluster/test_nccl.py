"""cluster.nccl: the bucket layout (pure), the whole channel over gloo on CPU (same code as
NCCL but the backend: bytes, buckets, the layout through the store, version and fingerprint
checks), and NCCL itself on GPUs."""

from __future__ import annotations

import pytest
import torch

from cluster import collective
from cluster.fingerprint import fingerprint
from cluster.group import Group
from cluster.nccl import (
    ALIGN,
    WeightChannel,
    broadcast_nccl,
    bucket_size,
    form_channel,
    layout_of,
    plan_buckets,
)
from cluster.transport import SyncError

TIMEOUT = 60.0


def _weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(37, 8, generator=g),
        "norm.weight": torch.randn(8, generator=g).to(torch.bfloat16),  # 16 bytes: tests alignment after it
        "odd.weight": torch.randn(3, generator=g).to(torch.float16),  # 6 bytes: the next slot must realign
        "layer.weight": torch.randn(8, 8, generator=g, dtype=torch.float64),
        "steps": torch.arange(5),
    }


def test_buckets_keep_order_align_slots_and_respect_the_size():
    layout = [("a", (10,), "float32", 40), ("b", (3,), "float16", 6), ("c", (4,), "float32", 16),
              ("big", (100,), "float32", 400), ("d", (2,), "int64", 16)]
    buckets = plan_buckets(layout, bucket_bytes=64)
    assert [[s.name for s in b] for b in buckets] == [["a", "b"], ["c"], ["big"], ["d"]]
    assert [s.offset for s in buckets[0]] == [0, 48]  # 40 rounded up to the next 16-byte boundary
    assert all(s.offset % ALIGN == 0 for b in buckets for s in b)
    assert [bucket_size(b) for b in buckets] == [54, 16, 400, 16]  # an oversized tensor gets its own bucket
    assert [[s.name for s in b] for b in plan_buckets(layout, 1 << 20)] == [["a", "b", "c", "big", "d"]]
    assert plan_buckets([], 64) == []


def test_layout_names_shapes_dtypes_and_bytes():
    assert layout_of({"w": torch.zeros(2, 3, dtype=torch.bfloat16)}) == [("w", (2, 3), "bfloat16", 12)]


class Sender:
    """Stands in for learner rank 0: the member methods the channel needs (gloo instead of NCCL on CPU)."""

    def __init__(self, weights: dict[str, torch.Tensor], backend: str = "gloo"):
        self.weights, self.backend = weights, backend

    def rendezvous_address(self) -> tuple[str, int]:
        return collective.rendezvous_address()

    def nccl_join(self, host: str, port: int, rank: int, world_size: int, timeout_s: float,
                  backend: str) -> None:
        assert backend == self.backend, "every end of a channel is handed the one backend"
        self.channel = WeightChannel(host, port, rank, world_size, timeout_s, backend)

    def nccl_send(self, version: int, bucket_bytes: int, fingerprint_fn) -> dict[str, float]:
        weights = {k: v.to(self.channel.device) for k, v in self.weights.items()}
        return {
            "fingerprint": fingerprint_fn(weights),
            "bytes": self.channel.send(weights, version, bucket_bytes),
        }


class Receiver:
    """Stands in for an engine; a `corrupting` one flips a sign of what it received before serving it."""

    def __init__(self, corrupting: bool = False, backend: str = "gloo"):
        self.corrupting, self.backend = corrupting, backend
        self.served: dict[str, torch.Tensor] = {}

    def nccl_join(self, host: str, port: int, rank: int, world_size: int, timeout_s: float,
                  backend: str) -> None:
        assert backend == self.backend, "every end of a channel is handed the one backend"
        self.channel = WeightChannel(host, port, rank, world_size, timeout_s, backend)

    def nccl_receive(self, version: int, bucket_bytes: int) -> dict[str, float]:
        self.served = {k: v.clone() for k, v in self.channel.receive(version, bucket_bytes)}
        if self.corrupting:
            self.served["embed.weight"].neg_()
        return {"version": version, "bytes": sum(t.numel() * t.element_size() for t in self.served.values()),
                "fingerprint": fingerprint(self.served)}

    def get(self) -> dict[str, torch.Tensor]:
        return {k: v.cpu() for k, v in self.served.items()}


def _channel(n_receivers: int, corrupting_last: bool = False) -> tuple[Group, list[Group]]:
    src = Group(Sender, 0, "run:learner:pi", per_member_kwargs=[{"weights": _weights(0)}])
    dsts = [Group(Receiver, 0, f"run:engine:r{i}",
                  per_member_kwargs=[{"corrupting": corrupting_last and i == n_receivers - 1}])
            for i in range(n_receivers)]
    assert form_channel(src, dsts, TIMEOUT, "gloo") == 1 + n_receivers
    return src, dsts


def test_every_receiver_gets_exact_tensors_over_several_buckets_and_versions():
    src, dsts = _channel(2)
    try:
        for version, bucket in ((1, 64), (2, 1 << 20)):  # many small buckets, then one
            out = broadcast_nccl(src, dsts, version, TIMEOUT, fingerprint, bucket_bytes=bucket)
            assert out["verified"] == 2.0
            assert out["bytes"] == 2.0 * sum(t.numel() * t.element_size() for t in _weights(0).values())
            for dst in dsts:
                got = dst.submit(Receiver.get).result(TIMEOUT)[0]
                assert got.keys() == _weights(0).keys()
                for name, want in _weights(0).items():
                    assert got[name].dtype == want.dtype and torch.equal(got[name], want), name
    finally:
        for g in (src, *dsts):
            g.shutdown()


def test_a_receiver_serving_other_values_is_named():
    src, dsts = _channel(2, corrupting_last=True)
    try:
        with pytest.raises(SyncError, match=r"^run:engine:r1:0 serves weights with fingerprint"):
            broadcast_nccl(src, dsts, 1, TIMEOUT, fingerprint, bucket_bytes=256)
    finally:
        for g in (src, *dsts):
            g.shutdown()


@pytest.mark.gpu
def test_nccl_broadcast_between_two_gpus(ray_gpus):
    """Learner on one GPU, engine on another (NCCL refuses two ranks on one device)."""
    from cluster.group import MemberOptions

    gpu = MemberOptions(num_cpus=1, num_gpus=1)
    src = Group(Sender, 1, "gpu:learner:pi", options=gpu,
                per_member_kwargs=[{"backend": "nccl", "weights": _weights(0)}])
    dst = Group(Receiver, 1, "gpu:engine:r0", options=gpu, per_member_kwargs=[{"backend": "nccl"}])
    try:
        form_channel(src, [dst], TIMEOUT, "nccl")
        out = broadcast_nccl(src, [dst], 7, TIMEOUT, fingerprint, bucket_bytes=64)
        assert out["verified"] == 1.0
        got = dst.submit(Receiver.get).result(TIMEOUT)[0]
        assert all(torch.equal(got[k], v) for k, v in _weights(0).items())
    finally:
        src.shutdown()
        dst.shutdown()


@pytest.fixture(scope="module")
def ray_gpus():
    import ray

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs: NCCL refuses two ranks on one device")
    owned = not ray.is_initialized()
    if owned:
        ray.init(address="local", include_dashboard=False)
    yield
    if owned:
        ray.shutdown()
