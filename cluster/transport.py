"""Weight transport: rank 0 of a source group → every member of the destination groups, versioned.

The payload travels through the Ray object store once (put by the source actor, fetched by each
destination); in-process groups hand the object over directly. Every destination reports the version it
now serves and, when a fingerprint function is given, the fingerprint of the weights it now serves; the
sender's side fingerprints the payload with the same function. A member that reports another version or
another fingerprint, or misses the deadline, is an error naming it, never a silent continue.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import ray

from cluster.group import Group, GroupTimeout, Pending
from cluster.stop import ray_call

S = TypeVar("S")  # the source member
D = TypeVar("D")  # a destination member
X = TypeVar("X")  # the payload
# A destination's report of a load, a JSON-like record: {"version", "bytes"[, "fingerprint"]}, or what
# `compare` reads (a packed sketch and its tolerance).
Report = Mapping[str, Any]
# (a destination's report, the sender's expectation) -> what is off
Compare = Callable[[Report, Any], "str | None"]


class SyncError(RuntimeError):
    """A destination did not end up on the version that was sent."""


def broadcast(src: Group[S], get: Callable[[S], X], dsts: Sequence[Group[D]],
              load: Callable[[D, X, int], Report], version: int, timeout: float,
              fingerprint: Callable[[X], float] | None = None, indices: Sequence[int] | None = None,
              expect: Callable[[S], Any] | None = None, compare: Compare | None = None) -> dict[str, float]:
    """Send get(src[0]) to every dst member's load(payload, version); `get` and `load` are member methods
    (`Source.method`, `Destination.method`).

    Destination methods return {"version": int, "bytes": int} and, with `fingerprint`, "fingerprint":
    fingerprint(weights they serve). One deadline covers the whole sync. `indices`: only these members of
    each destination (a replaced engine catching up). `expect` (a source member method, in place of
    `fingerprint`): the sender's fingerprint when the payload is not what the destinations end up serving (an
    adapter they merge); it is asked for after the loads were sent, so the source computes it while they load.
    `compare(report, expected)`: a description of the mismatch or None, in place of fingerprint equality (a
    sketch, equal to rounding only).
    Returns {"sync_s", "bytes", "verified"} (verified: members whose fingerprint matched).
    """
    t0 = time.perf_counter()
    deadline = time.monotonic() + timeout
    payload = src.submit_to([0], get).payload(timeout)
    pendings = _submit_loads(payload, not src.local, dsts, load, version, indices, deadline)
    if expect is not None:
        expected: Any = src.submit_to([0], expect).result(_left(deadline))[0]
    else:
        expected = _expected_fingerprint(fingerprint, src, payload, deadline) if fingerprint else None
    moved, verified = collect_reports(pendings, version, expected, deadline, compare)
    return {"sync_s": time.perf_counter() - t0, "bytes": float(moved), "verified": float(verified)}


def _submit_loads(payload: Any, remote: bool, dsts: Sequence[Group[D]], load: Callable[[D, X, int], Report],
                  version: int, indices: Sequence[int] | None,
                  deadline: float) -> list[tuple[Group[Any], Pending[Report]]]:
    """Each destination's load(payload, version) submitted to its members (`indices`, or all): a local group
    gets the payload itself, remote ones one shared object-store copy (put once; the payload as it is when
    the source was remote)."""
    remote_payload = payload if remote else None
    pendings: list[tuple[Group[Any], Pending[Report]]] = []
    for dst in dsts:
        if dst.local:
            arg = payload
            if isinstance(payload, ray.ObjectRef):
                with ray_call():
                    arg = ray.get(payload, timeout=_left(deadline))
        else:
            if remote_payload is None:
                remote_payload = ray.put(payload)  # once, shared by every remote destination
            arg = remote_payload
        every = range(dst.size) if indices is None else indices
        pendings.append((dst, dst.submit_to(every, load, arg, version)))
    return pendings


def collect_reports(pendings: Sequence[tuple[Group[Any], Pending[Report]]], version: int, expected: Any,
                    deadline: float, compare: Compare | None = None) -> tuple[int, int]:
    """Wait for every destination's report; (bytes moved, members verified). Raises SyncError naming the first
    member on another version or, when `expected` is given, with another fingerprint (or, with `compare`,
    whose report it finds off)."""
    moved, verified = 0, 0
    for dst, pending in pendings:
        for i, report in zip(pending.indices, pending.result(_left(deadline)), strict=True):
            if report["version"] != version:
                raise SyncError(
                    f"{dst.name}:{i} reports weight version {report['version']}, expected {version}"
                )
            if expected is not None:
                _check(f"{dst.name}:{i}", report, expected, version, compare)
                verified += 1
            moved += int(report["bytes"])
    return moved, verified


def _left(deadline: float) -> float:
    # A floor keeps an already-finished call collectable after a slow earlier one used the budget up.
    return max(deadline - time.monotonic(), 0.01)


def _expected_fingerprint(
    fingerprint: Callable[[X], float], src: Group[Any], payload: Any, deadline: float
) -> float:
    """The sender's fingerprint, computed where the payload lives: a remote payload is fingerprinted inside
    the source member that produced it, never fetched to the driver. (A task of its own would start a worker
    process for every sync wherever the actors hold the node's CPUs, seconds each, leaving its log files.)"""
    if not isinstance(payload, ray.ObjectRef):
        return fingerprint(payload)
    try:
        # Ray resolves a top-level object ref argument to its value inside the member.
        ref: Any = payload
        return src.run(0, fingerprint, ref).result(_left(deadline))[0]
    except GroupTimeout:
        raise SyncError("fingerprinting the sent weights missed the sync deadline") from None


def _check(member: str, report: Report, expected: Any, version: int, compare: Compare | None) -> None:
    if compare is not None:
        off = compare(report, expected)
        if off is not None:
            raise SyncError(f"{member} after loading version {version}: {off}")
        return
    got = report.get("fingerprint")
    if got != expected:
        raise SyncError(f"{member} serves weights with fingerprint {got!r} after loading version {version}; "
                        f"the sent weights have {expected!r}")

