"""jobs.driver.weight_sync with in-process stand-ins for a learner's rank 0 and engines (no Ray, no model):
which payload each serving mode ships, over which transport (the NCCL channel over gloo on CPU), the versions
a replaced engine is caught up to, and the channel formed anew after a replacement."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from cluster import buckets, collective
from cluster.buckets import meta_of
from cluster.fingerprint import fingerprint
from cluster.group import Group
from cluster.packing import share
from cluster.payloads import AdapterPayload, LoraDelta
from cluster.sketch import sketch
from cluster.transport import SyncError
from cluster.weight_transfer import IpcSender, SendChannel
from jobs.driver.weight_sync import WeightSync, resync_through, sync_all

TIMEOUT = 60.0
WEIGHTS = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(4, dtype=torch.float64)}
ADAPTER = AdapterPayload("pi", {"lora_A": torch.full((2, 2), 0.5)}, {})


class Rank0:
    """A learner's rank 0: hands out WEIGHTS (and ADAPTER) the ways the learner
    does, and counts channel joins."""

    def __init__(self) -> None:
        self.joins = 0

    def get_packed_weights(self):
        return share(WEIGHTS)

    def get_adapter(self):
        return ADAPTER

    def get_lora_delta(self):
        return LoraDelta(ADAPTER, list(WEIGHTS))

    def merged_sketch(self):
        return {name: sketch(name, w) for name, w in WEIGHTS.items()}

    def rendezvous_address(self):
        return collective.rendezvous_address()

    def nccl_join(self, host, port, world_size, timeout_s, backend, bucket_bytes):
        self.joins += 1
        self.channel = SendChannel(host, port, world_size, timeout_s, backend, bucket_bytes)

    def weight_layout(self):
        return [meta_of(n, t) for n, t in WEIGHTS.items()]

    def nccl_send(self, version):
        return self.channel.send(iter(WEIGHTS.items()), self.weight_layout())

    def ipc_open(self, bucket_bytes):
        self.ipc = IpcSender(iter(WEIGHTS.items()), bucket_bytes, torch.device("cpu"))

    def ipc_next(self):
        return self.ipc.next()

    def ipc_close(self):
        return self.ipc.close()

    def joined(self) -> int:
        return self.joins


class Engine:
    """Serves what it is sent; records which load method each version arrived through."""

    def __init__(self) -> None:
        self.loads: list[tuple[str, int]] = []
        self.joins = 0

    def _report(self, how: str, version: int, served: dict[str, Any]) -> dict[str, float]:
        self.loads.append((how, version))
        return {"version": version, "bytes": 1, "fingerprint": fingerprint(served)}

    def load_weights(self, weights, version):
        return self._report("load_weights", version, dict(weights))

    def load_adapter(self, payload, version):
        return self._report("load_adapter", version, dict(payload.tensors))

    def load_lora_delta(self, payload, version):
        self.loads.append(("load_lora_delta", version))  # serves the merge the learner sketched
        return {"version": version, "bytes": 1, "sketch": {n: sketch(n, w) for n, w in WEIGHTS.items()},
                "sketch_rtol": 1e-6}

    def nccl_join(self, host, port, rank, world_size, timeout_s, backend, bucket_bytes):
        self.joins += 1
        self.bucket_bytes = bucket_bytes
        self.channel = buckets.GlooGroup(host, port, rank, world_size, timeout_s)

    def nccl_receive(self, version, layout):
        served: dict[str, Any] = {}
        buckets.receive(layout, self.channel, self.bucket_bytes, torch.device("cpu"),
                        lambda b: served.update({n: t.clone() for n, t in b}))
        return self._report("nccl_receive", version, served)

    def ipc_start(self):
        self.ipc_served: dict[str, Any] = {}

    def ipc_load(self, info):
        self.ipc_served.update({n: t.clone() for n, t in buckets.open_ipc_bucket(info, torch.device("cpu"))})

    def ipc_finish(self, version):
        return self._report("ipc", version, self.ipc_served)

    def history(self) -> tuple[list[tuple[str, int]], int]:
        return self.loads, self.joins


class OffEngine(Engine):
    """Serves weight "w" of the adapter delta 1% off what the learner merged."""

    def load_lora_delta(self, payload, version):
        report = super().load_lora_delta(payload, version)
        return {**report, "sketch": {**report["sketch"], "w": report["sketch"]["w"] * 1.01}}


@dataclass
class Learners:
    """What WeightSync reads of a LearnerGroup."""

    policy_id: str
    group: Group = field(default_factory=lambda: Group(Rank0, 0, "run:learner:pi"))

    def sync_metrics(self) -> dict[str, float]:
        return {f"sync/merge_rounding/{self.policy_id}": 0.5}


@dataclass
class Engines:
    """What WeightSync reads of an EngineGroup."""

    name: str
    policies: list[str]
    multi_lora: bool = False
    member: type = Engine
    group: Group = field(init=False)

    def __post_init__(self) -> None:
        self.group = Group(self.member, 0, f"run:engine:{self.name}")


def _history(engines: Engines) -> tuple[list[tuple[str, int]], int]:
    return engines.group.submit(Engine.history).result(TIMEOUT)[0]


def _sync(engines: list[Engines], transport: str = "object_store", lora_delta: bool = False,
          pid: str = "pi") -> WeightSync:
    return WeightSync(Learners(pid), engines, transport, 64, TIMEOUT, lora_delta,  # type: ignore[arg-type]
                      channel_backend="gloo")


@pytest.mark.parametrize(("multi_lora", "transport", "lora_delta", "method"), [
    (False, "object_store", False, "load_weights"),
    (False, "object_store", True, "load_lora_delta"),
    (False, "nccl", True, "nccl_receive"),
    (False, "ipc", False, "ipc"),  # colocated: CUDA IPC on GPUs, the same loop over shared CPU memory here
    (True, "object_store", False, "load_adapter"),
    (True, "nccl", True, "load_adapter"),  # adapters always take the object store
])
def test_each_serving_mode_ships_its_payload_and_is_verified(multi_lora, transport, lora_delta, method):
    engines = [Engines("a", ["pi"], multi_lora), Engines("b", ["pi"], multi_lora)]
    out = _sync(engines, transport, lora_delta).run(3)
    assert out["verified"] == 2.0
    for e in engines:
        assert _history(e)[0] == [(method, 3)]


def test_an_adapter_delta_served_off_the_learners_merge_is_an_error_naming_the_engine_and_the_tensor():
    engines = [Engines("a", ["pi"]), Engines("b", ["pi"], member=OffEngine)]
    with pytest.raises(SyncError, match=r"^run:engine:b:0 after loading version 2: 1 of 2 tensors .*: w \("):
        _sync(engines, lora_delta=True).run(2)


def test_sync_all_sums_policies_and_adds_merged_serving_metrics():
    a, b = Engines("a", ["pi"]), Engines("b", ["rho"], multi_lora=True)
    syncs = {"pi": _sync([a], pid="pi"), "rho": _sync([b], pid="rho")}
    out = sync_all(syncs, 5)
    assert out["sync/verified"] == 2.0 and out["sync/bytes"] == 2.0 and out["time/sync_s"] > 0
    # multi-LoRA: no merge
    assert out["sync/merge_rounding/pi"] == 0.5 and "sync/merge_rounding/rho" not in out
    assert syncs["pi"].version == syncs["rho"].version == 5


def test_a_replaced_engine_is_caught_up_through_the_object_store_and_the_channel_formed_anew():
    engines = Engines("a", ["pi"])
    sync = _sync([engines], transport="nccl")
    sync.run(1)
    sync.run(2)  # the channel stands: no new joins
    assert _history(engines) == ([("nccl_receive", 1), ("nccl_receive", 2)], 1)
    resync_through({"pi": sync})(engines, 0)  # what EngineGroup calls after replacing member 0
    assert _history(engines) == ([("nccl_receive", 1), ("nccl_receive", 2), ("load_weights", 2)], 1)
    sync.run(3)  # a channel's members are fixed: it is formed again, then used
    assert _history(engines) == ([("nccl_receive", 1), ("nccl_receive", 2), ("load_weights", 2),
                                  ("nccl_receive", 3)], 2)
    assert sync.learner.group.submit(Rank0.joined).result(TIMEOUT) == [2]


def test_a_group_serving_several_policies_is_caught_up_on_each():
    shared = Engines("lora", ["pi", "rho"], multi_lora=True)
    syncs = {pid: _sync([shared], pid=pid) for pid in ("pi", "rho")}
    sync_all(syncs, 4)
    resync_through(syncs)(shared, 0)
    assert _history(shared)[0][-2:] == [("load_adapter", 4), ("load_adapter", 4)]
