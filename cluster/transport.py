"""Weight transport: rank 0 of a source group → every member of the destination groups, versioned.

The payload travels through the Ray object store once (put by the source actor, fetched by each
destination); in-process groups hand the object over directly. Every destination reports the version it
now serves; a member that reports another version is an error naming it, never a silent continue.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import ray

from cluster.group import Group


class SyncError(RuntimeError):
    """A destination did not end up on the version that was sent."""


def broadcast(src: Group, src_method: str, dsts: Sequence[Group], dst_method: str, version: int,
              timeout: float) -> dict[str, float]:
    """Send src[0].<src_method>() to every dst member's <dst_method>(payload, version).

    Destination methods return {"version": int, "bytes": int}. Returns {"sync_s", "bytes"}.
    """
    t0 = time.perf_counter()
    payload = src.submit(src_method, indices=[0]).payload(timeout)
    remote_payload = payload if not src.local else None
    pendings = []
    for dst in dsts:
        if dst.local:
            arg = ray.get(payload, timeout=timeout) if isinstance(payload, ray.ObjectRef) else payload
        else:
            if remote_payload is None:
                remote_payload = ray.put(payload)  # once, shared by every remote destination
            arg = remote_payload
        pendings.append((dst, dst.submit(dst_method, arg, version)))
    moved = 0
    for dst, pending in pendings:
        for i, report in enumerate(pending.result(timeout)):
            if report["version"] != version:
                raise SyncError(f"{dst.name}:{i} reports weight version {report['version']}, expected {version}")
            moved += int(report["bytes"])
    return {"sync_s": time.perf_counter() - t0, "bytes": float(moved)}


def payload_bytes(state: dict[str, Any]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())
