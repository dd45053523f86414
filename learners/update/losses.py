"""Token-level policy-gradient math: log-probs, entropy, the clipped PPO loss, KL estimators.

Pure functions on tensors. Distributed normalisers are arguments: a caller counts its shard's
share with `local_normalizer`, sums it across ranks and micro-batches (its own collective), and
passes the global total to `ppo_clip_loss`, so the sum of every rank's and micro-batch's loss equals
the loss of the whole batch. Imports nothing but torch.

Shapes: B rows, T positions, V vocabulary. `mask` is the batch's loss mask (bool [B, T]).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import torch
from torch import Tensor

from marl.registry import Registry

_FULL_PRECISION = (torch.float32, torch.float64)


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of values where mask is True (over `dim`, or everything). NaN/inf outside the mask is ignored."""
    kept = torch.where(mask, values, torch.zeros_like(values))
    return kept.sum() if dim is None else kept.sum(dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of values where mask is True (over `dim`, or everything); 0 where the mask is empty."""
    count = mask.sum() if dim is None else mask.sum(dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1)


def response_start(loss_mask: Tensor) -> int:
    """The first shifted position whose target is a loss token in any row: loss_mask [B, T] → s in [0, T−1].

    Position t's logits predict token t+1, so positions < s predict prompt tokens only and need no logits;
    s = T−1 (nothing left) when no row has a loss token."""
    hits = loss_mask[:, 1:].any(0).nonzero()
    return int(hits[0]) if hits.numel() else max(loss_mask.shape[1] - 1, 0)


def token_logprobs(logits: Tensor, targets: Tensor) -> Tensor:
    """log softmax(logits)[target] per position: logits [B, T, V], targets [B, T] long → [B, T].

    Uses logit[target] − logsumexp(logits) so no [B, T, V] log-softmax is materialised. Low-precision
    logits (bf16/fp16) are upcast to float32 one row at a time, bounding the extra memory to [T, V];
    the result is then float32.
    """
    if logits.dtype in _FULL_PRECISION:
        picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        return picked - torch.logsumexp(logits, dim=-1)
    if logits.shape[0] == 0:
        return logits.new_zeros(targets.shape, dtype=torch.float32)
    return torch.stack([token_logprobs(row.float(), tgt) for row, tgt in zip(logits, targets, strict=True)])


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of softmax(logits) per position: [B, T, V] → [B, T]; H = logsumexp(z) − Σ p·z.

    Low-precision logits are upcast row by row as in `token_logprobs`.
    """
    if logits.dtype in _FULL_PRECISION:
        probs = torch.softmax(logits, dim=-1)
        return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(-1)
    if logits.shape[0] == 0:
        return logits.new_zeros(logits.shape[:-1], dtype=torch.float32)
    return torch.stack([entropy_from_logits(row.float()) for row in logits])


@dataclass(frozen=True)
class Aggregation:
    """How per-token losses become one scalar, and what one shard contributes to the normaliser."""

    reduce: Callable[[Tensor, Tensor, Tensor | float], Tensor]  # (loss [B,T], mask [B,T], normalizer)
    count: Callable[[Tensor], Tensor]  # mask [B, T] -> this shard's share of the normaliser


def _token_mean(loss: Tensor, mask: Tensor, normalizer: Tensor | float) -> Tensor:
    return masked_sum(loss, mask) / normalizer


def _seq_mean_token_mean(loss: Tensor, mask: Tensor, normalizer: Tensor | float) -> Tensor:
    return masked_mean(loss, mask, dim=-1).sum() / normalizer


# Selected by name from config (validated at load).
#   token_mean:           Σ_tokens loss / (global number of loss tokens)
#   seq_mean_token_mean:  Σ_seqs mean_tokens(loss) / (global number of sequences with ≥ 1 loss token)
class LossAggregation(StrEnum):
    """`algo.loss_agg`: the names of LOSS_AGGREGATIONS (the config schema's type for the key)."""

    token_mean = "token_mean"
    seq_mean_token_mean = "seq_mean_token_mean"


LOSS_AGGREGATIONS: Registry[Aggregation] = Registry("algo.loss_agg", {
    "token_mean": Aggregation(_token_mean, lambda mask: mask.sum()),
    "seq_mean_token_mean": Aggregation(_seq_mean_token_mean, lambda mask: mask.any(-1).sum()),
}, names=LossAggregation)


def local_normalizer(mask: Tensor, agg: str) -> float:
    """This shard's contribution to the global normaliser of `agg`: loss tokens or non-empty rows.

    mask [B, T] bool → float. The caller sums it over micro-batches and ranks.
    """
    return float(LOSS_AGGREGATIONS[agg].count(mask))


def ppo_clip_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    agg: str = "token_mean",
    normalizer: Tensor | float,
    dual_clip_c: float = 0.0,
    log_ratio_clamp: float = 0.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped surrogate with asymmetric (DAPO) bounds; returns (scalar loss, metric sums).

    logprobs, old_logprobs [B, T] float; advantages [B, T] or [B] (broadcast over T); mask [B, T] bool.
    ratio = exp(lp − old); per-token loss = −min(ratio·A, clip(ratio, 1 − clip_low, 1 + clip_high)·A),
    aggregated by LOSS_AGGREGATIONS[agg] with the GLOBAL `normalizer` (clamped to ≥ 1, so a batch
    with no loss tokens anywhere gives 0 instead of NaN). Positions outside the mask never reach
    exp, so garbage there cannot turn into inf/NaN values or gradients.
    dual_clip_c > 0 (dual-clip PPO, > 1): where A < 0 the per-token loss is at most −A·c, so a token
    whose ratio ran far above 1 + clip_high pushes no harder than ratio c would (and gets no gradient).
    log_ratio_clamp > 0: lp − old is clamped to [−c, c] before exp (no gradient beyond it). Both as
    verl's compute_policy_loss_vanilla.
    Metrics (detached sums over this shard's loss tokens, for the caller to add up):
    'clip_frac_sum' (tokens whose clipped term is the active one), 'ratio_sum', 'tokens'; and 'clipped'
    (bool [B, T], those tokens, so a caller can split the clip fraction by role); with dual_clip_c,
    'dual_clip_frac_sum' (tokens whose loss the −A·c cap holds).
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    log_ratio = torch.where(mask, logprobs - old_logprobs, torch.zeros_like(logprobs))
    if log_ratio_clamp > 0:
        log_ratio = log_ratio.clamp(-log_ratio_clamp, log_ratio_clamp)
    ratio = torch.exp(log_ratio)
    unclipped = -ratio * advantages
    clipped = -torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    per_token = torch.maximum(unclipped, clipped)
    norm = torch.as_tensor(normalizer, dtype=per_token.dtype, device=per_token.device).clamp(min=1)
    with torch.no_grad():
        metrics = {
            "clipped": mask & (clipped > unclipped),
            "clip_frac_sum": (mask & (clipped > unclipped)).sum().to(per_token.dtype),
            "ratio_sum": masked_sum(ratio, mask).detach(),
            "tokens": mask.sum().to(per_token.dtype),
        }
    if dual_clip_c > 0:
        per_token, metrics["dual_clip_frac_sum"] = dual_clip(per_token, advantages, mask, dual_clip_c)
    return LOSS_AGGREGATIONS[agg].reduce(per_token, mask, norm), metrics


def dual_clip(per_token: Tensor, advantages: Tensor, mask: Tensor, c: float) -> tuple[Tensor, Tensor]:
    """(per-token loss capped at −A·c where A < 0, the number of loss tokens the cap holds): per_token [B, T],
    advantages broadcastable to it, mask [B, T] bool. For A < 0 the clipped loss −A·max(ratio, 1 − clip_low)
    grows without bound in the ratio; the cap bounds it (Ye et al. 2019, "dual-clip PPO")."""
    cap = -advantages * c
    capped = (advantages < 0) & (per_token > cap)
    return torch.where(capped, cap.expand_as(per_token), per_token), (capped & mask).sum().to(per_token.dtype)


def _k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    return logprobs - ref_logprobs


def _k2(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    return 0.5 * (logprobs - ref_logprobs) ** 2


def _k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    log_r = ref_logprobs - logprobs
    return torch.exp(log_r) - log_r - 1.0


# Per-token estimators of KL(π ‖ π_ref) from samples of π (Schulman, "Approximating KL divergence"):
# k1 unbiased but signed, k2 biased low-variance, k3 unbiased and always ≥ 0.
class KlEstimator(StrEnum):
    """`algo.kl_estimator`: the names of KL_ESTIMATORS (the config schema's type for the key)."""

    k1 = "k1"
    k2 = "k2"
    k3 = "k3"


KL_ESTIMATORS: Registry[Callable[[Tensor, Tensor], Tensor]] = Registry(
    "algo.kl_estimator", {"k1": _k1, "k2": _k2, "k3": _k3}, names=KlEstimator)


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, kind: str = "k3") -> Tensor:
    """Per-token KL estimate: logprobs, ref_logprobs [B, T] → [B, T]. kind in KL_ESTIMATORS.

    k1 = lp − ref; k2 = ½ (lp − ref)²; k3 = exp(ref − lp) − (ref − lp) − 1.
    """
    return KL_ESTIMATORS[kind](logprobs, ref_logprobs)


def tis_weights(logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor, cap: float) -> Tensor:
    """Truncated importance-sampling weights min(π_learner / π_rollout, cap) per token: [B, T] → [B, T].

    Corrects for the rollout engine sampling from a slightly different distribution than the learner
    computes (numerics, kernels, stale weights). Detached; 1 outside the mask.
    """
    log_ratio = torch.where(mask, logprobs.detach() - rollout_logprobs, torch.zeros_like(logprobs))
    return torch.exp(log_ratio).clamp(max=cap)
