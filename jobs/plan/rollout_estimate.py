"""Engine memory and rollout time for the planner: what a vLLM engine's GPU share holds (weights, LoRA slots,
KV cache), how many sequences of a cell's longest length its KV cache holds at once, and an estimate of one
step's rollout time. Pure arithmetic; every constant says where it comes from.

The time model is a roofline, an estimate uncalibrated until a GPU run measures generated tokens/s
(benchmarks/gpu_check.sh, step 3): a decode iteration of B sequences reads the weights once and each
sequence's KV cache (memory-bound), or does B tokens' matmuls (compute-bound), whichever takes longer;
prefill is compute-bound. A step takes the longer of its throughput bound (all tokens through the engines)
and its latency bound (one episode's turns one after another). Token counts are the caps times
EXPECTED_FILL (an assumption).
"""

from __future__ import annotations

from dataclasses import dataclass

from learners.compute.memory import GIB, ModelShape

# NVIDIA H100 SXM5 80 GB datasheet: 3.35 TB/s HBM3, 989 TFLOP/s dense bf16.
H100_HBM_BYTES_S = 3.35e12
H100_BF16_FLOPS = 989e12
# Assumptions (stated, not measured): the share of HBM bandwidth a decode step
# reaches, and of peak matmul rate.
DECODE_BANDWIDTH_EFFICIENCY = 0.5
MATMUL_EFFICIENCY = 0.4
# vLLM's defaults for its LLM class on an H100/H200 (vllm/engine/arg_utils.py, get_batch_defaults).
VLLM_MAX_NUM_SEQS = 1024
# What an engine's share holds besides weights and KV: the profile run's activations at 16,384 batched tokens,
# the sampler's logits, non-torch allocations (vLLM measures these at start; an estimate here).
ENGINE_RESERVE = 2.0 * GIB


@dataclass(frozen=True)
class EngineMemory:
    """One engine's share of its GPU (bytes) and what it holds."""

    share: float  # rollout.vllm.gpu_memory_utilization × GPU memory (vLLM's budget for the whole engine)
    weights: float
    adapters: float  # multi-LoRA: max_loras slots of the largest rank, preallocated
    reserve: float
    kv: float  # what remains for the KV cache
    kv_sequences: int  # sequences of the cell's longest length the KV cache holds at once


def engine_memory(
    shape: ModelShape, share: float, lora_rank: int, adapters: int, longest: int
) -> EngineMemory:
    """A bf16 engine on `share` bytes: weights 2P, LoRA slots 2·adapters·P_lora, the reserve, then KV."""
    weights = 2.0 * shape.params()
    slots = 2.0 * adapters * shape.lora_params(lora_rank) if adapters else 0.0
    kv = share - weights - slots - ENGINE_RESERVE
    return EngineMemory(share=share, weights=weights, adapters=slots, reserve=ENGINE_RESERVE, kv=kv,
                        kv_sequences=kv_sequences(shape, kv, longest))


def kv_sequences(shape: ModelShape, kv_bytes: float, seq_tokens: int) -> int:
    """Whole sequences of `seq_tokens` the KV cache holds (bf16); vLLM refuses to start below 1."""
    return max(int(kv_bytes // (seq_tokens * shape.kv_bytes_per_token(2))), 0) if seq_tokens else 0


def decode_iteration_s(shape: ModelShape, batch: int, context: float) -> float:
    """Seconds of one decode iteration of `batch` sequences with `context` cached tokens each on an H100."""
    read = 2.0 * shape.params() + batch * context * shape.kv_bytes_per_token(2)
    memory = read / (H100_HBM_BYTES_S * DECODE_BANDWIDTH_EFFICIENCY)
    compute = batch * shape.flops_per_token() / (H100_BF16_FLOPS * MATMUL_EFFICIENCY)
    return max(memory, compute)


# Assumption: a turn's prompt and response average this fraction of their caps. No length
# distribution of these workloads has been measured on Qwen3 yet; at 1.0 (every turn at both caps)
# the estimate is an upper bound.
EXPECTED_FILL = 0.25


@dataclass(frozen=True)
class RolloutWork:
    """One step's generation: its episodes and each turn's mean prompt and response tokens."""

    episodes: int  # prompts × samples
    turns: int  # turns of one episode (parallel ones included)
    sequential_turns: int  # turns one after another in one episode
    prompt_tokens: float  # a turn's mean prompt
    response_tokens: float  # a turn's mean response


def rollout_seconds(shape: ModelShape, work: RolloutWork, engines: int, kv_bytes: float) -> dict[str, float]:
    """Estimated seconds of one step's rollout on `engines` H100 engines, and the decode tokens/s
    it assumes. vLLM admits sequences by the KV blocks they use: as many run at once as the cache
    holds at their mean context."""
    context = work.prompt_tokens + work.response_tokens / 2
    fit = int(kv_bytes // (context * shape.kv_bytes_per_token(2))) if context else VLLM_MAX_NUM_SEQS
    batch = max(min(VLLM_MAX_NUM_SEQS, fit, work.episodes * work.turns), 1)
    iteration = decode_iteration_s(shape, batch, context)
    tokens_per_s = engines * batch / iteration
    generated = work.episodes * work.turns * work.response_tokens
    prefill = work.episodes * work.turns * work.prompt_tokens * shape.flops_per_token()
    prefill_s = prefill / (engines * H100_BF16_FLOPS * MATMUL_EFFICIENCY)
    throughput_s = generated / tokens_per_s + prefill_s
    latency_s = work.sequential_turns * work.response_tokens * iteration
    return {"rollout_s": max(throughput_s, latency_s), "decode_tokens_per_s": tokens_per_s,
            "generated_tokens": float(generated), "concurrency": float(batch)}
