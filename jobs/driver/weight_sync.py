"""Weight sync: one policy's learner group → the engine groups serving its roles, versioned and verified on
the engine side. The one place that knows which payload each serving mode ships and over which transport:

| serving                          | payload (learner method → engine method)          | transport        |
|----------------------------------|---------------------------------------------------|------------------|
| multi-LoRA (lora_serving=multi)  | get_adapter → load_adapter                        | object store     |
| merged, sync.transport=nccl      | nccl_send → nccl_receive (bucketed broadcast)     | vLLM's NCCL      |
| merged, sync.transport=ipc       | ipc_next → ipc_load, bucket by bucket (colocated) | vLLM's CUDA IPC  |
| merged LoRA, sync.lora_delta     | get_lora_delta → load_lora_delta (engines merge)  | object store     |
| merged, otherwise                | get_packed_weights → load_weights                 | object store     |

The payloads are typed: full weights a cluster.packing.PackedTensors, an adapter a
cluster.payloads.AdapterPayload, an adapter delta a cluster.payloads.LoraDelta (the adapter and the names of
the weights served), each around packed buffers that the object store keeps out of band.

Every engine reports the version it now serves and the fingerprint of those weights (cluster.fingerprint) or,
for an adapter delta, their probe sketch (cluster.sketch), read through the kernels that serve them and
compared with the learner's sketch of its merge; a mismatch is a SyncError naming the engine. A replaced
engine is caught up through the object store alone, and the policy's NCCL channel (whose members are fixed) is
formed anew before its next sync.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from cluster.fingerprint import fingerprint
from cluster.sketch import sketch_mismatch
from cluster.transport import broadcast
from cluster.weight_transfer import broadcast_nccl, form_channel
from jobs.config.gpu_layout import IPC_SENDER
from learners.group import LearnerGroup
from learners.member import LearnerMember
from rollout.engine import EngineMember
from rollout.engine_group import EngineGroup, Resync
from rollout.lora import adapter_fingerprint


class WeightSync:
    """Policy `learner.policy_id`'s learner → `engines` (every engine group serving one of its roles)."""

    def __init__(
        self,
        learner: LearnerGroup,
        engines: Sequence[EngineGroup],
        transport: str,
        bucket_bytes: int,
        timeout_s: float,
        lora_delta: bool,
        channel_backend: str,
    ):
        """`transport`: sync.transport; `bucket_bytes`: the NCCL and IPC bucket size; `lora_delta`: a LoRA
        policy served merged ships its adapter alone over the object store (sync.lora_delta with
        model.lora.enabled);
        `channel_backend`: the c10d backend of the NCCL channel, decided once for both ends
        (jobs/config/gpu_rules.channel_backend; gloo in CPU tests)."""
        self.channel_backend = channel_backend
        self.policy_id = learner.policy_id
        self.learner = learner
        self.engines = list(engines)
        self.transport, self.bucket_bytes, self.timeout_s = transport, bucket_bytes, timeout_s
        self.lora_delta = lora_delta
        self.multi_lora = self.engines[0].multi_lora
        self.version = 0  # what the engines serve: a replaced engine is caught up to it
        self.channel_ready = False  # nccl: formed before the first sync and after a replacement

    def open_channel(self) -> None:
        """Form the NCCL channel learner rank 0 → every engine, unless it stands
        (nothing for the object store)."""
        if self.transport == "nccl" and not self.channel_ready:
            form_channel(self.learner.group, [e.group for e in self.engines], self.timeout_s,
                         self.bucket_bytes, self.channel_backend)
            self.channel_ready = True

    def run(self, version: int) -> dict[str, float]:
        """Push the policy's weights (or adapter) as `version` to every engine;
        {"sync_s", "bytes", "verified"}."""
        self.open_channel()
        out = self._send(self.engines, version)
        self.version = version
        return out

    def serving_metrics(self) -> dict[str, float]:
        """Merged serving: what the last weights handed out lost to the serving
        dtype (Learner.sync_metrics)."""
        return {} if self.multi_lora else self.learner.sync_metrics()

    def catch_up(self, engines: EngineGroup, index: int) -> None:
        """Bring member `index` of `engines` (one of this policy's groups, just
        replaced) to the current version."""
        self._send([engines], self.version, indices=[index])
        self.channel_ready = False  # the channel's members are fixed: form it anew before the next sync

    def _send(self, engines: Sequence[EngineGroup], version: int,
              indices: list[int] | None = None) -> dict[str, float]:
        src, dsts, timeout = self.learner.group, [e.group for e in engines], self.timeout_s
        if self.multi_lora:  # adapters are small: always through the object store
            return broadcast(src, LearnerMember.get_adapter, dsts, EngineMember.load_adapter, version,
                             timeout, fingerprint=adapter_fingerprint, indices=indices)
        if self.transport == "nccl" and indices is None:
            return broadcast_nccl(src, dsts, version, timeout)
        if self.transport == "ipc" and indices is None:  # colocated: CUDA IPC to the engine on the same GPU
            send = getattr(importlib.import_module("cluster.weight_transfer"), IPC_SENDER)
            return send(src, dsts, version, timeout, self.bucket_bytes)
        if self.lora_delta and self.transport == "object_store":
            # Merged serving of a LoRA policy: the adapter travels, each engine merges it into its own base.
            return broadcast(src, LearnerMember.get_lora_delta, dsts, EngineMember.load_lora_delta, version,
                             timeout, expect=LearnerMember.merged_sketch, compare=served_as_merged,
                             indices=indices)
        return broadcast(src, LearnerMember.get_packed_weights, dsts, EngineMember.load_weights, version,
                         timeout, fingerprint=fingerprint, indices=indices)


def served_as_merged(report: Mapping[str, Any], expected: Mapping[str, Any]) -> str | None:
    """An adapter-delta sync's check: the engine's served sketches against the learner's
    (Learner.merged_sketch), within the engine's serving dtype's tolerance; what is off, or None."""
    return sketch_mismatch(report["sketch"], expected, report["sketch_rtol"])


def sync_all(syncs: Mapping[str, WeightSync], version: int) -> dict[str, float]:
    """Every policy's sync as `version`. Channels are formed one after another; then policies sync
    concurrently: each one's engines wait for their own weights only (a multi-LoRA group takes its
    adapters one call at a time)."""
    for sync in syncs.values():
        sync.open_channel()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(syncs), thread_name_prefix="sync") as pool:
        outs = list(pool.map(lambda s: s.run(version), syncs.values()))
    out = {"time/sync_s": time.perf_counter() - t0, "sync/bytes": float(sum(o["bytes"] for o in outs)),
           "sync/verified": float(sum(o["verified"] for o in outs))}
    for sync in syncs.values():
        out.update(sync.serving_metrics())
    return out


def resync_through(syncs: Mapping[str, WeightSync]) -> Resync:
    """An EngineGroup's `resync`: catch a replaced engine up on every policy its group serves. `syncs` is read
    at replacement time, so the engine groups can be built before the syncs that feed them."""

    def resync(engines: EngineGroup, index: int) -> None:
        for pid in engines.policies:
            syncs[pid].catch_up(engines, index)

    return resync
