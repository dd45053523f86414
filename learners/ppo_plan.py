"""The optimizer steps of one training step (PPO mini-batches and epochs), as pure functions.

A policy's batch of B rows is sharded over W data-parallel ranks once (contiguous slices, as
`TrainBatch.shard`). Each epoch, every rank shuffles its own rows (seeded; or keeps their order:
`algo.minibatch_shuffle=false`, verl's in-order split) and splits them into the same number K = ceil(B / M) of
chunks; optimizer step k of that epoch trains the union of the ranks' chunk k, so a
mini-batch holds about M rows in all (verl's semantics: the mini-batch size is divided over the ranks and each
rank splits its local data). One training step therefore takes K × epochs optimizer steps. M = 0 means one
mini-batch of every row: one optimizer step per epoch, rows in their given order.

Each optimizer step's loss normaliser is that mini-batch's global token (or row) count, counted before
zero-advantage rows are dropped, so dropping them never changes an update. A dropped row still reaches its
rank for one no-grad pass that measures its diagnostics (`UpdatePlan.metric_rows`), so they cover every row.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from torch import Tensor

from learners.losses import local_normalizer
from marl.seeds import derive_seed


@dataclass(frozen=True)
class UpdatePlan:
    """One rank's share of a training step: `steps[i]` are the row indices (into the rank's shard) of
    optimizer step i, in order; `normalizers[i]` its global loss normaliser; `roles` (the policy's roles,
    identical on every rank) asks for per-role gradient diagnostics. `epochs` tells the learner whether a row
    trains again after the weights moved (then its old log-probs must be kept from before the first step).
    `metric_rows`: the rows (indices into the shard) that train in no step, a zero advantage's, measured by a
    no-grad pass for the per-role diagnostics only; None on every rank when no rank has such rows (no pass at
    all). `skip[i]`: optimizer step i carries no gradient on any rank and is not taken
    (learners/empty_steps.py); empty = take every step. `metric_weights[j]`: metric row j's weight in the
    diagnostics' sums, `move_weights[i]`: row i's in the policy movement's (0: not measured), both from the
    diagnostics' sample (learners/diagnostic_sample.py); None = every row at weight 1."""

    steps: list[list[int]]
    normalizers: list[float]
    roles: list[str] | None = None
    epochs: int = 1
    metric_rows: list[int] | None = None
    skip: tuple[bool, ...] = ()
    metric_weights: tuple[float, ...] | None = None
    move_weights: tuple[float, ...] | None = None

    @staticmethod
    def whole(rows: int, normalizer: float, roles: list[str] | None = None) -> UpdatePlan:
        """One optimizer step over every row (the plan of `ppo_mini_batch_size=0`, one epoch)."""
        return UpdatePlan([list(range(rows))], [normalizer], roles)


def num_mini_batches(rows: int, mini_batch_size: int) -> int:
    """K = ceil(rows / mini_batch_size), at least 1 (an empty batch still takes its step); 0 size → 1."""
    if mini_batch_size <= 0:
        return 1
    return max(1, math.ceil(rows / mini_batch_size))


def effective_mini_batch_size(mini_batch_size: int, weights: Tensor) -> int:
    """Mini-batch size that gives the optimizer steps the rows would take with every row counted at its
    weight (parallel_agent_norm: a role of K parallel agents counts as one agent). weights [B] ≥ 0.

    M · B / Σw rounded; M unchanged when the weights are all 1 or the size is 0 (one mini-batch)."""
    total = float(weights.sum())
    if mini_batch_size <= 0 or total <= 0:
        return mini_batch_size
    return max(1, round(mini_batch_size * len(weights) / total))


def split_even(rows: list[int], parts: int) -> list[list[int]]:
    """`rows` cut into `parts` consecutive chunks whose sizes differ by at most one (the first ones larger)."""
    base, extra = divmod(len(rows), parts)
    out, start = [], 0
    for i in range(parts):
        size = base + (i < extra)
        out.append(rows[start:start + size])
        start += size
    return out


def rank_chunks(shard_rows: int, parts: int, epochs: int, seed: int, shuffle: bool = True) -> list[list[list[int]]]:
    """[epoch][k] → this rank's local row indices of optimizer step k. Rows are shuffled per epoch with
    `seed` (derived per rank and epoch) unless there is one chunk, whose order does not matter, or `shuffle` is
    off: then every epoch cuts the rows in their order (verl's data.split)."""
    out = []
    for epoch in range(epochs):
        order = list(range(shard_rows))
        if parts > 1 and shuffle:
            random.Random(derive_seed(seed, "epoch", epoch)).shuffle(order)
        out.append(split_even(order, parts))
    return out


def step_normalizers(loss_mask: Tensor, shards: list[range], chunks: list[list[list[list[int]]]], agg: str
                     ) -> list[float]:
    """Global normaliser of each optimizer step (epochs × K, flattened): the sum over ranks of their chunk's
    count under aggregation `agg`. loss_mask [B, T] (already aligned: position t predicts token t);
    shards[r] the rank's global rows; chunks[r][epoch][k] its local indices."""
    out = []
    epochs, parts = len(chunks[0]), len(chunks[0][0])
    for epoch in range(epochs):
        for k in range(parts):
            rows = [shards[r][i] for r in range(len(shards)) for i in chunks[r][epoch][k]]
            out.append(local_normalizer(loss_mask[rows], agg) if rows else 0.0)
    return out


def contiguous_shards(rows: int, world: int) -> list[range]:
    """Rank r's global rows: contiguous slices differing in size by at most one (as TrainBatch.shard)."""
    base, extra = divmod(rows, world)
    starts = [r * base + min(r, extra) for r in range(world + 1)]
    return [range(starts[r], starts[r + 1]) for r in range(world)]


def plan_update(loss_mask: Tensor, keep: Tensor, world: int, mini_batch_size: int, epochs: int, agg: str,
                seed: int, roles: list[str] | None, shuffle: bool = True) -> tuple[list[list[int]], list[UpdatePlan]]:
    """Every rank's rows and plan for one training step.

    loss_mask [B, T] aligned loss mask; keep [B] bool, rows that train (False: a zero-advantage row, counted in
    its mini-batch's normaliser, never in a step, measured by the metrics-only pass). `shuffle`: see rank_chunks.
    Returns (rows[r]: the global rows rank r receives, its training rows in order, then its dropped ones;
    plans[r]: its optimizer steps and metric rows as indices into rows[r])."""
    shards = contiguous_shards(loss_mask.shape[0], world)
    parts = num_mini_batches(loss_mask.shape[0], mini_batch_size)
    chunks = [rank_chunks(len(s), parts, epochs, derive_seed(seed, "rank", r), shuffle) for r, s in enumerate(shards)]
    normalizers = step_normalizers(loss_mask, shards, chunks, agg)
    any_dropped = not bool(keep.all())
    rows_out, plans = [], []
    for r, shard in enumerate(shards):
        kept = [i for i in range(len(shard)) if bool(keep[shard[i]])]
        dropped = [i for i in range(len(shard)) if not bool(keep[shard[i]])]
        local = {i: j for j, i in enumerate(kept)}
        steps = [[local[i] for i in chunk if i in local] for per_epoch in chunks[r] for chunk in per_epoch]
        rows_out.append([shard[i] for i in kept + dropped])
        metric_rows = list(range(len(kept), len(kept) + len(dropped))) if any_dropped else None
        plans.append(UpdatePlan(steps, normalizers, roles, epochs, metric_rows))
    return rows_out, plans


def mean_and_last(per_step: list[dict[str, float]]) -> dict[str, float]:
    """Per-optimizer-step scalars → their mean under each key and the last step's value under `last/<key>`
    (a key missing from some steps is averaged over the steps that have it)."""
    out: dict[str, float] = {}
    keys = dict.fromkeys(k for m in per_step for k in m)
    for key in keys:
        values = [m[key] for m in per_step if key in m]
        out[key] = sum(values) / len(values)
        out[f"last/{key}"] = values[-1]
    return out
