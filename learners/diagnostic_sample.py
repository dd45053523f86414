"""Which rows the update's no-grad diagnostics measure (`learner.diagnostics.sample_rows`), as pure functions.

Two diagnostics cost a forward pass of their own: the per-role entropy and engine gap of rows skipped for a
zero advantage (UpdatePlan.metric_rows) and the policy movement (learners/policy_move.py, a forward once the
weights moved). Each measures a sample of at most `size` rows of its population per policy and step:
stratified per role (every role present gets at least one row; the rest of the budget goes round-robin to the
roles with rows left), uniform without replacement inside a role, drawn by the group from the whole batch with
a seed derived from (run seed, policy, step), so every data-parallel rank agrees on it and a rerun draws the
same rows.

A sampled row carries the weight N_h / n_h of its role (N_h rows, n_h sampled): its sums of entropy, engine
gap and |Δ log-prob| are scaled by it, which makes each role's sum an unbiased (Horvitz-Thompson) estimate of
the sum over every row. Token counts are never sampled: the rows left out still count their tokens exactly (no
forward needed), so each mean, an estimated sum over an exact count, is an unbiased estimate of the all-rows
mean. The training passes, their rows and the weights never depend on the sample.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor

from learners.rank_metrics import RoleSums, TokenSums
from learners.update.ppo_plan import UpdatePlan

ALL = "all"


def sample_size(value: str) -> int | None:
    """`learner.diagnostics.sample_rows` as a row budget: None for `all`, else its number (0 = off)."""
    if str(value) == ALL:
        return None
    if not str(value).isdigit():
        raise ValueError(f"learner.diagnostics.sample_rows must be a whole number >= 0 or {ALL}; "
                         f"got {value!r}")
    return int(value)


def role_quotas(counts: dict[str, int], size: int) -> dict[str, int]:
    """Rows to draw per role (roles in sorted order): one each while any role has rows, then round-robin up to
    `size` in all (or every row); never more than a role has. counts: role -> its rows in the population."""
    quotas = {role: 0 for role in sorted(counts) if counts[role] > 0}
    total, first = 0, True
    while quotas and (first or total < size):
        grew = False
        for role in quotas:
            if quotas[role] < counts[role] and (first or total < size):
                quotas[role], total, grew = quotas[role] + 1, total + 1, True
        first = False
        if not grew:
            break
    return quotas


def stratified_sample(roles: Sequence[str], population: Sequence[int], size: int | None,
                      seed: int) -> dict[int, float]:
    """row -> its weight N_h / n_h, for a per-role stratified sample of `population` (row indices into
    `roles`).

    size None: every row at weight 1.0 (the diagnostics of every row); 0: no row."""
    if size is None:
        return {i: 1.0 for i in population}
    if size == 0:
        return {}
    strata: dict[str, list[int]] = {}
    for i in population:
        strata.setdefault(roles[i], []).append(i)
    rng = random.Random(seed)
    out: dict[int, float] = {}
    for role, n in role_quotas({r: len(rows) for r, rows in strata.items()}, size).items():
        for i in sorted(rng.sample(strata[role], n)):
            out[i] = len(strata[role]) / n
    return out


@dataclass(frozen=True)
class SampledRows:
    """What the diagnostics' sample makes of one training step's scatter: rows[r] the global rows rank r
    receives (its trained rows, then the skipped rows it measures), plans[r] its plan with metric_rows /
    metric_weights and move_weights set, `unmeasured` the exact token sums (in all and per role) of
    skipped rows left out (the means' denominators count them), `counts` the rows each diagnostic measured."""

    rows: list[list[int]]
    plans: list[UpdatePlan]
    unmeasured: TokenSums
    counts: dict[str, float]


def _unmeasured(roles: Sequence[str], tokens: Tensor, left: list[int]) -> TokenSums:
    """The loss tokens of the skipped rows left out of the sample (global rows `left`), in all and per role:
    the diagnostics' denominators still count them."""
    terms = [(roles[g], float(tokens[g])) for g in left]
    total = 0.0
    for _, t in terms:  # term by term, as the ranks' sums add up
        total += t
    return TokenSums(tokens=total, roles=RoleSums().added(tokens=terms))


def sample_diagnostics(roles: Sequence[str], tokens: Tensor, rows: list[list[int]], plans: list[UpdatePlan],
                       size: int | None, seeds: tuple[int, int], recompute: bool) -> SampledRows:
    """The scatter of learners.update.ppo_plan.plan_update (rows[r]: trained rows, then skipped ones; plans[r]
    with `skip` already set) with the diagnostics measured on a stratified sample of `size` rows (None: every
    row, the plans as given; 0: no skipped row sent, no movement measured).

    roles: the B global rows' roles; tokens [B] their loss tokens; seeds: (skipped rows', movement's) draws;
    recompute: algo.old_logprobs=recompute (the movement then covers later steps' rows too)."""
    kept = [r[:len(r) - len(p.metric_rows or [])] for r, p in zip(rows, plans, strict=True)]
    dropped = [r[len(k):] for r, k in zip(rows, kept, strict=True)]
    moved = [movement_population(k, p, recompute) for k, p in zip(kept, plans, strict=True)]
    if size is None:
        every = {"move": float(sum(len(m) for m in moved)), "diag": float(sum(len(r) for r in rows))}
        return SampledRows(rows, plans, TokenSums(), every)
    skipped = stratified_sample(roles, [g for d in dropped for g in d], size, seeds[0])
    move = stratified_sample(roles, [g for m in moved for g in m], size, seeds[1])
    unmeasured = _unmeasured(roles, tokens, [g for d in dropped for g in d if size and g not in skipped])
    any_metric = bool(skipped)
    out_rows, out_plans = [], []
    for k, d, plan in zip(kept, dropped, plans, strict=True):
        measured = [g for g in d if g in skipped]
        out_rows.append(k + measured)
        out_plans.append(dataclasses.replace(
            plan, metric_rows=list(range(len(k), len(k) + len(measured))) if any_metric else None,
            metric_weights=tuple(skipped[g] for g in measured) if any_metric else None,
            move_weights=tuple(move.get(g, 0.0) for g in k + measured) if size else None))
    counts = {"move": float(len(move)), "diag": float(sum(len(k) for k in kept) + len(skipped))}
    return SampledRows(out_rows, out_plans, unmeasured, counts)


def movement_population(kept: list[int], plan: UpdatePlan, recompute: bool) -> list[int]:
    """The global rows (of `kept`, a rank's trained rows, which plan.steps index) whose movement the learner
    measures: the first taken optimizer step's and, when recomputed, every later step's
    (learners/policy_move.py)."""
    taken = [i for i in range(len(plan.steps)) if not (plan.skip and plan.skip[i])]
    if not taken:
        return []
    local = set(plan.steps[taken[0]]) | ({j for s in plan.steps[1:] for j in s} if recompute else set())
    return [kept[j] for j in sorted(local)]
