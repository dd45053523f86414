"""The engine's side of a bucketed weight sync, without vLLM: each bucket is loaded into the model as it
arrives and dropped; what the check needs of it is kept (its fingerprint terms, the checked sketch of each
tensor, rollout.vllm.readback), a few columns per tensor. Used by the vLLM weight-transfer engines of
rollout/vllm/worker.py inside the worker."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from cluster.fingerprint import Running
from rollout.vllm.readback import Expected, errors_against, expected_sketches

Bucket = list[tuple[str, torch.Tensor]]
# sync.transport -> the weight_transfer_config.backend name rollout/vllm/worker.py registers its engine under
TRANSFER_BACKENDS = {"nccl": "marl_nccl", "ipc": "marl_ipc"}


class BucketLoader:
    """`load(bucket)` puts one bucket's tensors into the model (vLLM's `model.load_weights`, in place or
    inside its layerwise reload); `report()` after the last bucket, once the model serves them, reads back
    what is served against what arrived. `held_peak`: the most buckets alive at once while loading (a
    receive that keeps every bucket, a `dict(...)` of the stream, would hold all of them)."""

    def __init__(self, model: torch.nn.Module, load: Callable[[Bucket], Any], device: torch.device):
        self.model, self.load, self.device = model, load, device
        self.running = Running()
        self.expected: dict[str, Expected] = {}
        self.bytes = 0
        self.buckets = 0
        self.held_peak = 0
        self._alive: set[int] = set()  # ids of the bucket buffers still referenced
        self._next = 0

    def __call__(self, bucket: Bucket) -> None:
        for name, tensor in bucket:
            self.running.add(name, tensor)
            self.bytes += tensor.numel() * tensor.element_size()
        self.expected.update(expected_sketches(self.model, dict(bucket), self.device))
        if bucket:  # views of one buffer: it lives while any of them (or a copy vLLM keeps) does
            first = bucket[0][1]
            self._next += 1
            self._alive.add(self._next)
            weakref.finalize(first if first._base is None else first._base, self._alive.discard, self._next)
        self.held_peak = max(self.held_peak, len(self._alive))
        self.buckets += 1
        self.load(bucket)

    def report(self) -> dict[str, Any]:
        """{"bytes", "fingerprint" of what arrived, "errors": readback errors of what is served, "buckets",
        "held_peak"}."""
        return {"bytes": self.bytes, "fingerprint": self.running.value(),
                "errors": errors_against(self.model, self.expected), "buckets": self.buckets,
                "held_peak": self.held_peak}
