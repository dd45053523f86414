"""Helpers of the vLLM adapter that need no vllm import: the environment vLLM reads at import, CPU binding,
memory settings, and the functions that run inside vLLM's worker (through `collective_rpc` / `apply_model`)
to check what the engine serves (the adapters; full weights: rollout/vllm/readback.py)."""

from __future__ import annotations

import math
import os
from typing import Any

import torch

from cluster.driver_env import driver_env
from cluster.fingerprint import fingerprint_terms
from cluster.payloads import AdapterPayload
from marl.guard_grammar import merged_eos
from marl.types import JsonRecord
from rollout.config import kv_cache_bytes


def engine_env(cpu_bind: str, cache_root: str) -> dict[str, str]:
    """What vLLM must find in the environment before it is imported (docs/design.md, vLLM engines)."""
    return {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # engine core in this process: 2-4 s start, ~1.8 GB
        "OMP_WAIT_POLICY": "PASSIVE",  # spinning OpenMP threads make co-located engines 10-20x slower
        "VLLM_CPU_OMP_THREADS_BIND": cpu_bind,  # the default binds every engine on a machine to one core
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "VLLM_CACHE_ROOT": cache_root,
        # The driver's choice (tracking.verbose) reaches engine actors, whose environment is not the driver's.
        "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
        **driver_env(cpu_only=False),  # vLLM does not read DeepSpeed's accelerator
    }


def cpu_bind(slot: int, threads: int, num_cpus: int) -> str:
    """The cores of engine `slot` when every engine takes `threads` consecutive cores, wrapping around."""
    threads = max(1, min(threads, num_cpus))
    first = slot * threads % num_cpus
    return ",".join(str((first + j) % num_cpus) for j in range(threads))


def default_cache_root() -> str:
    return os.path.join(os.path.expanduser(os.environ.get("MARL_CACHE") or "~/.cache/marl"), "vllm")


def memory_kwargs(kv_cache_gb: float | None, gpu_memory_utilization: float, max_model_len: int,
                  on_gpu: bool) -> JsonRecord:
    """`LLM(...)`'s memory arguments: the KV cache as rollout.config.kv_cache_bytes resolves it."""
    out: dict[str, Any] = {"gpu_memory_utilization": gpu_memory_utilization}
    kv = kv_cache_bytes(kv_cache_gb, on_gpu)
    if kv is not None:
        out["kv_cache_memory_bytes"] = kv
    if max_model_len:
        out["max_model_len"] = max_model_len
    return out


def eos_ids_of(model_path: str, tokenizer: Any) -> list[int]:
    """marl.guard_grammar.merged_eos of the folder's generation config (none without
    generation_config.json) and the tokenizer: what the engine stops on."""
    from transformers import GenerationConfig

    try:
        eos = GenerationConfig.from_pretrained(model_path).eos_token_id
    except OSError:  # no generation_config.json
        eos = None
    return merged_eos(eos, tokenizer.eos_token_id)


def adapter_fingerprint_served(worker: Any, lora_id: int, payload: AdapterPayload) -> float:
    """Runs inside vLLM's worker: cluster.fingerprint of the adapter `lora_id` as vLLM holds it, under the
    payload's peft names. lora_A is read back as is; vLLM folds the scaling into lora_B, so a lora_B counts
    as served only if it equals the sent tensor times that scaling exactly (then its terms are the sent
    tensor's, as the sender computes them). A tensor vLLM does not hold gives no terms: the sums differ."""
    from rollout.lora import lora_scaling, module_of

    manager = worker.model_runner.lora_manager._adapter_manager
    held = _held_lora_weights(manager.get_adapter(lora_id), manager.model.packed_modules_mapping)
    scaling = lora_scaling(payload.config)
    terms: list[float] = []
    for name, sent in payload.tensors.items():
        module, kind = module_of(name)
        if module not in held:
            continue
        own_a, own_b, own_scaling = held[module]
        if kind == "A":
            terms += fingerprint_terms(name, own_a)
            continue
        want = sent if own_scaling != 1 else sent * scaling
        same = own_b.shape == want.shape and torch.equal(own_b.cpu(), want.to(own_b.dtype).cpu())
        terms += fingerprint_terms(name, sent if same else own_b)
    return math.fsum(terms)


def _held_lora_weights(adapter: Any, packed: dict[str, list[str]]) -> dict[str, tuple]:
    """{HF module name: (lora_a, lora_b, scaling)}, unpacking vLLM's fused
    modules (qkv_proj, gate_up_proj)."""
    out: dict[str, tuple] = {}
    for module, weights in adapter.loras.items():
        if not isinstance(weights.lora_a, list):
            out[module] = (weights.lora_a, weights.lora_b, weights.scaling)
            continue
        prefix, fused = module.rsplit(".", 1)
        for part, a, b, s in zip(packed[fused], weights.lora_a, weights.lora_b, weights.scaling, strict=True):
            if a is not None:
                out[f"{prefix}.{part}"] = (a, b, s)
    return out

