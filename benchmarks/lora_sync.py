"""Where a LoRA policy's adapter-delta sync (merged serving, `sync.lora_delta`) spends its time, checked the
way it was (before) and the way it is (after), side by side in one run: the quickstart's policy
(SmolLM2-135M-Instruct, LoRA r16 on every linear layer) and one vLLM engine, in-process, every adapter
matrix moved before each sync so that every layer is merged and reloaded, the two ways taking turns sync by
sync on the same learner and engine.

    .venv/bin/python -m benchmarks.lora_sync [--reps 7] [--model builtin:smollm2-135m-instruct] [--rank 16]
        [--sync-path fast|reload] [--actors]

- before: the learner merges every layer (W0 + scale·B@A) to fingerprint the merge (`merged_fingerprint`,
  while the engine loads); the engine merges the changed layers, loads them, checks that what they serve is
  its merge (a sketch of each loaded tensor through its kernel and one of the tensor itself) and
  fingerprints every served name;
- after (jobs.driver.weight_sync): the learner sketches its merge without merging (`merged_sketch`: sketch(W0)
  kept, plus scale·B@(A@P)); the engine merges and loads as before, reads back the sketches of the loaded
  tensors only through their kernels (the others' kept, `_served_sketches`), and the driver compares the two.
The learner's part overlaps the engine's, so the parts add up to more than the sync.
`--actors`: the sync's phases with the source (benchmarks.rollout_throughput's stand-in for a LoRA
learner) and the engine in Ray actors (benchmarks.sync_phases), two ways taking turns: the adapter
and both sides' sketches as dicts of tensors pickled one by one (before), and each as one packed
buffer (cluster.packing, after).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections import defaultdict
from typing import Any, Protocol

import torch

from benchmarks.timing import timed
from cluster.fingerprint import fingerprint
from cluster.payloads import LoraDelta
from cluster.transport import broadcast
from jobs.config import load_config
from jobs.driver.handles import build_handles
from jobs.driver.weight_sync import served_as_merged
from jobs.models.resolve import resolve_model
from jobs.plan.layout import run_layout
from learners.member import LearnerMember
from marl.policy_map import PolicyMap
from marl.tasks import get_family
from rollout.lora import BaseWeights
from rollout.vllm.engine import _PROCESS_LOCK, _quiet_partial_reload
from rollout.vllm.readback import whole_modules

PARTS = {
    "before": [
        "learner merged_fingerprint",
        "engine load_lora_delta",
        "  merge",
        "  load + sketch check",
        "    sketch check",
    ],
    "after": ["learner merged_sketch", "engine load_lora_delta", "  merge", "  load", "  served sketches"],
}


class Before(Protocol):
    """The check as it was, as methods set on the learner and engine instances (in-process members)."""

    def merged_fingerprint(self) -> float: ...

    def load_lora_delta_before(self, delta: LoraDelta, version: int) -> dict[str, float]: ...


def _merged_fingerprint(learner: Any) -> float:
    return fingerprint(learner.get_weights())


def _load_lora_delta_before(engine: Any, delta: LoraDelta, version: int) -> dict[str, float]:
    changed = engine._base.merged_layers(delta.adapter, changed_only=True)
    engine._merged.update(changed)
    served = engine._base.full(delta.names, engine._merged)
    with _PROCESS_LOCK:
        if changed:
            with _quiet_partial_reload():  # checks what it loads: served sketch against the merged tensor's
                engine._reload({n: served[n] for n in whole_modules(delta.names, list(changed),
                                                                    engine._packed)})
    engine.version = version
    return {"version": version, "bytes": delta.adapter.nbytes, "fingerprint": fingerprint(served)}


def _move_adapter(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            lora_b: Any = getattr(module, "lora_B", None)
            if lora_b is not None:
                w = lora_b["default"].weight
                w.copy_(torch.randn(w.shape, generator=g) * 0.01)


def _instrument(learner: Any, engine: Any, times: dict[str, dict[str, list[float]]], mode: list[str]) -> None:
    """Time each part into times[current mode][part]."""
    def t(name: str, fn: Any) -> Any:
        return lambda *a, **kw: timed(times[mode[0]], name, fn)(*a, **kw)

    learner.merged_sketch = t("learner merged_sketch", learner.merged_sketch)
    learner.merged_fingerprint = t("learner merged_fingerprint", lambda: _merged_fingerprint(learner))
    engine.load_lora_delta = t("engine load_lora_delta", engine.load_lora_delta)
    engine.load_lora_delta_before = t("engine load_lora_delta",
                                      lambda p, v: _load_lora_delta_before(engine, p, v))
    reload = engine._reload
    engine._reload = lambda w, check=True: t("  load + sketch check" if check else "  load", reload)(w, check)
    engine._check_served = t("    sketch check", engine._check_served)
    engine._served_sketches = t("  served sketches", engine._served_sketches)
    merge = BaseWeights.merged_layers
    BaseWeights.merged_layers = lambda self, *a, **kw: t("  merge", merge)(self, *a, **kw)  # type: ignore


def actor_phases(args: argparse.Namespace) -> None:
    """An adapter-delta sync between actors (the source:
    benchmarks.rollout_throughput's stand-in for a LoRA learner;
    one vLLM engine), phase by phase (benchmarks.sync_phases), two ways taking turns sync by sync: the
    adapter, the learner's sketch and the engine's sketches as dicts of tensors, each pickled apart (before),
    and each as one packed buffer (cluster.packing, after)."""
    import ray

    from benchmarks.rollout_throughput import _LoraSource, _rollout_cfg
    from benchmarks.sync_phases import StampedEngine, one_sync, print_phases
    from cluster.group import Group
    from marl.engine_map import EngineMap
    from rollout.engine import EngineMember
    from rollout.engine_group import EngineGroup

    ray.init(address="local", num_cpus=2, include_dashboard=False)
    path = resolve_model(args.model)
    (spec,) = EngineMap.build(PolicyMap.shared(["bench"], "pi"), "bench").groups
    bench = argparse.Namespace(model=args.model, threads=2, kv_cache_gb=1.0, lora_rank=args.rank)
    cfg = _rollout_cfg(bench, lora=True, sync_path=args.sync_path, lora_serving="single")
    engine = EngineGroup(spec, path, cfg.rollout, "float32", engine_cls=StampedEngine)
    src = Group(_LoraSource, 0, "bench:source", per_member_kwargs=[{"path": path, "lora": cfg.model.lora}])
    ways = {"dicts (before)": (_LoraSource.get_lora_delta_dict, _LoraSource.merged_sketch_dict),
            "packed (after)": (_LoraSource.get_lora_delta, _LoraSource.merged_sketch)}
    phases: dict[str, list[dict[str, float]]] = {way: [] for way in ways}
    # the first of each way: the engine reads its base, sketches all
    for version in range(1, 3 + 2 * args.reps):
        way = list(ways)[version % 2]
        get, sketch = ways[way]
        expect = functools.partial(_source_sketch, src, sketch)
        phases[way].append(one_sync(src, get, engine.group, EngineMember.load_lora_delta, expect,
                                    _merged_as_expected, version))
    engine.shutdown()
    src.shutdown()
    print_phases(f"adapter-delta sync between actors, {args.model} LoRA r{args.rank}, {args.sync_path} path, "
                 f"median of {args.reps} each:", phases)


def _source_sketch(src: Any, sketch: Any, ref: Any) -> Any:  # noqa: ARG001 - the source holds what it sent
    return src.submit_to([0], sketch).result(600)[0]


def _merged_as_expected(report: dict, expected: Any) -> None:
    off = served_as_merged(report, expected)
    assert off is None, off


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--model", default="builtin:smollm2-135m-instruct")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--sync-path", choices=("fast", "reload"), default="fast")
    parser.add_argument("--actors", action="store_true", help="the sync's phases between Ray actors")
    args = parser.parse_args()
    if args.actors:
        actor_phases(args)
        return
    cfg = load_config("jobs/configs/quickstart.yaml", [
        "out_dir=/tmp/marl-lora-sync", f"model.path={args.model}", f"model.lora.rank={args.rank}",
        f"model.lora.alpha={2 * args.rank}", "rollout.engines_per_role=0", "learner.ranks=0",
        f"rollout.vllm.sync_path={args.sync_path}", "marl.sharing=shared"])
    handles = build_handles(run_layout(cfg), resolve_model(cfg.model.path), get_family("math"))
    try:
        (learners,), (engines,) = handles.learners.values(), handles.engines.values()
        learner, engine = learners.group._members[0], engines.group._members[0]
        times: dict[str, dict[str, list[float]]] = {"before": defaultdict(list), "after": defaultdict(list)}
        mode = ["after"]
        _instrument(learner, engine, times, mode)
        _move_adapter(learner.model, 0)
        handles.sync(1)  # warm-up: the engine reads its base weights, vLLM sets up its reload
        total: dict[str, list[float]] = {"before": [], "after": []}
        for version in range(2, 2 + 2 * args.reps):
            mode[0] = "before" if version % 2 else "after"
            _move_adapter(learner.model, version)
            t0 = time.perf_counter()
            if mode[0] == "after":
                out = handles.sync(version)
                assert out["sync/verified"] == 1.0
            else:
                load: Any = Before.load_lora_delta_before  # set on the in-process engine (`_instrument`)
                expect: Any = Before.merged_fingerprint  # and on the learner
                out = broadcast(
                    learners.group,
                    LearnerMember.get_lora_delta,
                    [engines.group],
                    load,
                    version,
                    600.0,
                    expect=expect,
                )
                assert out["verified"] == 1.0
            total[mode[0]].append(time.perf_counter() - t0)
        _print(args, times, total)
    finally:
        handles.shutdown()


def _print(
    args: argparse.Namespace, times: dict[str, dict[str, list[float]]], total: dict[str, list[float]]
) -> None:
    whole = {m: statistics.median(total[m]) for m in total}
    print(
        f"adapter-delta sync, {args.model} LoRA r{args.rank}, {args.sync_path} path, median of {args.reps} "
        "each: "
        f"before {whole['before']:.3f} s, after {whole['after']:.3f} s "
        f"({whole['before'] / whole['after']:.2f}x)"
    )
    for m in ("before", "after"):
        print(f"  {m}:")
        for name in PARTS[m]:
            part = statistics.median(times[m][name]) if times[m][name] else float("nan")
            print(f"    {name:28s} {part:7.3f} s  {part / whole[m]:6.1%}")


if __name__ == "__main__":
    main()
