"""Where one weight sync between Ray actors spends its time, phase by phase: the driver stamps when it asks
the source for the payload, when the payload is in the object store and when the engine's report is back; the
engine (`StampedEngine`, a vLLM engine whose sync methods say when they started and ended, wall clock,
comparable across the node's processes, and how long their parts took) stamps the rest. So fetching and
unpickling the payload (call sent → method started) and sending the report back (method ended → report in the
driver) show apart from the load itself. Used by benchmarks.lora_sync --actors (an adapter delta) and
benchmarks.rollout_throughput --sync-only (full weights), each way of syncing taking turns with the other,
sync by sync, on the same actors.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

from torch import Tensor

from benchmarks.timing import timed
from cluster.packing import PackedTensors
from cluster.payloads import LoraDelta
from rollout.lora import BaseWeights
from rollout.vllm.engine import VLLMEngine


class StampedEngine(VLLMEngine):
    """A vLLM engine whose reports of load_weights and load_lora_delta carry "start" and "end" (time.time())
    and "parts": seconds of the load's parts in this call (merge, load, sketch check or served sketches)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        parts: dict[str, list[float]] = {}
        self.parts = parts
        self._reload = timed(parts, "load", self._reload)  # type: ignore[method-assign]
        check_served = timed(parts, "  of which sketch check", self._check_served)
        self._check_served = check_served  # type: ignore[method-assign]
        served_sketches = timed(parts, "served sketches", self._served_sketches)
        self._served_sketches = served_sketches  # type: ignore[method-assign]
        merge = BaseWeights.merged_layers  # this actor's process holds this one engine: its class, timed
        timed_merge = timed(parts, "merge", merge)
        BaseWeights.merged_layers = timed_merge  # type: ignore[method-assign]

    def load_weights(self, weights: Mapping[str, Any], version: int) -> dict[str, Any]:
        return self._stamped(super().load_weights, weights, version)

    def load_lora_delta(self, delta: LoraDelta, version: int) -> dict[str, Any]:
        report = self._stamped(super().load_lora_delta, delta, version)
        if not isinstance(delta.adapter.tensors, PackedTensors):  # sent as before: reply as engines did then,
            # one tensor of its own per sketch
            report["sketch"] = {k: v.clone() for k, v in report["sketch"].items()}
        return report

    def _stamped(self, load: Callable[[Any, int], Mapping[str, Any]], payload: Any,
                 version: int) -> dict[str, Any]:
        self.parts.clear()
        start = time.time()
        report = load(payload, version)
        return {
            **report,
            "start": start,
            "end": time.time(),
            "parts": {k: sum(v) for k, v in self.parts.items()},
        }


def as_dict(tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The packed tensors as a dict of tensors of their own (each pickled apart, as payloads were before)."""
    return {k: v.clone() for k, v in tensors.items()}


def one_sync(src: Any, get: Callable, engines: Any, load: Callable, expect: Callable[[Any], Any],
             check: Callable[[dict, Any], None], version: int) -> dict[str, float]:
    """One sync, phase by phase (seconds), and the box's load average after it: get(source member) → the
    payload in the store; load(engine member, payload, version) on member 0 of `engines` (a
    cluster.Group of StampedEngine);
    expect(payload as the driver holds it, an object ref) computed in the source while the engine loads;
    check(report, expected)."""
    t0 = time.time()
    ref = src.submit_to([0], get).payload(600)
    src.run(0, _ready, ref).result(600)  # the payload is in the object store
    t1 = time.time()
    pending = engines.submit_to([0], load, ref, version)
    expected = expect(ref)
    t2 = time.time()
    report = pending.result(600)[0]
    t3 = time.time()
    check(report, expected)
    t4 = time.time()
    return dict((("source: payload out, in the object store", t1 - t0),
                 ("source: expected check value (while the engine loads)", t2 - t1),
                 ("engine: payload fetched and unpickled", report["start"] - t1),
                 ("engine: load call", report["end"] - report["start"]),
                 *((f"  {part}", s) for part, s in report["parts"].items()),
                 ("engine: report back (pickled, fetched)", t3 - report["end"]),
                 ("driver: check", t4 - t3), ("whole sync", t4 - t0),
                 ("(load average over 1 min, not s)", os.getloadavg()[0])))


def _ready(payload: Any) -> None:
    """Runs in the source member: its argument, an object ref, is resolved only once the payload is stored."""


def print_phases(title: str, phases: Mapping[str, list[dict[str, float]]]) -> None:
    """Median seconds of each phase, one column per way of syncing (the first sync of each way left out)."""
    ways = list(phases)
    names = list(dict.fromkeys(n for w in ways for sync in phases[w] for n in sync))
    print(title)
    print(f"  {'phase, median s':56s}" + "".join(f"{w:>16s}" for w in ways))
    for name in names:
        cells = [statistics.median(s[name] for s in phases[w][1:] if name in s) if any(
            name in s for s in phases[w][1:]) else float("nan") for w in ways]
        print(f"  {name:56s}" + "".join(f"{c:16.3f}" for c in cells))
