"""rollout.vllm.receive.BucketLoader, the engine worker's side of a bucketed sync, on a plain torch model:
each bucket is loaded and dropped as it arrives (the most buckets alive at once is 1, where keeping them, as a
`dict(...)` of the stream did, holds them all), and what is served is read back against what arrived."""

from __future__ import annotations

import torch

from cluster import buckets
from cluster.buckets import meta_of
from cluster.fingerprint import fingerprint
from rollout.vllm.receive import BucketLoader
from tests.cluster.test_weight_transfer import Recorder


class Toy(torch.nn.Module):
    """What the loader needs of vLLM's model: parameters under the sent names and `load_weights`."""

    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(8, 32)
        self.down = torch.nn.Linear(32, 8)
        self.norm = torch.nn.LayerNorm(8)

    def load_weights(self, pairs) -> None:
        params = dict(self.named_parameters())
        with torch.no_grad():
            for name, tensor in pairs:
                params[name].copy_(tensor)


def _new_weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return {n: torch.randn(p.shape, generator=g) for n, p in Toy().named_parameters()}


def _receive(model: Toy, load, bucket_bytes: int = 100) -> BucketLoader:
    weights = _new_weights()
    group = Recorder()
    buckets.send(iter(weights.items()), group, bucket_bytes, torch.device("cpu"))
    group.replaying = True
    loader = BucketLoader(model, load, torch.device("cpu"))
    metas = [meta_of(n, t) for n, t in weights.items()]
    buckets.receive(metas, group, bucket_bytes, torch.device("cpu"), loader)
    return loader


def test_each_bucket_is_loaded_and_dropped_before_the_next_arrives():
    model = Toy()
    loader = _receive(model, model.load_weights)
    report = loader.report()
    assert report["buckets"] >= 4 and report["held_peak"] == 1
    assert report["fingerprint"] == fingerprint(_new_weights())
    assert report["bytes"] == sum(t.numel() * 4 for t in _new_weights().values())
    assert set(report["errors"]) == set(_new_weights()) and max(report["errors"].values()) == 0.0
    assert all(torch.equal(p, _new_weights()[n]) for n, p in model.named_parameters())


def test_a_receive_that_keeps_its_buckets_is_seen():
    model, kept = Toy(), []

    def keep(bucket):
        kept.append(bucket)
        model.load_weights(bucket)

    report = _receive(model, keep).report()
    assert report["held_peak"] == report["buckets"] >= 4


def test_a_tensor_that_did_not_land_is_named_by_the_readback():
    model = Toy()
    def skip_one(bucket):
        model.load_weights([(n, t) for n, t in bucket if n != "down.weight"])

    report = _receive(model, skip_one).report()
    assert report["errors"]["down.weight"] == float("inf")  # sampled elements not bit-exact
    assert max(e for n, e in report["errors"].items() if n != "down.weight") == 0.0
