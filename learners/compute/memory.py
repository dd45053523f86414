"""The learner's memory model: how many bytes one learner rank holds at its peak, term by term, from a model's
shape and the learner's settings. Pure arithmetic (no torch), read by the planner (jobs/plan/planner.py).

Two devices, two sets of coefficients:
- `gpu`: DeepSpeed in bf16 with flash-attention (padding-free), the paper's setting. Model states follow
  DeepSpeed's own `estimate_zero2/3_model_states_mem_needs`; activations and logits are estimates from the
  formulas (Korthikanti et al. 2022 without the attention-score term flash-attention removes), not fitted:
  checked on one H200 (benchmarks/results/2026-12-04-gpu-check-h200.md) at 0.90-1.03 of the allocated peaks
  measured at 16,384-65,536 tokens and 0.996 at the paper's 40,960, with torch's caching allocator reserving
  up to 1.25 times the allocated peak (GPU_ALLOCATOR_POOL, counted in the peak).
- `cpu`: the torch backend in fp32 with eager/sdpa attention (the CPU stand-in). Its activation and logits
  coefficients are calibrated against peaks measured on this project's CPU learner
  (tests/learners/test_memory_calibration.py, benchmarks/README.md).

Every size is in bytes; `tokens` are the positions of one micro-batch on one rank (rows × padded width, or the
rows' summed lengths when they run packed: learner.padding_free).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

GIB = 1024**3


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer (Llama/Qwen3 layout: GQA attention, gated MLP, tied or untied LM head)."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool = True

    def layer_params(self) -> int:
        """Weights of one decoder layer: q/k/v/o projections, gate/up/down, two norms (q/k norms ignored)."""
        attn = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        return attn + 3 * self.hidden * self.intermediate + 2 * self.hidden

    def largest_module_params(self) -> int:
        """Weights of the largest module a by-module export gathers at once (learners/state/export.py): the
        embedding (or the untied LM head, as large), else a layer's widest linear (gate, up or down)."""
        return max(self.vocab * self.hidden, self.hidden * self.intermediate,
                   self.hidden * self.heads * self.head_dim)

    def params(self) -> int:
        """All weights: layers, embedding (and an untied LM head), final norm."""
        embed = self.vocab * self.hidden * (1 if self.tied else 2)
        return self.layers * self.layer_params() + embed + self.hidden

    def lora_params(self, rank: int) -> int:
        """LoRA on every linear layer of the decoder (peft's all-linear leaves the LM head out):
        r·L·(7h + 2·n_q·d + 2·n_kv·d + 3I)."""
        h, d = self.hidden, self.head_dim
        return (
            rank * self.layers * (7 * h + 2 * self.heads * d + 2 * self.kv_heads * d + 3 * self.intermediate)
        )

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """The KV cache of one token in an engine: 2 (K and V) · L · n_kv · d · dtype bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    def flops_per_token(self) -> int:
        """Forward FLOPs of one token through the matmuls (2 per weight, the LM
        head included), no attention."""
        return 2 * (self.layers * self.layer_params() + self.vocab * self.hidden)


@dataclass(frozen=True)
class LearnerSetup:
    """What a rank's memory depends on besides the model's shape."""

    tokens: int  # positions of one micro-batch (rows × padded width); its loss positions are at most these
    lora_rank: int  # 0 = full fine-tuning
    zero_stage: int  # 0 = no ZeRO (BackendCapabilities.zero_stage: the torch backend), else the ZeRO stage
    ranks: int  # data-parallel ranks of the policy (ZeRO partitions over them)
    checkpointing: bool
    logits_chunk: int  # positions per LM-head chunk; 0 = the whole [tokens, V] logits at once
    role_rows: int  # rows of the per-role gradient buffer ([roles × trainable params], fp32); 0 = off
    device: str  # gpu | cpu
    padding_free: bool = False  # learner.padding_free: a micro-batch's rows packed end to end in one row
    # the widest row a micro-batch pads to (algo.max_len); 0: rows of one length, no padding
    longest_row: int = 0
    sync_bucket_bytes: int = 0  # sync.bucket_mb of a bucketed sync from device memory (nccl, ipc); 0: none


@dataclass(frozen=True)
class LearnerMemory:
    """One rank's peak, by term (bytes)."""

    weights: float
    gradients: float
    optimizer: float
    role_grads: float
    activations: float
    logits: float
    runtime: float
    pool: float = 0.0  # the caching allocator's reserve over the allocated peak (GPU_ALLOCATOR_POOL)
    # what the weight export after the update needs beyond the micro-batch's activations and logits (gone by
    # then): `export_transient` over activations + logits, when larger
    export: float = 0.0

    def total(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self))

    def allocated(self) -> float:
        """What torch's allocator hands out at the peak (torch.cuda.max_memory_allocated's counterpart)."""
        return self.total() - self.runtime - self.pool


# GPU, bf16 + flash-attention: estimates from the formulas (docs/scaling.md states them), not fitted; within
# 0.90-1.03 of this learner's allocated peaks on one H200 (benchmarks/results/2026-12-04-gpu-check-h200.md).
GPU_ACT_PER_TOKEN_LAYER = (8, 6, 8)  # bytes ≈ 8h + 6(n_q + n_kv)d + 8I per token and layer
# bytes per position × vocab entry, a window kept whole: bf16 logits, fp32 copy, log-softmax,
GPU_LOGITS_WHOLE = 16.0
#                          fp32 and bf16 gradients
GPU_LOGITS_CHUNK = 12.0  # per chunk position × vocab entry: fp32 logits, their exp, their gradient
GPU_RUNTIME = 1.5 * GIB  # CUDA context, NCCL buffers of one learner process (estimate)
# torch's caching allocator keeps freed blocks: a learner's reserved pool over its allocated peak, measured
# 1.13-1.25 on one H200 at 16,384-65,536 tokens per micro-batch (max_memory_reserved / max_memory_allocated;
# benchmarks/results/2026-12-04-gpu-check-h200.md); the largest, so a plan refuses what the pool would not
# hold.
GPU_ALLOCATOR_POOL = 1.25
# CPU, fp32 + sdpa (its CPU flash kernel stores no attention scores): calibrated against this project's CPU
# learner (benchmarks/learner_peak.py, tests/learners/test_memory_calibration.py; benchmarks/README.md).
CPU_ACT_SCALE = 2.0  # fp32 stores every activation at twice bf16's bytes
CPU_LOGITS_FULL = 13.5  # the model's own [T, V] logits (learner.logits_chunk_tokens=0): 12.4-14.3 measured
CPU_LOGITS_WINDOW = 19.0  # a loss window within one chunk, kept for backward whole: 19.3 measured
CPU_LOGITS_CHUNK = 8.2  # a window of several chunks, each recomputed in backward (the fp32 logits, scaled and
#                        turned into their gradient in place, and one exp): 8.15-8.27 measured
CPU_RUNTIME = 0.0  # the calibration measures the rise over the loaded model


def activation_bytes_per_token_layer(s: ModelShape) -> int:
    """Bytes one token leaves saved in one layer for the backward, bf16 with flash-attention (estimate)."""
    a, b, c = GPU_ACT_PER_TOKEN_LAYER
    return a * s.hidden + b * (s.heads + s.kv_heads) * s.head_dim + c * s.intermediate


def activations(s: ModelShape, setup: LearnerSetup) -> float:
    """Saved activations of one micro-batch's forward, its attention masks included (attention_mask).
    Checkpointing keeps each layer's input (2h bytes per token, bf16) and recomputes one layer at a time in
    the backward, so the peak holds one layer's full activations. CPU: fp32 doubles every term."""
    scale = CPU_ACT_SCALE if setup.device == "cpu" else 1.0
    per_layer = activation_bytes_per_token_layer(s) * setup.tokens * scale
    mask = attention_mask(s, setup)
    if not setup.checkpointing:
        return s.layers * per_layer + mask
    return s.layers * 2 * s.hidden * setup.tokens * scale + per_layer + mask


def mask_entries(setup: LearnerSetup) -> int:
    """Entries of the attention mask a micro-batch's forward builds (transformers' sdpa path; `tokens` bounds
    its positions either way: rows × width padded, Σ row lengths packed, learners/update/micro_batches.py).
    - padded rows (padding_free off): [rows, 1, T, T], rows·T ≤ tokens. Rows of one length need none (a causal
      kernel), nor does one row, so the most is two rows or more of the widest T ≤ min(longest_row, tokens/2):
      tokens · T entries.
    - packed rows without flash-attention (the CPU): one [1, 1, N, N] block, N = tokens
    (learners/compute/padding_free.py).
    - packed rows on a GPU: flash-attention's varlen kernel, no mask (a learner on a GPU without
      flash_attn refuses packed rows: learners.compute.padding_free.attention_implementation)."""
    if setup.padding_free:
        return 0 if setup.device == "gpu" else setup.tokens**2
    return setup.tokens * min(setup.longest_row, setup.tokens // 2)


def attention_mask(s: ModelShape, setup: LearnerSetup) -> float:
    """Bytes of a micro-batch's attention masks at the backward's peak: per layer, the copy in the
    compute dtype that sdpa converts the boolean mask to and saves (4 bytes fp32 on the CPU, 2 bf16 on a
    GPU; the boolean one is gone by then), every layer's, or under checkpointing one (the layer being
    recomputed). Measured on CPU (benchmarks/learner_peak.py --layouts): within 6 % without
    checkpointing; with it, an upper bound."""
    copies = 1 if setup.checkpointing else s.layers
    return mask_entries(setup) * copies * (4.0 if setup.device == "cpu" else 2.0)


def logits(s: ModelShape, setup: LearnerSetup) -> float:
    """The LM head's peak: one chunk's vocabulary-wide tensors when the loss window spans
    several chunks (each recomputed in backward), else the whole window's
    (learner.logits_chunk_tokens=0: the model's own logits)."""
    gpu = setup.device == "gpu"
    if setup.logits_chunk and setup.tokens > setup.logits_chunk:
        return (GPU_LOGITS_CHUNK if gpu else CPU_LOGITS_CHUNK) * setup.logits_chunk * s.vocab
    whole = GPU_LOGITS_WHOLE if gpu else CPU_LOGITS_WINDOW if setup.logits_chunk else CPU_LOGITS_FULL
    return whole * setup.tokens * s.vocab


def model_states(s: ModelShape, setup: LearnerSetup) -> tuple[float, float, float, float]:
    """(weights, gradients, optimizer, role-gradient buffer) bytes of one rank.

    DeepSpeed bf16 (DeepSpeed's estimator): ZeRO-2 holds the bf16 weights whole and partitions 18 bytes per
    trainable parameter over N ranks (bf16 + fp32 gradients 6, fp32 master + Adam m, v 12); ZeRO-3
    partitions the weights too and gathers the largest layer (4 bytes per its parameter). LoRA: the frozen
    base is bf16 weights alone. Torch backend fp32: 4 bytes weights, 4 gradients, 8 Adam per trainable
    parameter, nothing partitioned."""
    total = s.params()
    trainable = s.lora_params(setup.lora_rank) if setup.lora_rank else total
    frozen = total if setup.lora_rank else 0
    role_grads = 4.0 * trainable * setup.role_rows
    if setup.zero_stage == 0:
        return 4.0 * (frozen + trainable), 4.0 * trainable, 8.0 * trainable, role_grads
    n = max(setup.ranks, 1)
    weights = weight_bytes(setup) * (frozen + trainable)
    if setup.zero_stage == 3:
        weights = weights / n + 4.0 * s.layer_params()
    return weights, 6.0 * trainable / n, 12.0 * trainable / n, role_grads


def export_transient(s: ModelShape, setup: LearnerSetup) -> float:
    """Bytes the weight export after an update holds at once, on top of the model states: under ZeRO-3 the
    largest module gathered whole and rank 0's copy of it (learners/state/export.py gathers module by module:
    the snapshot's transient, not the whole model's), and the sync's buckets from device memory (vLLM's packed
    producer keeps two in flight; the IPC sender one buffer)."""
    gathered = 2.0 * weight_bytes(setup) * s.largest_module_params() if setup.zero_stage == 3 else 0.0
    return gathered + 2.0 * setup.sync_bucket_bytes


def weight_bytes(setup: LearnerSetup) -> float:
    """Bytes per weight a rank holds (model_states): DeepSpeed's bf16 on a GPU, else fp32 (the torch
    backend's, and DeepSpeed's CPU stand-in)."""
    return 2.0 if setup.zero_stage and setup.device == "gpu" else 4.0


def learner_memory(s: ModelShape, setup: LearnerSetup) -> LearnerMemory:
    """One rank's peak during a micro-batch's forward and backward, term by term."""
    weights, grads, optim, role_grads = model_states(s, setup)
    acts, head = activations(s, setup), logits(s, setup)
    return with_pool(
        LearnerMemory(
            weights=weights,
            gradients=grads,
            optimizer=optim,
            role_grads=role_grads,
            activations=acts,
            logits=head,
            runtime=GPU_RUNTIME if setup.device == "gpu" else CPU_RUNTIME,
            export=max(0.0, export_transient(s, setup) - acts - head),
        ),
        setup.device,
    )


def with_pool(m: LearnerMemory, device: str) -> LearnerMemory:
    """`m` with its allocator pool: GPU_ALLOCATOR_POOL - 1 of its allocated peak on a GPU; none on the CPU,
    whose calibration measured the process's resident peak, pool included."""
    allocated = m.total() - m.runtime - m.pool
    return replace(m, pool=(GPU_ALLOCATOR_POOL - 1.0) * allocated if device == "gpu" else 0.0)


def colocated_memory(s: ModelShape, setups: list[LearnerSetup]) -> LearnerMemory:
    """One rank holding R LoRA policies on one base (learner.lora_colocate, learners/colocated_group.py):
        the frozen base
    once, every policy's adapter, gradients, AdamW state and role-gradient buffer, and the largest policy's
    activations and logits (the policies update in turn, one graph alive at a time). Torch backend or
    DeepSpeed ZeRO-2 (one engine per policy): each part is that policy's separate rank, its gradients and
    optimizer states partitioned over the ranks as a separate learner's, so the sums add partitions; the base
    is whole on every rank (ZeRO-3, which would partition it, is refused at load)."""
    if any(setup.zero_stage == 3 for setup in setups):
        raise ValueError("colocated LoRA policies hold the base whole: ZeRO-3 cannot hold them")
    parts = [learner_memory(s, setup) for setup in setups]
    base = weight_bytes(setups[0]) * s.params()  # the frozen base each part's weights count (model_states)
    return with_pool(LearnerMemory(weights=base + sum(p.weights - base for p in parts),
                         gradients=sum(p.gradients for p in parts), optimizer=sum(p.optimizer for p in parts),
                         role_grads=sum(p.role_grads for p in parts),
                         activations=max(p.activations for p in parts), logits=max(p.logits for p in parts),
                         runtime=max(p.runtime for p in parts), export=max(p.export for p in parts)),
                     setups[0].device)
