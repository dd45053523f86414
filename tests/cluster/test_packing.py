"""PackedTensors, packed (one buffer) and shared (the tensors' own bytes): exact round trip for every dtype,
zero-copy reads through Ray's object store, and a fingerprint equal to the unpacked tensors'."""

import numpy as np
import pytest
import ray
import torch

from cluster.fingerprint import fingerprint
from cluster.packing import PackedTensors, pack, share, tensor_bytes


def weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"a.weight": torch.randn(7, 3, generator=g), "b.bias": torch.randn(5, generator=g).bfloat16(),
            "c.half": torch.randn(2, 2, generator=g).half(), "d.ids": torch.arange(9).view(3, 3),
            "e.empty": torch.empty(0, 4), "f.scalar": torch.tensor(3.5)}


@pytest.mark.parametrize("make", [pack, share])
def test_round_trip_is_exact_for_every_dtype_and_shape(make):
    w = weights()
    packed = make(w)
    assert list(packed) == list(w) and len(packed) == len(w)
    for name, t in w.items():
        got = packed[name]
        assert got.dtype == t.dtype and got.shape == t.shape and torch.equal(got, t), name
    assert all(s.offset % 64 == 0 for s in packed.specs)
    assert fingerprint(packed) == fingerprint(w)
    assert packed.nbytes == sum(t.numel() * t.element_size() for t in w.values())


def test_a_packed_view_is_not_a_copy_of_the_buffer():
    packed = pack({"x": torch.zeros(4)})
    packed.buffers[0][:4] = np.frombuffer(np.float32(1.0).tobytes(), dtype=np.uint8)
    assert packed["x"][0].item() == 1.0


def test_shared_tensors_are_views_of_the_senders_and_an_alias_travels_once():
    embed, norm = torch.randn(6, 4), torch.randn(4)
    shared = share({"embed": embed, "head": embed, "norm": norm, "t": embed.T})
    assert shared["embed"].data_ptr() == embed.data_ptr()  # no copy on the sender
    # the tied head shares the embedding's buffer; the transpose is its own copy
    assert len(shared.buffers) == 3
    assert shared.nbytes == 3 * 24 * 4 + 16  # every name still counts: what the receiver gets
    assert torch.equal(shared["t"], embed.T)
    assert shared.stacked(["embed", "norm"]) is None  # two buffers: never one view


@ray.remote(num_cpus=0)
def _read(packed: PackedTensors) -> tuple[bool, float]:
    return all(not b.flags.writeable for b in packed.buffers), fingerprint(packed)


def test_tensors_back_to_back_stack_as_one_view_and_others_do_not():
    q, k, v = torch.randn(32, 16), torch.randn(8, 16), torch.randn(8, 16)
    packed = pack({"q": q, "k": k, "v": v, "odd": torch.randn(3, 5), "w": torch.randn(4, 16)})
    fused = packed.stacked(["q", "k", "v"])
    assert fused is not None and torch.equal(fused, torch.cat([q, k, v]))
    assert fused.data_ptr() == packed["q"].data_ptr()  # a view of the buffer: nothing copied
    assert packed.stacked(["k", "q"]) is None  # not in the buffer's order
    assert packed.stacked(["odd", "w"]) is None  # 60 bytes, padded to 64: not back to back
    assert packed.stacked(["v", "odd"]) is None  # another trailing shape


def test_through_the_object_store_the_receiver_reads_shared_memory(ray_cluster):
    w = weights()
    for make in (pack, share):
        readonly, fp = ray.get(_read.remote(make(w)), timeout=60)
        assert readonly  # views of the object store, not private copies
        assert fp == pytest.approx(fingerprint(w), abs=0)


def test_tensor_bytes_counts_element_storage_and_is_a_packs_nbytes():
    state = {"w": torch.zeros(4, 3), "b": torch.zeros(5, dtype=torch.float64),
             "h": torch.zeros(2, dtype=torch.bfloat16)}
    assert tensor_bytes(state) == 4 * 3 * 4 + 5 * 8 + 2 * 2 == pack(state).nbytes
