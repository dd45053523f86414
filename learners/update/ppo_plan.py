"""The optimizer steps of one training step (PPO mini-batches and epochs), as pure functions.

A policy's batch of B rows is sharded over W data-parallel ranks once (contiguous slices, as
`TrainBatch.shard`). Each epoch, every rank shuffles its own rows (seeded; or keeps their order:
`algo.minibatch_shuffle=false`, verl's in-order split) and splits them into the same number K = ceil(B / M) of
chunks; optimizer step k of that epoch trains the union of the ranks' chunk k, so a
mini-batch holds about M rows in all (verl's semantics: the mini-batch size is divided over the ranks and each
rank splits its local data). One training step therefore takes K × epochs optimizer steps. M = 0 means one
mini-batch of every row: one optimizer step per epoch, rows in their given order.

verl's cutting is a Cut away: the rows cut as verl's W ranks would cut them whatever the learner's own ranks
(`algo.minibatch_ranks`), chunks of M / W rows per rank and a remainder instead of even ones
(`algo.minibatch_chunks=fixed`), and the nominal normaliser (`algo.loss_normalizer=nominal`).

Each optimizer step's loss normaliser is that mini-batch's global token (or row) count, counted before
zero-advantage rows are dropped, so dropping them never changes an update; or, nominal, M rows whatever it
holds. A dropped row still reaches its rank for one no-grad pass that measures its diagnostics
(`UpdatePlan.metric_rows`), so they cover every row.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from enum import StrEnum

from torch import Tensor

from learners.update.losses import local_normalizer
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
    (learners/update/empty_steps.py); empty = take every step. `metric_weights[j]`: metric row j's weight in
    the diagnostics' sums, `move_weights[i]`: row i's in the policy movement's (0: not measured), both from
    the diagnostics' sample (learners/diagnostic_sample.py); None = every row at weight 1."""

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
    """`rows` cut into `parts` consecutive chunks whose sizes differ by at most
    one (the first ones larger)."""
    base, extra = divmod(len(rows), parts)
    out, start = [], 0
    for i in range(parts):
        size = base + (i < extra)
        out.append(rows[start:start + size])
        start += size
    return out


def rank_chunks(shard_rows: int, parts: int, epochs: int, seed: int, shuffle: bool = True, size: int = 0
                ) -> list[list[list[int]]]:
    """[epoch][k] → this rank's local row indices of optimizer step k. Rows are shuffled per epoch with `seed`
    (derived per rank and epoch) unless there is one chunk, whose order does not matter, or `shuffle` is off:
    then every epoch cuts the rows in their order (verl's data.split). `size` > 0: chunks of `size` rows and a
    remainder (verl's), padded with empty chunks up to `parts`; 0: `parts` even chunks."""
    out = []
    for epoch in range(epochs):
        order = list(range(shard_rows))
        if parts > 1 and shuffle:
            random.Random(derive_seed(seed, "epoch", epoch)).shuffle(order)
        chunks = [order[i:i + size] for i in range(0, shard_rows, size)] if size else split_even(order, parts)
        out.append(chunks + [[] for _ in range(parts - len(chunks))])
    return out


class MinibatchChunks(StrEnum):
    """`algo.minibatch_chunks`: ⌈B / M⌉ chunks of even size, or verl's chunks of M rows and a remainder."""

    even = "even"
    fixed = "fixed"


class LossNormalizer(StrEnum):
    """`algo.loss_normalizer`: a mini-batch's loss divided by its actual rows (or tokens), or by the nominal M
    rows whatever it holds (verl's: each micro-batch scaled by rows / ppo_mini_batch_size)."""

    actual = "actual"
    nominal = "nominal"


@dataclass(frozen=True)
class Cut:
    """How a policy's rows are cut into mini-batches besides their size M. `ranks`: the data-parallel ranks
    the rows are cut as, each a contiguous shard split on its own and mini-batch k the union of their chunk k
    (0: the learner's own ranks; verl's W when it differs). `fixed`: per shard, chunks of M / ranks rows and a
    remainder instead of ⌈B / M⌉ even chunks. `nominal`: every mini-batch normalised by M rows
    (seq_mean_token_mean only), so a partial one is down-weighted."""

    ranks: int = 0
    fixed: bool = False
    nominal: bool = False


def global_steps(rows: int, world: int, mini_batch_size: int, epochs: int, seed: int, shuffle: bool, cut: Cut
                 ) -> list[list[int]]:
    """The global rows of every optimizer step (epochs × K, flattened), each the union in rank order of the
    `cut.ranks or world` shards' chunk k (see rank_chunks)."""
    ranks = cut.ranks or world
    shards = contiguous_shards(rows, ranks)
    # verl divides M over its ranks exactly (checked at config load); an effective M
    # (parallel_agent_norm) may not.
    size = max(1, mini_batch_size // ranks) if cut.fixed and mini_batch_size > 0 else 0
    parts = (
        max([1, *(math.ceil(len(s) / size) for s in shards)])
        if size
        else num_mini_batches(rows, mini_batch_size)
    )
    chunks = [rank_chunks(len(s), parts, epochs, derive_seed(seed, "rank", r), shuffle, size)
              for r, s in enumerate(shards)]
    return [
        [shards[r][i] for r in range(ranks) for i in chunks[r][e][k]]
        for e in range(epochs)
        for k in range(parts)
    ]


def step_normalizers(
    loss_mask: Tensor, steps: list[list[int]], agg: str, nominal: float = 0.0
) -> list[float]:
    """Global normaliser of each optimizer step: its rows' count under aggregation `agg` (loss_mask [B, T],
    already aligned: position t predicts token t), or `nominal` rows (> 0) whatever the step holds."""
    if nominal and agg != "seq_mean_token_mean":
        raise ValueError(f"a nominal normaliser counts rows: it needs seq_mean_token_mean, not {agg}")
    return [
        float(nominal) if nominal else local_normalizer(loss_mask[rows], agg) if rows else 0.0
        for rows in steps
    ]


def contiguous_shards(rows: int, world: int) -> list[range]:
    """Rank r's global rows: contiguous slices differing in size by at most one (as TrainBatch.shard)."""
    base, extra = divmod(rows, world)
    starts = [r * base + min(r, extra) for r in range(world + 1)]
    return [range(starts[r], starts[r + 1]) for r in range(world)]


def plan_update(loss_mask: Tensor, keep: Tensor, world: int, mini_batch_size: int, epochs: int, agg: str,
                seed: int, roles: list[str] | None, shuffle: bool = True, cut: Cut = Cut()
                ) -> tuple[list[list[int]], list[UpdatePlan]]:
    """Every rank's rows and plan for one training step.

    loss_mask [B, T] aligned loss mask; keep [B] bool, rows that train (False: a zero-advantage
    row, counted in its mini-batch's normaliser, never in a step, measured by the metrics-only
    pass). `shuffle`: see rank_chunks;
    `cut`: see Cut. Returns (rows[r]: the global rows rank r receives, its contiguous shard's training rows in
    order, then its dropped ones; plans[r]: its optimizer steps and metric rows as indices into rows[r])."""
    steps = global_steps(loss_mask.shape[0], world, mini_batch_size, epochs, seed, shuffle, cut)
    nominal = mini_batch_size if cut.nominal and mini_batch_size > 0 else 0
    normalizers = step_normalizers(loss_mask, steps, agg, nominal)
    any_dropped = not bool(keep.all())
    rows_out, plans = [], []
    for shard in contiguous_shards(loss_mask.shape[0], world):
        kept = [g for g in shard if bool(keep[g])]
        dropped = [g for g in shard if not bool(keep[g])]
        local = {g: j for j, g in enumerate(kept)}
        rows_out.append(kept + dropped)
        metric_rows = list(range(len(kept), len(kept) + len(dropped))) if any_dropped else None
        own_steps = [[local[g] for g in step if g in local] for step in steps]
        plans.append(UpdatePlan(own_steps, normalizers, roles, epochs, metric_rows))
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
