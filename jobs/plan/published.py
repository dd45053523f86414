"""Published trainer-only measurements of the same model family, and the planner's estimate of each.

prime-rl's committed benchmark baselines (PrimeIntellect-ai/prime-rl, benchmarks/baselines/): Qwen3-0.6B and
Qwen3-4B(-Instruct-2507, the Qwen3-4B architecture) on H100 80 GB, flash-attention 3, activation
recomputation, each step 2 micro-batches of one sequence of the stated length (throughput × step = 2 × tokens
per micro-batch per GPU). The planner plans the same work with its own learner terms
(learners/compute/memory.py, jobs/plan/planner.py): DeepSpeed in bf16, checkpointing on, the paper cells'
LM-head chunks, one sequence per micro-batch (no padding, so no attention mask); FSDP's full sharding (the
8-GPU rows) through ZeRO-3, the stage that shards weights, gradients and optimizer states alike; one GPU
through ZeRO-2 (nothing to shard over one rank).
"""

from __future__ import annotations

from dataclasses import dataclass

from jobs.models.shape import shape_of
from jobs.plan.planner import BF16_PEAK_FLOPS, learner_seconds, train_flops_per_token
from learners.compute.memory import GIB, LearnerMemory, LearnerSetup, learner_memory

LOGITS_CHUNK = 1024  # the paper cells' learner.logits_chunk_tokens (jobs/configs/sweeps/paper_base.yaml)
MICRO_BATCHES = 2  # per step and GPU, as in every baseline


@dataclass(frozen=True)
class Published:
    """One baseline: model size, LoRA rank (0 = full), tokens per micro-batch, GPUs, and its figures."""

    name: str
    size: str  # 0.6b | 4b
    lora_rank: int
    tokens: int
    gpus: int
    step_s: float
    tok_s: float  # all GPUs together
    mfu: float
    peak_gib: float  # per GPU

    def zero_stage(self) -> int:
        """The closest ZeRO stage: 3 for FSDP sharding over several GPUs, 2 on one GPU."""
        return 3 if self.gpus > 1 else 2

    def model(self) -> str:
        """The builtin spec of the same shape (random weights, Qwen3's vocabulary,
        positions for 65,536 tokens)."""
        return f"builtin:qwen3-{self.size}-shape?vocab=151936&max_positions=65536"


PUBLISHED = (
    Published("0.6B full", "0.6b", 0, 65536, 1, 12.18, 10.1e3, 0.268, 19.6),
    Published("0.6B LoRA r16", "0.6b", 16, 65536, 1, 13.68, 9.6e3, 0.242, 12.3),
    Published("4B LoRA r16", "4b", 16, 16384, 1, 5.43, 6.0e3, 0.210, 23.9),
    Published("4B LoRA r16", "4b", 16, 65536, 1, 31.98, 4.1e3, 0.369, 44.9),
    Published("4B LoRA r16", "4b", 16, 65536, 8, 32.64, 32.1e3, 0.361, 31.7),
    Published("4B full", "4b", 0, 16384, 8, 4.69, 26.0e3, 0.139, 17.1),
    Published("4B full", "4b", 0, 65536, 8, 30.29, 29.0e3, 0.354, 36.1),
)

# This learner on one H200 (benchmarks/results/2026-12-04-gpu-check-h200.md, one measured step each):
# PUBLISHED index -> (max_memory_allocated GiB, max_memory_reserved GiB, step seconds). The 8-GPU baselines
# were not run.
MEASURED_H200 = {
    0: (18.96, 23.68, 13.12),
    1: (10.44, 12.37, 13.41),
    2: (14.82, 16.77, 5.05),
    3: (32.16, 38.96, 37.35),
}


def setup(p: Published) -> LearnerSetup:
    """The planner's learner rank for a baseline: one sequence per micro-batch (longest_row 0: no padding)."""
    return LearnerSetup(tokens=p.tokens, lora_rank=p.lora_rank, zero_stage=p.zero_stage(), ranks=p.gpus,
                        checkpointing=True, logits_chunk=LOGITS_CHUNK, role_rows=0, device="gpu")


def memory(p: Published) -> LearnerMemory:
    return learner_memory(shape_of(p.model()), setup(p))


def step_seconds(p: Published) -> float:
    """The planner's update time of one step: MICRO_BATCHES micro-batches per rank, no recomputed old
    log-probs (the baselines train against the engine's)."""
    tokens = MICRO_BATCHES * p.tokens * p.gpus
    return learner_seconds(shape_of(p.model()), tokens, p.tokens, p.lora_rank > 0, True, False, p.gpus)


def mfu(p: Published, tok_s: float) -> float:
    """The MFU of `tok_s` (all GPUs together) on the baseline's work, at an H100's dense bf16 peak."""
    return tok_s * train_flops_per_token(shape_of(p.model()), p.tokens) / (BF16_PEAK_FLOPS * p.gpus)


def estimate(p: Published) -> dict[str, float]:
    """The planner's figures for a baseline: peak GiB per GPU (with and without the runtime term, which
    torch's allocator does not see), step seconds, tok/s and the MFU they imply."""
    m = memory(p)
    step = step_seconds(p)
    tok_s = MICRO_BATCHES * p.tokens * p.gpus / step
    return {"peak_gib": m.total() / GIB, "allocated_gib": m.allocated() / GIB, "step_s": step,
            "tok_s": tok_s, "mfu": mfu(p, tok_s)}
