"""Where a LoRA policy's adapter-delta sync (merged serving, `sync.lora_delta`) spends its time: the quickstart's
policy (SmolLM2-135M-Instruct, LoRA r16 on every linear layer) and one vLLM engine, in-process, every adapter
matrix moved before each sync so that every layer is merged and reloaded. Prints the median of each part and its
share of the whole sync, side by side.

    .venv/bin/python -m benchmarks.lora_sync [--reps 7] [--model builtin:smollm2-135m-instruct] [--rank 16]
        [--sync-path fast|reload]

Parts: the learner's adapter payload (`get_lora_delta`), its merged fingerprint (`merged_fingerprint`: the full
merge W0 + scale·B@A and its rounding norms, computed while the engine loads), and inside the engine the merge of
the changed layers, their load (in place or vLLM's reload: `rollout.vllm_sync_path`) and the sketch check of
what they serve. The learner's
fingerprint overlaps the engine's work, so the parts add up to more than the sync.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from typing import Any

import torch

from benchmarks.timing import timed
from jobs.config import load_config
from jobs.models import resolve_model
from jobs.system import build_system
from marl.policy_map import PolicyMap
from marl.tasks import get_family
from rollout.lora import BaseWeights


def _move_adapter(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            lora_b: Any = getattr(module, "lora_B", None)
            if lora_b is not None:
                w = lora_b["default"].weight
                w.copy_(torch.randn(w.shape, generator=g) * 0.01)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--model", default="builtin:smollm2-135m-instruct")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--sync-path", choices=("fast", "reload"), default="fast")
    args = parser.parse_args()
    cfg = load_config("jobs/configs/quickstart.yaml", [
        "out_dir=/tmp/marl-lora-sync", f"model.path={args.model}", f"model.lora.rank={args.rank}",
        f"model.lora.alpha={2 * args.rank}", "rollout.engines_per_role=0", "learner.ranks=0",
        f"rollout.vllm_sync_path={args.sync_path}"])
    system = build_system(cfg, resolve_model(cfg.model.path), PolicyMap.build("shared", ["generator"]),
                          get_family("math"))
    try:
        (learners,), (engines,) = system.learners.values(), system.engines.values()
        learner, engine = learners.group._members[0], engines.group._members[0]
        times: dict[str, list[float]] = defaultdict(list)
        for name in ("get_lora_delta", "merged_fingerprint"):
            setattr(learner, name, timed(times, f"learner {name}", getattr(learner, name)))
        engine.load_lora_delta = timed(times, "engine load_lora_delta", engine.load_lora_delta)
        engine._reload = timed(times, "  load + sketch check", engine._reload)
        engine._check_served = timed(times, "    sketch check", engine._check_served)
        BaseWeights.merged_layers = timed(times, "  merge", BaseWeights.merged_layers)  # type: ignore[method-assign]
        _move_adapter(learner.model, 0)
        system.sync(1)  # warm-up: the engine reads its base weights, vLLM sets up its reload
        times.clear()
        total = []
        for version in range(2, 2 + args.reps):
            _move_adapter(learner.model, version)
            t0 = time.perf_counter()
            out = system.sync(version)
            total.append(time.perf_counter() - t0)
            assert out["sync/verified"] == 1.0
        whole = statistics.median(total)
        print(f"adapter-delta sync, {args.model} LoRA r{args.rank}, median of {args.reps}: {whole:.3f} s "
              f"({out['sync/bytes'] / 2**20:.1f} MiB sent)")
        order = ["learner get_lora_delta", "learner merged_fingerprint", "engine load_lora_delta", "  merge",
                 "  load + sketch check", "    sketch check"]
        for name in order:
            part = statistics.median(times[name])
            print(f"  {name:28s} {part:7.3f} s  {part / whole:6.1%}")
    finally:
        system.shutdown()


if __name__ == "__main__":
    main()
