"""What only a GPU can answer, one JSON line per question (benchmarks/gpu_check.sh runs each under its own
timeout; 15 minutes of one H100 or H200, torch as the machine has it, no Ray or vLLM).

    python -m benchmarks.gpu_questions STEP [--cpu-dry-run]    # STEP: bf16 export c10d receive ipc offload

- bf16: do bf16 DeepSpeed (ZeRO-2) steps apply at the shape whose benchmark logged `OVERFLOW! Skipping step`
  (benchmarks/results/2026-12-04-gpu-check-h200.md: Qwen3-0.6B-shaped, vocabulary 104, LoRA r64, 64 rows ×
  512, micro-batches of 16) and at the real vocabulary 151,936; which gradient goes non-finite first (hooks on
  every parameter, in the order backward produces them).
- export: the ZeRO-3 snapshot's device transient at the Qwen3-4B shape, module by module
  (learners/state/export.py) against gathering every parameter at once (the old snapshot), and the planner's
  `export_transient`.
- c10d: the c10d calls the weight channel's gloo stand-in and NCCL share (TCPStore, a process group of its
  own, broadcast) on CUDA with two ranks on two processes of one GPU: how long until they fail (the evidence
  behind refusing sync.transport=nccl between members on one GPU), and one rank alone as the control.
- receive: receive-side device memory, bucket by bucket (cluster.buckets.receive into the model's tensors)
  against keeping every bucket (`dict(...)` of the stream), at the Qwen3-4B shape in bf16.
- ipc: CUDA IPC of a bucketed state between two processes on one GPU with the project's own sender
  (cluster.weight_transfer.IpcSender → cluster.buckets.open_ipc_bucket): exact bytes, fingerprint, seconds.
- offload: DeepSpeed offload_states / reload_states after an update at the paper's shape (Qwen3-4B, LoRA r64,
  ZeRO-2 bf16): seconds and device memory freed and taken back.

`--cpu-dry-run` runs the same code paths on CPU at tiny shapes (gloo for NCCL, shared memory for IPC), so the
script is known to run before a GPU is lent (tests/benchmarks/test_gpu_questions.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

GIB = float(1 << 30)
TINY = ("builtin:qwen3-0.6b-shape?vocab={vocab}&layers=2&hidden=64&intermediate=128&heads=2&kv_heads=1"
        "&head_dim=32")
SHAPE_06B = "builtin:qwen3-0.6b-shape?vocab={vocab}&max_positions=4096"
SHAPE_4B = "builtin:qwen3-4b-shape?vocab=151936&max_positions=40960"


def _gpu() -> bool:
    return torch.cuda.is_available()


def _allocated() -> int:
    return torch.cuda.memory_allocated() if _gpu() else 0


def _peak_reset() -> None:
    if _gpu():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def _peak() -> int:
    if not _gpu():
        return 0
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated()


def _learner(model: str, settings: list[str], dry: bool):
    from benchmarks.paper_step import make_learner

    bf16 = ["model.dtype=bfloat16", "model.allow_emulated_bf16=true"]
    return make_learner(model, [*bf16, "learner.backend=deepspeed", "learner.role_grad_diagnostics=false",
                                "learner.gradient_checkpointing=true", *settings])


def bf16(dry: bool) -> dict[str, Any]:
    """Applied steps and the first non-finite gradient at the overflowing shape and at the real vocabulary."""
    from benchmarks.paper_step import random_batch

    out: dict[str, Any] = {}
    for vocab in (104, 151936):
        model = (TINY if dry else SHAPE_06B).format(vocab=104 if dry and vocab > 104 else vocab)
        rows, width = (8, 32) if dry else (64, 512)
        learner = _learner(model, ["model.lora.enabled=true", "model.lora.rank=64", "model.lora.alpha=32",
                                   f"learner.max_tokens_per_micro_batch={16 * width}",
                                   f"algo.max_len={width}",
                                   "learner.deepspeed.zero_stage=2"], dry)
        first: list[str] = []
        for name, p in learner.model.named_parameters():
            if p.requires_grad:
                p.register_hook(_nonfinite_recorder(name, first))
        batch, plan = random_batch(model, rows, width)
        steps = [learner.update(batch, plan).step for _ in range(2)]
        engine = learner.backend.engine
        out[f"vocab_{vocab}"] = {"model": model, "optimizer_steps": sum(s.optimizer_steps for s in steps),
                                 "deepspeed_skipped_steps": int(engine.skipped_steps),
                                 "nonfinite_steps": sum(s.nonfinite_steps for s in steps),
                                 "grad_norms": [s.grad_norm for s in steps],
                                 "first_nonfinite_grad": first[0] if first else None,
                                 "nonfinite_grads": len(set(first))}
        del learner, engine
        if _gpu():
            torch.cuda.empty_cache()
    return out


def _nonfinite_recorder(name: str, seen: list[str]) -> Callable[[torch.Tensor], None]:
    """A gradient hook appending `name` to `seen` when the gradient has a non-finite element (hooks fire in
    the order backward produces the gradients: the first entry went non-finite first)."""

    def hook(grad: torch.Tensor) -> None:
        if not torch.isfinite(grad).all():
            seen.append(name)

    return hook


def export(dry: bool) -> dict[str, Any]:
    """The ZeRO-3 snapshot transient, by module against all at once, beside the plan."""
    import deepspeed

    from jobs.models.shape import shape_of
    from learners.compute.memory import LearnerSetup, export_transient
    from learners.state.export import snapshot_by_module

    model = TINY.format(vocab=4096) if dry else SHAPE_4B
    # LoRA keeps the optimizer small on one GPU; the frozen base is partitioned and gathered all the same
    learner = _learner(model, ["learner.deepspeed.zero_stage=3", "learner.max_tokens_per_micro_batch=1024",
                               "algo.max_len=1024", "model.lora.enabled=true", "model.lora.rank=64",
                               "model.lora.alpha=32"], dry)
    learner.backend.build()
    params = list(learner.model.parameters())
    base = _allocated()
    _peak_reset()
    t0 = time.perf_counter()
    snapshot_by_module(learner.model, "p", lambda ps: deepspeed.zero.GatheredParameters(ps), copies=True)
    by_module_s, by_module = time.perf_counter() - t0, _peak() - base
    _peak_reset()
    t0 = time.perf_counter()
    with deepspeed.zero.GatheredParameters(params):
        pass
    whole_s, whole = time.perf_counter() - t0, _peak() - base
    setup = LearnerSetup(tokens=1024, lora_rank=0, zero_stage=3, ranks=1, checkpointing=True,
                         logits_chunk=1024,
                         role_rows=0, device="gpu" if _gpu() else "cpu")
    return {"model": model, "by_module_transient_gib": by_module / GIB, "by_module_s": by_module_s,
            "all_at_once_transient_gib": whole / GIB, "all_at_once_s": whole_s,
            "planned_transient_gib": export_transient(shape_of(model), setup) / GIB,
            "weights_gib": sum(getattr(p, "ds_numel", p.numel()) * p.element_size() for p in params) / GIB}


def _c10d_rank(rank: int, world: int, port: int, backend: str, queue: Any) -> None:
    """One rank of the channel's c10d calls (cluster.buckets.GlooGroup's, ProcessGroupNCCL for nccl)."""
    import datetime

    import torch.distributed as dist

    t0 = time.perf_counter()
    try:
        timeout = datetime.timedelta(seconds=30)
        store = dist.PrefixStore("q", dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0,
                                                    timeout=timeout))
        if backend == "nccl":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            group: Any = dist.ProcessGroupNCCL(store, rank, world, options)
            tensor = torch.full((1 << 20,), float(rank), device="cuda")
        else:
            group = dist.ProcessGroupGloo(store, rank, world, timeout)
            tensor = torch.full((1 << 20,), float(rank))
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        group.broadcast([tensor], opts).wait()
        ok = bool((tensor == 0).all())
        queue.put({"rank": rank, "ok": ok, "s": time.perf_counter() - t0})
    except Exception as e:  # the answer is the failure and how long it took
        queue.put({"rank": rank, "ok": False, "s": time.perf_counter() - t0,
                   "error": f"{type(e).__name__}: {e}"[:300]})


def _spawned(target: Callable[..., None], arg_sets: list[tuple], limit_s: float) -> list[dict[str, Any]]:
    """Run `target(*args, queue)` in one spawned process per arg set; their reports (a missing one: hung)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, queue)) for args in arg_sets]
    for p in procs:
        p.start()
    reports = []
    deadline = time.monotonic() + limit_s
    for _ in procs:
        try:
            reports.append(queue.get(timeout=max(deadline - time.monotonic(), 0.1)))
        except Exception:
            reports.append({"ok": False, "error": f"no report within {limit_s:.0f} s (hung)"})
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
    return reports


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def c10d(dry: bool) -> dict[str, Any]:
    backend = "gloo" if dry else "nccl"
    one = _spawned(_c10d_rank, [(0, 1, _free_port(), backend)], 60)
    t0 = time.perf_counter()
    port = _free_port()
    two = _spawned(_c10d_rank, [(r, 2, port, backend) for r in range(2)], 90)
    return {"backend": backend, "one_rank": one, "two_ranks_one_gpu": two,
            "two_ranks_wall_s": time.perf_counter() - t0}


def _shapes_4b(dry: bool) -> dict[str, tuple[int, ...]]:
    """The HF tensors of a Qwen3-shaped model (tiny for the dry run), in state-dict order."""
    from jobs.models.shape import shape_of

    s = shape_of(TINY.format(vocab=4096) if dry else SHAPE_4B)
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (s.vocab, s.hidden)}
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    for i in range(s.layers):
        p = f"model.layers.{i}."
        out.update({p + "self_attn.q_proj.weight": (q, s.hidden),
                    p + "self_attn.k_proj.weight": (kv, s.hidden),
                    p + "self_attn.v_proj.weight": (kv, s.hidden),
                    p + "self_attn.o_proj.weight": (s.hidden, q),
                    p + "mlp.gate_proj.weight": (s.intermediate, s.hidden),
                    p + "mlp.up_proj.weight": (s.intermediate, s.hidden),
                    p + "mlp.down_proj.weight": (s.hidden, s.intermediate),
                    p + "input_layernorm.weight": (s.hidden,),
                    p + "post_attention_layernorm.weight": (s.hidden,)})
    out["model.norm.weight"] = (s.hidden,)
    return out


class _Replay:
    """A one-process broadcaster: each receive buffer is filled from the sender's tensors (what a broadcast
    writes), so that only the receiving side's memory is measured."""

    def __init__(self, source: list[torch.Tensor]):
        self.source = source

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        tensor.copy_(self.source.pop(0))


def receive(dry: bool) -> dict[str, Any]:
    from cluster import buckets
    from cluster.buckets import Meta

    device = torch.device("cuda" if _gpu() else "cpu")
    shapes = _shapes_4b(dry)
    model = {n: torch.zeros(s, dtype=torch.bfloat16, device=device) for n, s in shapes.items()}
    metas = [Meta(n, s, "bfloat16") for n, s in shapes.items()]
    bucket = (1 << 16) if dry else (1 << 30)
    out: dict[str, Any] = {"model_gib": sum(m.nbytes for m in metas) / GIB, "bucket_mib": bucket / (1 << 20)}
    for mode in ("bucket_by_bucket", "dict"):
        sizes = [sum(m.nbytes for m in b) // 2 for b in buckets.plan(metas, bucket)]
        chunks = [torch.randn(n, device=device, dtype=torch.bfloat16).view(torch.uint8) for n in sizes]
        kept: list[Any] = []

        def load(pairs, kept=kept, mode=mode):
            if mode == "dict":
                kept.extend(pairs)  # what `dict(channel.receive(...))` held until the end
            else:
                for name, tensor in pairs:
                    model[name].copy_(tensor)

        base = _allocated()
        _peak_reset()
        t0 = time.perf_counter()
        buckets.receive(metas, _Replay(chunks), bucket, device, load)
        for name, tensor in kept:
            model[name].copy_(tensor)
        out[mode] = {"peak_above_model_gib": (_peak() - base) / GIB, "s": time.perf_counter() - t0,
                     "buckets": len(buckets.plan(metas, bucket))}
        del kept, chunks
    return out


def _ipc_receiver(device_index: int, queue_in: Any, queue: Any) -> None:
    """The engine's side: opens each bucket, copies it out, fingerprints what it got."""
    from cluster import buckets
    from cluster.fingerprint import Running

    device = torch.device("cuda", device_index) if torch.cuda.is_available() else torch.device("cpu")
    running, got = Running(), 0
    while (info := queue_in.get()) is not None:
        for name, tensor in buckets.open_ipc_bucket(info, device):
            copy = tensor.clone()
            running.add(name, copy)
            got += copy.numel() * copy.element_size()
        queue.put("loaded")
    queue.put({"fingerprint": running.value(), "bytes": got})


def ipc(dry: bool) -> dict[str, Any]:
    import torch.multiprocessing as mp

    from cluster.weight_transfer import IpcSender

    device = torch.device("cuda", 0) if _gpu() else torch.device("cpu")
    g = torch.Generator(device=device).manual_seed(0)
    state = {n: torch.randn(s, generator=g, device=device).to(torch.bfloat16)
             for n, s in _shapes_4b(dry).items()}
    ctx = mp.get_context("spawn")
    to_child, from_child = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_ipc_receiver, args=(device.index or 0, to_child, from_child))
    child.start()
    t0 = time.perf_counter()
    sender = IpcSender(iter(state.items()), 600_000 if dry else (1 << 30), device)  # dry: > the embedding
    n = 0
    while (info := sender.next()) is not None:
        to_child.put(info)
        assert from_child.get(timeout=120) == "loaded"
        n += 1
    to_child.put(None)
    theirs = from_child.get(timeout=120)
    ours = sender.close()
    child.join(timeout=30)
    return {"buckets": n, "bytes": ours["bytes"], "s": time.perf_counter() - t0,
            "gib_per_s": ours["bytes"] / GIB / max(time.perf_counter() - t0, 1e-9),
            "fingerprint_matches": theirs["fingerprint"] == ours["fingerprint"],
            "bytes_match": theirs["bytes"] == ours["bytes"]}


def offload(dry: bool) -> dict[str, Any]:
    from benchmarks.paper_step import random_batch

    model = TINY.format(vocab=4096) if dry else SHAPE_4B
    width = 32 if dry else 4096
    learner = _learner(model, ["model.lora.enabled=true", "model.lora.rank=64", "model.lora.alpha=32",
                               f"learner.max_tokens_per_micro_batch={width}", f"algo.max_len={width}",
                               "learner.deepspeed.zero_stage=2"], dry)
    batch, plan = random_batch(model, 1, width)
    learner.update(batch, plan)
    before = _allocated()
    t0 = time.perf_counter()
    freed = learner.backend.offload_states()
    offload_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    taken = learner.backend.reload_states()
    return {"model": model, "allocated_gib": before / GIB, "freed_gib": freed / GIB, "offload_s": offload_s,
            "reloaded_gib": taken / GIB, "reload_s": time.perf_counter() - t0}


STEPS: dict[str, Callable[[bool], dict[str, Any]]] = {
    "bf16": bf16, "export": export, "c10d": c10d, "receive": receive, "ipc": ipc, "offload": offload}


def environment() -> dict[str, Any]:
    gpu = torch.cuda.get_device_name(0) if _gpu() else "cpu"
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "device": gpu}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=sorted(STEPS))
    parser.add_argument("--cpu-dry-run", action="store_true", help="the same code paths on CPU, tiny shapes")
    args = parser.parse_args(argv)
    if not args.cpu_dry_run and not _gpu():
        parser.error("no CUDA device: use --cpu-dry-run")
    os.environ.setdefault("MARL_CACHE", "/tmp/marl_cache")
    record: dict[str, Any] = {"step": args.step, "dry_run": args.cpu_dry_run, **environment()}
    t0 = time.perf_counter()
    try:
        record.update(STEPS[args.step](args.cpu_dry_run))
        rc = 0
    except Exception as e:  # one line either way: the failure is an answer too
        record["error"] = f"{type(e).__name__}: {e}"[:1000]
        rc = 1
    record["wall_s"] = time.perf_counter() - t0
    print(json.dumps(record, default=str), flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
