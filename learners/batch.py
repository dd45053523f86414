"""TrainBatch, the learner-side data contract, and `build_batches`, which makes one per policy.

Every turn of every episode becomes one row of the batch of the policy its role maps to. Rows are
right-padded token sequences (prompt + response) with a loss mask over the response tokens and the
engine's sampled logprobs aligned to it. Rows keep the flattened turn order (episodes in order,
turns in order) that `learners.update.advantages.group_keys` uses.

Alignment: position t of `loss_mask` / `rollout_logprobs` describes token input_ids[:, t], which the
model predicts from position t − 1. A learner therefore computes
    lp = token_logprobs(logits[:, :-1], input_ids[:, 1:])
and compares it with rollout_logprobs[:, 1:] under loss_mask[:, 1:]; position 0 is never a loss token.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from learners.update.balance import balanced_order
from marl.policy_map import PolicyMap
from marl.types import Episode, Turn


@dataclass
class TrainBatch:
    """B rows of one policy, T positions. See the module docstring for the t / t − 1 alignment."""

    policy_id: str
    input_ids: Tensor  # [B, T] long, right-padded with pad_id
    attention_mask: Tensor  # [B, T] bool
    loss_mask: Tensor  # [B, T] bool, True where input_ids[:, t] is a response token; never at t = 0
    rollout_logprobs: Tensor  # [B, T] float, engine logprob of input_ids[:, t] at loss positions, else 0
    advantages: Tensor  # [B] float
    rewards: Tensor  # [B] float
    roles: list[str]  # role of each row
    agents: list[str]  # agent instance of each row
    pad_id: int = 0  # the token id filling input_ids where attention_mask is False
    # [B, T] float or None: the behaviour policy's logprobs for the PPO ratio, aligned as rollout_logprobs;
    # set by a learner for its optimizer steps (learners/learner.py), never by build_batches.
    old_logprobs: Tensor | None = None
    # [B] float or None: a row's weight in the policy movement's sample (learners/diagnostic_sample.py), 0 =
    # not measured; set by a learner from its plan, never by build_batches. None = every row at weight 1.
    move_weights: Tensor | None = None
    # role -> the grammar text of its output guard (marl.guard_grammar): the learner replays it over those
    # rows' tokens and masks their logits as the engines did (learners/compute/guard_masks.py). {} = none.
    guards: dict[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        shape = tuple(self.input_ids.shape)
        for name in ("attention_mask", "loss_mask", "rollout_logprobs", "old_logprobs"):
            if getattr(self, name) is None:
                continue
            got = tuple(getattr(self, name).shape)
            if got != shape:
                raise ValueError(f"TrainBatch.{name} has shape {got}, want {shape}")
        for name in ("advantages", "rewards", "roles", "agents", "move_weights"):
            if getattr(self, name) is None:
                continue
            if len(getattr(self, name)) != shape[0]:
                raise ValueError(f"TrainBatch.{name} has {len(getattr(self, name))} rows, want {shape[0]}")

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, idx: list[int] | range | Tensor) -> TrainBatch:
        """The rows `idx` (positions, or a bool mask [B]) in that order; trailing all-padding columns
        are trimmed, keeping at least one column (no rows → shape [0, 1])."""
        idx = idx if isinstance(idx, Tensor) else torch.tensor(list(idx), dtype=torch.long)
        idx = idx.nonzero().squeeze(-1) if idx.dtype == torch.bool else idx.to(torch.long)
        used = self.attention_mask[idx].any(0).nonzero()
        width = int(used.max()) + 1 if used.numel() else 1
        rows = idx.tolist()
        return TrainBatch(
            policy_id=self.policy_id,
            input_ids=self.input_ids[idx, :width],
            attention_mask=self.attention_mask[idx, :width],
            loss_mask=self.loss_mask[idx, :width],
            rollout_logprobs=self.rollout_logprobs[idx, :width],
            advantages=self.advantages[idx],
            rewards=self.rewards[idx],
            roles=[self.roles[i] for i in rows],
            agents=[self.agents[i] for i in rows],
            pad_id=self.pad_id,
            old_logprobs=self.old_logprobs[idx, :width] if self.old_logprobs is not None else None,
            move_weights=self.move_weights[idx] if self.move_weights is not None else None,
            guards=self.guards,
        )

    def shard(self, rank: int, world_size: int) -> TrainBatch:
        """Rank's contiguous slice; row counts differ by at most one (the first B % world_size ranks
        get one more). With B < world_size some ranks get no rows: an empty batch of shape [0, 1],
        which still goes through `ppo_clip_loss` (loss 0 with a graph) so collectives stay matched."""
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        base, extra = divmod(len(self), world_size)
        start = rank * base + min(rank, extra)
        return self.select(range(start, start + base + (rank < extra)))

    def longest_first(self, idx: list[int] | None = None) -> list[int]:
        """Row positions (`idx`, default all) ordered by sequence length, longest first, ties in order.

        Micro-batches are consecutive chunks padded to their widest row, so chunking rows in this order pads
        each chunk only to rows of similar length. The loss is a sum over rows under one normaliser, so the
        order changes no update (beyond float summation order)."""
        rows = list(range(len(self))) if idx is None else list(idx)
        lengths = self.attention_mask.sum(-1).tolist()
        return sorted(rows, key=lambda i: -lengths[i])

    def micro_batches(self, size: int, min_count: int = 1) -> list[TrainBatch]:
        """Consecutive chunks of ≤ `size` rows, padded with empty batches up to `min_count` chunks.

        Ranks must run the same number of forward/backward passes; pass the global maximum,
        ceil(ceil(B_global / world_size) / size), as `min_count` when shards can differ in size.
        """
        if size < 1:
            raise ValueError(f"micro-batch size must be ≥ 1, got {size}")
        chunks = [self.select(range(i, min(i + size, len(self)))) for i in range(0, len(self), size)]
        return chunks + [self.select([]) for _ in range(min_count - len(chunks))]

    @staticmethod
    def concat(batches: list[TrainBatch]) -> TrainBatch:
        """Rows of all batches in order, right-padded to the widest."""
        if not batches or len({(b.policy_id, b.pad_id, b.old_logprobs is None) for b in batches}) != 1:
            got = [(b.policy_id, b.pad_id) for b in batches]
            raise ValueError(f"concat needs ≥ 1 batch of one (policy_id, pad_id), got {got}")
        width = max(b.input_ids.shape[1] for b in batches)

        def cat(name: str, pad: float | bool | int) -> Tensor:
            parts = [getattr(b, name) for b in batches]
            return torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[1]), value=pad) for p in parts])

        return TrainBatch(
            policy_id=batches[0].policy_id,
            input_ids=cat("input_ids", batches[0].pad_id),
            attention_mask=cat("attention_mask", False),
            loss_mask=cat("loss_mask", False),
            rollout_logprobs=cat("rollout_logprobs", 0.0),
            advantages=torch.cat([b.advantages for b in batches]),
            rewards=torch.cat([b.rewards for b in batches]),
            roles=[r for b in batches for r in b.roles],
            agents=[a for b in batches for a in b.agents],
            pad_id=batches[0].pad_id,
            old_logprobs=cat("old_logprobs", 0.0) if batches[0].old_logprobs is not None else None,
            move_weights=_cat_optional([b.move_weights for b in batches]),
            guards=batches[0].guards,
        )

    def to(self, device: torch.device | str) -> TrainBatch:
        """The batch with every tensor on `device` (the rest shared)."""
        def move(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.to(device)

        return dataclasses.replace(
            self, input_ids=self.input_ids.to(device), attention_mask=self.attention_mask.to(device),
            loss_mask=self.loss_mask.to(device), rollout_logprobs=self.rollout_logprobs.to(device),
            advantages=self.advantages.to(device), rewards=self.rewards.to(device),
            old_logprobs=move(self.old_logprobs), move_weights=move(self.move_weights))


def _cat_optional(parts: list[Tensor | None]) -> Tensor | None:
    """The parts end to end, or None unless every part is a tensor."""
    present = [p for p in parts if p is not None]
    return torch.cat(present) if len(present) == len(parts) else None


def empty_batch(policy_id: str, pad_id: int = 0) -> TrainBatch:
    """A batch with no rows (shape [0, 1]): what a policy whose roles produced no turn this step
    hands its learners, so every policy still takes its one optimizer step."""
    zeros = torch.zeros(0, 1)
    return TrainBatch(
        policy_id=policy_id,
        input_ids=torch.full((0, 1), pad_id, dtype=torch.long),
        attention_mask=zeros.bool(),
        loss_mask=zeros.bool(),
        rollout_logprobs=zeros,
        advantages=torch.zeros(0),
        rewards=torch.zeros(0),
        roles=[],
        agents=[],
        pad_id=pad_id,
    )


# Row counts build_batches returns, in total and per role (`<key>/<role>`).
STAT_KEYS = ("batch/rows", "batch/dropped_empty", "batch/dropped_truncated", "batch/truncated")


def flat_rewards(episodes: list[Episode]) -> Tensor:
    """turn.reward for every turn in flattened order → [N] float32."""
    return torch.tensor([t.reward for ep in episodes for t in ep.turns], dtype=torch.float32)


class _Row(NamedTuple):
    turn: Turn
    tokens: list[int]  # prompt + response, cut to max_len
    prompt_len: int
    logprobs: list[float]  # of the response tokens kept
    truncated: bool
    advantage: float


def _row(turn: Turn, advantage: float, max_len: int | None, max_prompt_len: int | None) -> _Row:
    c = turn.completion
    if len(c.response_ids) != len(c.logprobs):
        raise ValueError(f"{turn.agent}: {len(c.response_ids)} response ids but {len(c.logprobs)} logprobs")
    if c.response_ids and not c.prompt_ids:
        raise ValueError(f"{turn.agent}: empty prompt_ids; the first response token has no predictor")
    if max_prompt_len is not None and len(c.prompt_ids) > max_prompt_len:
        # The engine saw the whole prompt; a row cut to the cap would train on a
        # context that was never sampled.
        return _Row(turn, [], len(c.prompt_ids), [], True, advantage)
    tokens = list(c.prompt_ids) + list(c.response_ids)
    cut = tokens[:max_len] if max_len is not None else tokens
    kept = max(0, len(cut) - len(c.prompt_ids))
    return _Row(turn, cut, len(c.prompt_ids), list(c.logprobs[:kept]), len(cut) < len(tokens), advantage)


def _stack_rows(policy_id: str, rows: list[_Row], pad_id: int, guards: Mapping[str, str]) -> TrainBatch:
    """One right-padded TrainBatch from rows."""
    shape = (len(rows), max(len(r.tokens) for r in rows))
    input_ids = torch.full(shape, pad_id, dtype=torch.long)
    attention_mask = torch.zeros(shape, dtype=torch.bool)
    loss_mask = torch.zeros(shape, dtype=torch.bool)
    rollout_logprobs = torch.zeros(shape, dtype=torch.float32)
    for i, r in enumerate(rows):
        end = len(r.tokens)
        input_ids[i, :end] = torch.tensor(r.tokens, dtype=torch.long)
        attention_mask[i, :end] = True
        loss_mask[i, r.prompt_len : end] = True
        rollout_logprobs[i, r.prompt_len : end] = torch.tensor(r.logprobs, dtype=torch.float32)
    return TrainBatch(
        policy_id=policy_id,
        input_ids=input_ids,
        attention_mask=attention_mask,
        loss_mask=loss_mask,
        rollout_logprobs=rollout_logprobs,
        advantages=torch.tensor([r.advantage for r in rows], dtype=torch.float32),
        rewards=torch.tensor([r.turn.reward for r in rows], dtype=torch.float32),
        roles=[r.turn.role for r in rows],
        agents=[r.turn.agent for r in rows],
        pad_id=pad_id,
        guards={role: text for role, text in guards.items() if any(r.turn.role == role for r in rows)},
    )


def build_batches(
    episodes: list[Episode],
    policy_map: PolicyMap,
    advantages: Tensor,
    pad_ids: Mapping[str, int],
    max_len: int | None = None,
    max_prompt_len: int | None = None,
    balance_ranks: int = 0,
    guards: Mapping[str, str] | None = None,
) -> tuple[dict[str, TrainBatch], dict[str, int]]:
    """One TrainBatch per policy from every turn; returns (batches, stats).

    advantages [N] holds one value per turn in flattened order (as `group_keys`). Each turn becomes a row of
    batch policy_map[turn.role], padded with that policy's `pad_ids` entry (policy -> pad id: policies on
    different base models have their own tokenizers): prompt_ids + response_ids, cut to
    the first `max_len` tokens if given (loss mask and logprobs cut with them). Turns with no response token
    left (empty response, or cut away entirely) are dropped, and so are turns whose prompt is longer than
    `max_prompt_len` (if given). Batches are keyed in policy_map.policies order; a policy with no rows is
    absent. stats (flat, stable keys, for the driver to log; every key also per role as `<key>/<role>` for
    each of policy_map.roles): 'batch/rows', 'batch/dropped_empty', 'batch/dropped_truncated' (lost to the
    length caps), 'batch/truncated' (rows kept with part of their response cut). `balance_ranks` > 0: the kept
    rows of every policy together take verl's balanced order over that many ranks (learners/update/balance.py)
    before they are split per policy. `guards` (role -> grammar text): the output guards the roles' turns
    were sampled under, carried as each batch's `guards`. Raises ValueError on a length mismatch or an empty
    prompt.
    """
    turns = [t for ep in episodes for t in ep.turns]
    if tuple(advantages.shape) != (len(turns),):
        raise ValueError(f"advantages has shape {tuple(advantages.shape)}, want ({len(turns)},)")
    stats = dict.fromkeys([*STAT_KEYS, *(f"{k}/{r}" for k in STAT_KEYS for r in policy_map.roles)], 0)
    kept: list[_Row] = []
    for turn, adv in zip(turns, advantages.tolist(), strict=True):
        row = _row(turn, adv, max_len, max_prompt_len)
        if not turn.completion.response_ids:
            counted = ["batch/dropped_empty"]
        elif not row.logprobs:
            counted = ["batch/dropped_truncated"]
        else:
            counted = ["batch/rows", *(["batch/truncated"] if row.truncated else [])]
            kept.append(row)
        for key in counted:
            stats[key] += 1
            stats[f"{key}/{turn.role}"] = stats.get(f"{key}/{turn.role}", 0) + 1
    if balance_ranks:
        kept = [kept[i] for i in balanced_order([len(r.tokens) for r in kept], balance_ranks)]
    per_policy: dict[str, list[_Row]] = {p: [] for p in policy_map.policies}
    for row in kept:
        per_policy[policy_map[row.turn.role]].append(row)
    batches = {p: _stack_rows(p, rows, pad_ids[p], guards or {}) for p, rows in per_policy.items() if rows}
    return batches, stats


class RoleDropError(RuntimeError):
    """A role lost more of its rows to the length caps in one step than `algo.max_role_drop_frac` allows."""


def check_role_drops(stats: dict[str, int], step: int, max_frac: float) -> None:
    """Raises RoleDropError naming the role that lost the largest fraction of its rows to the length caps
    (`batch/dropped_truncated/<role>` of that plus `batch/rows/<role>`) when that fraction exceeds
    `max_frac`; max_frac = 1 never stops. Empty responses are not length losses and do not count."""
    prefix = "batch/dropped_truncated/"
    losses = []
    for key, lost in stats.items():
        if key.startswith(prefix) and lost:
            role = key[len(prefix):]
            losses.append((lost / (lost + stats.get(f"batch/rows/{role}", 0)), role, lost))
    if not losses:
        return
    frac, role, lost = max(losses)
    if frac > max_frac:
        total = lost + stats.get(f"batch/rows/{role}", 0)
        raise RoleDropError(f"role '{role}' lost {lost} of {total} rows to length caps in step {step} "
                            f"(algo.max_role_drop_frac={max_frac})")
