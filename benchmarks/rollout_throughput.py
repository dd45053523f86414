"""Rollout throughput side by side, and weight-sync cost by payload size.

    .venv/bin/python -m benchmarks.rollout_throughput [--model builtin:smollm2-135m-instruct] [--prompts 16]
        [--n 4] [--tokens 128] [--reps 3] [--threads 2] [--lora-rank 64]

One workload for all three engines: `prompts` chat requests x `n` samples (sent as prompts x n requests, each
with its own seed), at most `tokens` new tokens (stopping at eos; counted are tokens actually generated),
temperature 1, logprobs of the sampled tokens:
  - ours:      EngineGroup.generate -> one VLLMEngine in a Ray actor (what the Collector calls per role),
  - vllm.LLM:  a bare vllm.LLM in this process, vLLM's defaults plus the settings CPU needs,
  - HFEngine:  transformers generate (the CPU stand-in), in this process.
Every engine gets the same cores. Medians over `reps` after one warm-up call. Engines run one at a time.
Then sync: the time of one verified broadcast (object store, fingerprint on both sides) into the engine
actor, for the full weights and for a LoRA adapter (multi-LoRA serving), against the bytes moved.
`--sync-only`: full-weight syncs into a vLLM engine actor through vLLM's reload
(rollout.vllm.sync_path=reload) and in place (fast), the payload packed into one buffer first
(before) or shared, each tensor's bytes copied into the object store once (after), into the HF
stand-in, a LoRA adapter-delta sync (merged serving) both ways, and the parts of a load inside an
in-process vLLM engine, in one run.
"""

from __future__ import annotations

import os

# The bare engine runs in this process, and OpenMP reads its wait policy once, when torch loads it: the
# settings the engine actors get (rollout.vllm.support.engine_env) must be in place before torch is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import dataclasses  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

from cluster.payloads import LoraDelta
from jobs.config import load_config
from jobs.config.schema import TrainConfig
from jobs.driver.weight_sync import served_as_merged
from jobs.models.resolve import resolve_model
from marl.engine_map import EngineMap
from marl.policy_map import PolicyMap
from rollout.engine import EngineMember, Sampling
from rollout.vllm.support import cpu_bind, default_cache_root, engine_env


def _requests(prompts: int, n: int) -> list[list[dict]]:
    return [[{"role": "user", "content": f"What is {i} + {i + 3}? Explain step by step."}]
            for i in range(prompts) for _ in range(n)]


def _median_rate(run: Callable[[int], int], reps: int, name: str) -> float:
    run(-1)  # warm-up
    rates = []
    for r in range(reps):
        t0 = time.perf_counter()
        tokens = run(r)
        rates.append(tokens / (time.perf_counter() - t0))
        print(f"# {name} rep {r}: {tokens} tokens, {rates[-1]:.1f} tokens/s", flush=True)  # partial results
    return statistics.median(rates)


def _rollout_cfg(args: argparse.Namespace, lora: bool, backend: str = "vllm", sync_path: str = "fast",
                 lora_serving: str = "multi") -> Any:
    overrides = [f"model.path={args.model}", f"rollout.backend={backend}", "rollout.engines_per_role=1",
                 f"rollout.vllm.sync_path={sync_path}",
                 f"rollout.torch_threads={args.threads}", f"rollout.vllm.kv_cache_gb={args.kv_cache_gb}",
                 "rollout.max_batch_size=1024", "rollout.engine_num_cpus=0",
                 # no tasks drawn; the schema needs one
                 "data.train=digit", "data.train_size=1", "data.eval_size=0"]
    if lora:
        overrides += ["model.lora.enabled=true", f"model.lora.rank={args.lora_rank}",
                      f"rollout.lora_serving={lora_serving}"]
    return load_config(None, overrides)


def bench_ours(path: str, args: argparse.Namespace, requests: list, sampling: Sampling) -> tuple[float, dict]:
    """Throughput through EngineGroup, then a verified full-weight sync into the same engine."""
    from rollout.engine_group import EngineGroup

    (spec,) = EngineMap.build(PolicyMap.shared(["bench"], "pi"), "bench").groups
    group = EngineGroup(spec, path, _rollout_cfg(args, lora=False).rollout, "float32")
    try:
        def run(seed: int) -> int:
            batch = requests[:2] if seed < 0 else requests
            out = asyncio.run(
                group.generate(batch, Sampling(sampling.temperature, 1.0, sampling.max_new_tokens, seed=seed))
            )
            return sum(len(c.response_ids) for c in out)

        rate = _median_rate(run, args.reps, "ours")
        from transformers import AutoModelForCausalLM

        weights = AutoModelForCausalLM.from_pretrained(path).state_dict()
        return rate, _sync_seconds(group, _Source.get_packed, EngineMember.load_weights, weights, args.reps)
    finally:
        group.shutdown()


def bench_full_sync(path: str, weights: dict, args: argparse.Namespace) -> tuple[dict[str, dict], dict]:
    """Full-weight syncs into one engine actor, side by side: into a vLLM engine through vLLM's reload_weights
    and in place (rollout.vllm.repack); shared (cluster.packing.share: the tensors' own bytes copied into the
    object store once, what learners send now), packed into one buffer first (cluster.packing.pack: a copy,
    then the store's copy, as learners sent before) and as a dict of tensors; and into the HF stand-in (a copy
    into its parameters, no kernel repacking). Then, on the in-place engine, packed and shared taking turns,
    phase by phase (benchmarks.sync_phases)."""
    from benchmarks.sync_phases import StampedEngine
    from rollout.engine_group import EngineGroup

    (spec,) = EngineMap.build(PolicyMap.shared(["bench"], "pi"), "bench").groups
    gets = {"shared": _Source.get_shared, "packed": _Source.get_packed, "dict": _Source.get_weights}
    out, phases = {}, {}
    for backend, sync_path, payloads in (
        ("vllm", "reload", ("shared",)),
        ("vllm", "fast", ("packed", "shared")),
        ("hf", "fast", ("packed", "shared", "dict")),
    ):
        cfg = _rollout_cfg(args, lora=False, backend=backend, sync_path=sync_path).rollout
        stamped = backend == "vllm" and sync_path == "fast"
        group = EngineGroup(spec, path, cfg, "float32", engine_cls=StampedEngine if stamped else None)
        label = f"vllm {sync_path}" if backend == "vllm" else backend
        try:
            for name in payloads:
                out[f"{label}, {name}"] = _sync_seconds(group, gets[name], EngineMember.load_weights, weights,
                                                        args.reps)
            if stamped:
                phases = _full_sync_phases(group, weights, args.reps)
        finally:
            group.shutdown()
    return out, phases


def _full_sync_phases(group: Any, weights: dict, reps: int) -> dict[str, list[dict[str, float]]]:
    """Packed (before) and shared (after) full-weight syncs taking turns on `group`'s
    StampedEngine, phases each."""
    from benchmarks.sync_phases import one_sync
    from cluster.fingerprint import fingerprint
    from cluster.group import Group

    src = Group(_Source, 0, "bench:source", per_member_kwargs=[{"payload": weights}])
    ways = {"packed (before)": _Source.get_packed, "shared (after)": _Source.get_shared}
    phases: dict[str, list[dict[str, float]]] = {way: [] for way in ways}
    for version in range(1, 3 + 2 * reps):
        way = list(ways)[version % 2]
        phases[way].append(
            one_sync(
                src,
                ways[way],
                group.group,
                EngineMember.load_weights,
                lambda ref: src.run(0, fingerprint, ref).result(600)[0],
                _same_fingerprint,
                100 + version,
            )
        )
    src.shutdown()
    return phases


def _same_fingerprint(report: dict, expected: float) -> None:
    assert report["fingerprint"] == expected, (report["fingerprint"], expected)


def bench_lora_delta(path: str, args: argparse.Namespace) -> dict[str, dict]:
    """Merged serving of a LoRA policy (sync.lora_delta): the adapter travels, the engine actor merges it into
    its base and loads the merged layers; every layer's adapter changes before each sync. vLLM's reload and in
    place; checked as jobs.driver.weight_sync does, the sender's sketch taken as Learner.merged_sketch's (the
    parts, and the check as it was, side by side: benchmarks/lora_sync.py)."""
    from rollout.engine_group import EngineGroup

    (spec,) = EngineMap.build(PolicyMap.shared(["bench"], "pi"), "bench").groups
    out = {}
    for sync_path in ("reload", "fast"):
        cfg = _rollout_cfg(args, lora=True, sync_path=sync_path, lora_serving="single")
        group = EngineGroup(spec, path, cfg.rollout, "float32")
        try:
            out[f"vllm {sync_path}, LoRA r{args.lora_rank} delta"] = _delta_sync_seconds(
                group, path, cfg, args.reps
            )
        finally:
            group.shutdown()
    return out


def _delta_sync_seconds(group: Any, path: str, cfg: TrainConfig, reps: int) -> dict:
    from cluster.group import Group
    from cluster.transport import broadcast

    src = Group(_LoraSource, 0, "bench:source", per_member_kwargs=[{"path": path, "lora": cfg.model.lora}])
    outs = [
        _with_load(
            broadcast(
                src,
                _LoraSource.get_lora_delta,
                [group.group],
                EngineMember.load_lora_delta,
                v + 1,
                600.0,
                expect=_LoraSource.merged_sketch,
                compare=served_as_merged,
            )
        )
        for v in range(reps + 1)
    ][1:]
    src.shutdown()
    return _medians(outs)


class _LoraSource:
    """Stands in for a LoRA learner's rank 0: every call moves every B matrix (a new adapter per sync)."""

    def __init__(self, path: str, lora: Any):
        from learners.state.weights import MergedSketch, load_policy_model, merge_for_serving

        self.model, self.calls = load_policy_model(path, "float32", lora), 0
        self.names = list(merge_for_serving(self.model)[0])
        self.sketch = MergedSketch()

    def get_lora_delta(self) -> LoraDelta:
        import torch

        from learners.state.weights import adapter_payload

        self.calls += 1
        g = torch.Generator().manual_seed(self.calls)
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=g) * 1e-3)
        return LoraDelta(adapter_payload(self.model, "pi"), self.names)

    def merged_sketch(self) -> Any:
        from cluster.packing import pack

        return pack(self.sketch(self.model))  # as Learner.merged_sketch

    def get_lora_delta_dict(self) -> LoraDelta:
        """`get_lora_delta` as learners sent it before: every adapter tensor pickled apart (the engine then
        replies with a dict of sketches too)."""
        from benchmarks.sync_phases import as_dict

        delta = self.get_lora_delta()
        adapter = dataclasses.replace(delta.adapter, tensors=as_dict(delta.adapter.tensors))
        return LoraDelta(adapter, delta.names)

    def merged_sketch_dict(self) -> dict:
        return self.sketch(self.model)  # a dict of tensors, as learners sent it before


def bench_lora_sync(path: str, args: argparse.Namespace) -> dict:
    """A verified LoRA-only sync of one adapter of rank `lora_rank` on all linear layers."""
    from learners.state.weights import adapter_payload, load_policy_model
    from rollout.engine_group import EngineGroup

    cfg = _rollout_cfg(args, lora=True)
    payload = adapter_payload(load_policy_model(path, "float32", cfg.model.lora), "pi")
    (spec,) = EngineMap.build(PolicyMap.shared(["bench"], "pi"), "bench", multi_lora=True).groups
    group = EngineGroup(spec, path, cfg.rollout, "float32", lora_rank=args.lora_rank)
    try:
        return _sync_seconds(group, _Source.get_adapter, EngineMember.load_adapter, payload, args.reps)
    finally:
        group.shutdown()


class _Source:
    """Stands in for learner rank 0: hands out a fixed payload."""

    def __init__(self, payload):
        self.payload = payload

    def get_weights(self):
        return self.payload

    def get_adapter(self):
        return self.payload

    def get_packed(self):
        from cluster.packing import pack

        # as Learner.get_packed_weights did: one copy into one buffer, on every call
        return pack(self.payload)

    def get_shared(self):
        from cluster.packing import share

        # as Learner.get_packed_weights: the tensors' own bytes, the store's copy only
        return share(self.payload)


def _sync_seconds(group, src_method, dst_method, payload, reps: int) -> dict:
    from cluster.fingerprint import fingerprint
    from cluster.group import Group
    from cluster.transport import broadcast
    from rollout.lora import adapter_fingerprint

    check = adapter_fingerprint if dst_method is EngineMember.load_adapter else fingerprint
    src = Group(_Source, 0, "bench:source", per_member_kwargs=[{"payload": payload}])
    outs = [_with_load(broadcast(src, src_method, [group.group], dst_method, v + 1, 600.0, fingerprint=check))
            for v in range(reps + 1)][1:]  # the first includes one-off costs (e.g. vLLM's LoRA set-up)
    src.shutdown()
    return _medians(outs)


def _with_load(out: dict) -> dict:
    """A sync's result and the box's 1-minute load average right after it (the box is shared: noise shows)."""
    return {**out, "load": os.getloadavg()[0]}


def _medians(outs: list[dict]) -> dict:
    return {"bytes": outs[0]["bytes"], "sync_s": statistics.median(o["sync_s"] for o in outs),
            "load": statistics.median(o["load"] for o in outs)}


def bench_bare_vllm(path: str, args: argparse.Namespace, requests: list, sampling: Sampling) -> float:
    from transformers import AutoTokenizer

    for key, value in engine_env(
        cpu_bind(0, args.threads, os.cpu_count() or 1), default_cache_root()
    ).items():
        os.environ.setdefault(key, value)  # the engine actor's environment, for the same cores and settings
    from vllm import LLM, SamplingParams

    tokenizer = AutoTokenizer.from_pretrained(path)
    llm = LLM(model=path, dtype="float32", enforce_eager=True, distributed_executor_backend="uni",
              kv_cache_memory_bytes=int(args.kv_cache_gb * 2**30))
    prompts = [
        {
            "prompt_token_ids": tokenizer.apply_chat_template(
                m, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        }
        for m in requests
    ]

    def run(seed: int) -> int:
        batch = prompts[:2] if seed < 0 else prompts
        params = [SamplingParams(temperature=sampling.temperature, max_tokens=sampling.max_new_tokens,
                                 seed=max(seed, 0) * 100_003 + i, logprobs=0) for i in range(len(batch))]
        return sum(len(o.outputs[0].token_ids) for o in llm.generate(batch, params, use_tqdm=False))

    # the engine goes with this frame, before the HF engine loads
    return _median_rate(run, args.reps, "vllm.LLM")


def bench_hf(path: str, args: argparse.Namespace, requests: list, sampling: Sampling) -> float:
    from rollout.hf_engine import HFEngine

    engine = HFEngine(path, torch_threads=args.threads)

    def run(seed: int) -> int:
        batch = requests[:2] if seed < 0 else requests
        s = Sampling(sampling.temperature, 1.0, sampling.max_new_tokens, seed=max(seed, 0))
        return sum(len(c.response_ids) for c in engine.generate(batch, s))

    return _median_rate(run, args.reps, "HFEngine")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kv-cache-gb", type=float, default=1.0)
    parser.add_argument("--lora-rank", type=int, default=64)
    parser.add_argument("--no-hf", action="store_true", help="skip HFEngine (minutes per repetition on CPU)")
    parser.add_argument("--bare-only", action="store_true", help="only the bare vllm.LLM")
    parser.add_argument("--sync-only", action="store_true",
                        help="only full-weight syncs (dict vs packed) into an engine actor, and their parts")
    args = parser.parse_args()
    if args.sync_only:
        _sync_only(args)
        return
    if args.bare_only:
        path = resolve_model(args.model)
        rate = bench_bare_vllm(path, args, _requests(args.prompts, args.n), Sampling(1.0, 1.0, args.tokens))
        print(f"vllm.LLM (bare): {rate:.1f} tokens/s")
        return
    import ray

    ray.init(address="local", num_cpus=max(os.cpu_count() or 1, 2), include_dashboard=False)
    path = resolve_model(args.model)
    requests, sampling = _requests(args.prompts, args.n), Sampling(1.0, 1.0, args.tokens)
    ours, full_sync = bench_ours(path, args, requests, sampling)
    lora_sync = bench_lora_sync(path, args)
    ray.shutdown()
    rates = {"ours (EngineGroup)": ours, "vllm.LLM (bare)": bench_bare_vllm(path, args, requests, sampling)}
    if not args.no_hf:
        rates["HFEngine"] = bench_hf(path, args, requests, sampling)
    _report(args, rates, full_sync, lora_sync)


def _sync_only(args: argparse.Namespace) -> None:
    import ray

    from benchmarks.sync_phases import print_phases
    from cluster.packing import share

    ray.init(address="local", num_cpus=max(os.cpu_count() or 1, 2), include_dashboard=False)
    from transformers import AutoModelForCausalLM

    path = resolve_model(args.model)
    weights = AutoModelForCausalLM.from_pretrained(path).state_dict()
    syncs, phases = bench_full_sync(path, weights, args)
    syncs.update(bench_lora_delta(path, args))
    ray.shutdown()
    print(f"{args.model}: verified syncs into one engine actor, median of {args.reps} after warm-up")
    for name, s in syncs.items():
        _print_sync(name, s)
    stored = sum(b.nbytes for b in share(weights).buffers)
    print(
        f"  (shared: {stored / 2**20:.1f} MiB cross the object store, a tied weight once; MiB/s counts every "
        "weight delivered)"
    )
    reload, packed, shared = (
        syncs[f"vllm {k}"]["sync_s"] for k in ("reload, shared", "fast, packed", "fast, shared")
    )
    print(
        f"  vllm full weights: reload / fast = {reload / shared:.2f}x, packed / shared = "
        f"{packed / shared:.2f}x"
    )
    delta = [s["sync_s"] for name, s in syncs.items() if "delta" in name]
    print(f"  vllm LoRA delta: reload / fast = {delta[0] / delta[1]:.2f}x")
    print_phases(f"full weights into the vLLM engine actor (fast path), the two ways taking turns, median of "
                 f"{args.reps} each:", phases)


def _report(args: argparse.Namespace, rates: dict[str, float], full: dict, lora: dict) -> None:
    bare, hf = rates["vllm.LLM (bare)"], rates.get("HFEngine", float("nan"))
    print(
        f"{args.model}: {args.prompts} prompts x {args.n} samples x <= {args.tokens} new tokens, logprobs "
        "on, "
        f"{args.threads} threads, median of {args.reps} after warm-up"
    )
    print(f"  {'engine':<20} {'tokens/s':>10} {'x bare vLLM':>12} {'x HFEngine':>11}")
    for name, rate in rates.items():
        print(f"  {name:<20} {rate:10.1f} {rate / bare:12.2f} {rate / hf:11.2f}")
    print(f"ours / bare vLLM = {rates['ours (EngineGroup)'] / bare:.2f} (target >= 0.8); "
          f"bare vLLM / HFEngine = {bare / hf:.2f}")
    for name, s in (("full weights", full), (f"LoRA adapter r={args.lora_rank}", lora)):
        _print_sync(name, s)


def _print_sync(name: str, s: dict) -> None:
    print(f"  sync {name:<30} {s['bytes'] / 2**20:9.1f} MiB {s['sync_s']:8.3f} s "
          f"{s['bytes'] / 2**20 / s['sync_s']:9.1f} MiB/s   load average {s['load']:4.1f}")


if __name__ == "__main__":
    main()
