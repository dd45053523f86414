"""One micro-batch's policy loss as a pure function of the learner's log-probs: the clipped PPO loss (with
truncated importance-sampling weights when `algo.tis_cap` > 0), the optional KL term to a reference, and the
metric sums the learner reports (overall and per role).

No module, optimizer or collective here: the learner runs the forward passes and hands in their results.
Shapes: B rows of T tokens. Per-token tensors are over the shifted positions, [B, T−1]: position t predicts
token t+1, so `mask` is the batch's loss mask without its first column.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from learners.config import AlgoConfig
from learners.rank_metrics import RoleSums, TokenSums
from learners.update.losses import LOSS_AGGREGATIONS, kl_penalty, ppo_clip_loss, tis_weights
from learners.update.mitigations import kl_coefficients


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor | None,
    rollout_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    roles: list[str],
    *,
    ref_logprobs: Tensor | None,
    entropy: Tensor,
    algo: AlgoConfig,
    normalizer: float,
) -> tuple[Tensor, TokenSums]:
    """(scalar loss, its sums over the loss tokens) of one micro-batch; the loss is normalised by the GLOBAL
    `normalizer` (learners.update.losses.local_normalizer summed over micro-batches and ranks), so micro-batch
    losses add up.

    logprobs [B, T−1]: the policy's, with grad. old_logprobs [B, T−1]: the behaviour policy's
    for the PPO ratio, or None for the current ones, detached (ratio 1).
    rollout_logprobs [B, T−1]: the engines'. advantages [B].
    mask [B, T−1] bool. roles: B role names. ref_logprobs [B, T−1]: the reference's, or None for no KL term.
    entropy [B, T−1]: per-token entropy of the policy (detached; reported only). `algo`: the algo config
    section (clip_low, clip_high, loss_agg, tis_cap, kl_coef, kl_anchor_roles, kl_estimator,
    dual_clip_c, log_ratio_clamp).

    Sums: loss, clipped tokens, tokens (dual-clipped tokens with algo.dual_clip_c), and per role clipped
    tokens, entropy, |learner − engine| log-prob, tokens, and KL with a KL term.
    """
    old = logprobs.detach() if old_logprobs is None else old_logprobs
    weighted = advantages.unsqueeze(-1).expand_as(logprobs)
    if algo.tis_cap > 0:
        weighted = weighted * tis_weights(old, rollout_logprobs, mask, algo.tis_cap)
    loss, m = ppo_clip_loss(logprobs, old, weighted, mask, clip_low=algo.clip_low, clip_high=algo.clip_high,
                            agg=algo.loss_agg, normalizer=normalizer, dual_clip_c=algo.dual_clip_c,
                            log_ratio_clamp=algo.log_ratio_clamp)
    kl_terms: list[tuple[str, float]] = []
    if ref_logprobs is not None:
        kl = kl_penalty(logprobs, ref_logprobs, algo.kl_estimator)
        # Each row's KL weighs algo.kl_coef plus its role's anchor
        # (learners.update.mitigations.kl_coefficients).
        coef = kl_coefficients(roles, algo.kl_coef, dict(algo.kl_anchor_roles)).to(kl.device).unsqueeze(-1)
        loss = loss + LOSS_AGGREGATIONS[algo.loss_agg].reduce(kl * coef, mask, max(normalizer, 1))
        kl_terms = per_role_terms(kl.detach(), mask, roles)
    with torch.no_grad():
        diag = diagnostic_terms(logprobs.detach(), rollout_logprobs, entropy, mask, roles)
        role_sums = RoleSums().added(kl=kl_terms, clip_frac=per_role_terms(m["clipped"].float(), mask, roles),
                                     entropy=diag.entropy, logprob_diff=diag.logprob_diff, tokens=diag.tokens)
    dual = float(m["dual_clip_frac_sum"]) if "dual_clip_frac_sum" in m else None
    return loss, TokenSums(loss=float(loss.detach()), clip_frac=float(m["clip_frac_sum"]),
                           tokens=float(m["tokens"]), dual_clip_frac=dual, roles=role_sums)


class DiagnosticTerms(NamedTuple):
    """Per-role diagnostics of B rows, as (role, value) terms one per row, over the loss tokens."""

    entropy: list[tuple[str, float]]
    logprob_diff: list[tuple[str, float]]  # |learner − engine| log-prob
    tokens: list[tuple[str, float]]


def diagnostic_terms(logprobs: Tensor, rollout_logprobs: Tensor, entropy: Tensor, mask: Tensor,
                     roles: list[str], weights: Tensor | None = None) -> DiagnosticTerms:
    """The per-role diagnostics of B rows: entropy, |learner − engine| log-prob and tokens, over the loss
    tokens.

    logprobs, rollout_logprobs, entropy [B, T−1] (detached), mask [B, T−1] bool, roles: B names. Rows that
    train report them through `policy_loss`; rows skipped for a zero advantage through the learner's
    metrics-only pass. weights [B] or None: a sampled row's weight (learners/diagnostic_sample.py) on its
    entropy and gap sums (never on its tokens)."""
    diff = (logprobs - rollout_logprobs).abs()
    if weights is not None:
        w = weights.to(diff).unsqueeze(-1)
        entropy, diff = entropy * w, diff * w
    return DiagnosticTerms(per_role_terms(entropy, mask, roles), per_role_terms(diff, mask, roles),
                           per_role_terms(torch.ones_like(diff), mask, roles))


def per_role_terms(values: Tensor, mask: Tensor, roles: list[str]) -> list[tuple[str, float]]:
    """(role, each row's masked sum of `values` [B, T−1]), one term per row, in row order."""
    per_row = torch.where(mask, values, torch.zeros_like(values)).sum(-1)
    return list(zip(roles, per_row.tolist(), strict=True))

