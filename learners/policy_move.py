"""How far one training step moved a policy: the mean |Δ log-prob| per response token of the step's rows,
after the update against before it (`update/policy_move/<policy>`, `learner.policy_move`).

"Before" is what the learner computed anyway before the weights moved: the log-probs of the first optimizer
step it takes (its forward runs on the weights of before the update) and, with
`algo.old_logprobs=recompute`, the no-grad pass over the later steps' rows. "After" is one extra no-grad
forward over those rows once the step's last optimizer step is taken. With `old_logprobs=rollout` only the
first step's rows have learner log-probs from before the update, so only they are measured (the engines'
log-probs would add the engine/learner mismatch).

With the diagnostics sampled (`learner.diagnostics.sample_rows`, learners/diagnostic_sample.py) the rows carry
`move_weights`: only the sampled rows get the "after" forward, their |Δ| sums scaled by their weight, while
every row's tokens still count, so the mean stays an unbiased estimate of the all-rows mean.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import cast

import torch
from torch import Tensor

from learners.batch import TrainBatch


def weighted_shift_sum(after: Tensor, before: Tensor, mask: Tensor, weights: Tensor) -> float:
    """Σ_rows weights · Σ_t |after − before| over mask: the sampled rows' estimate of the numerator.

    after, before [B, T] log-probs on the same tokens; mask [B, T] 1 on response tokens; weights [B]."""
    per_row = ((after - before).abs() * mask.to(after.dtype)).sum(-1)
    return float((per_row * weights.to(per_row)).sum())


def abs_shift_sums(after: Tensor, before: Tensor, mask: Tensor) -> tuple[float, float]:
    """(Σ |after − before| over mask, Σ mask): the numerator and denominator of the mean shift per token.

    after, before [B, T] log-probs on the same tokens; mask [B, T] 1 on response tokens."""
    m = mask.to(after.dtype)
    return float(((after - before).abs() * m).sum()), float(m.sum())


class PolicyMove:
    """Collects (micro-batch, log-probs before the update) pairs during an update
    and measures them after it."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.capturing = False
        self.pending: list[tuple[TrainBatch, Tensor]] = []
        self.sampled: list[TrainBatch] = []  # sampled rows, their "before" as old_logprobs ([B, T])
        self.unsampled_tokens = 0.0  # the tokens of rows left out of the sample

    def start(self) -> None:
        """A new training step: capture the log-probs of the micro-batches computed until `stop_capture`."""
        self.pending = []
        self.sampled = []
        self.unsampled_tokens = 0.0
        self.capturing = self.enabled

    def capture(self, mb: TrainBatch, logprobs: Tensor) -> None:
        """logprobs [B, T−1] of `mb`'s shifted positions, as the loss takes them."""
        if self.capturing:
            self._take(mb, logprobs.detach())

    def _take(self, mb: TrainBatch, before: Tensor) -> None:
        """Every row of `mb` (no sample), or its sampled rows, kept with `before` [B, T−1]."""
        if mb.move_weights is None:
            self.pending.append((mb, before))
            return
        picked = mb.move_weights > 0
        self.unsampled_tokens += float(mb.loss_mask[~picked, 1:].sum())
        if bool(picked.any()):
            rows = mb.select(picked)
            width = rows.input_ids.shape[1]
            # "before" aligned as rollout_logprobs ([B, T]), so that it travels with its rows
            full = torch.nn.functional.pad(before[picked][:, :width - 1], (1, 0))
            self.sampled.append(dataclasses.replace(rows, old_logprobs=full))

    def stop_capture(self) -> None:
        self.capturing = False

    def add(self, mb: TrainBatch) -> None:
        """Rows whose `old_logprobs` [B, T] (aligned as rollout_logprobs) come from before the update."""
        if self.enabled and len(mb) and mb.old_logprobs is not None:
            self._take(mb, mb.old_logprobs[:, 1:])

    @torch.no_grad()
    def measure(self, logprobs: Callable[[TrainBatch], Tensor], passes: Callable[[int], int],
                idle: Callable[[], object],
                split: Callable[[TrainBatch], list[TrainBatch]]) -> tuple[float, float] | None:
        """This rank's (movement sum, its tokens), merged over ranks by the group; None when not measured.
        `logprobs(mb)` the policy's current [B, T−1]; `passes(n)` the forward passes to run for n of this
        rank's own (ranks that communicate inside forward run equally many), filled with `idle()`; `split` a
        batch into micro-batches (the sampled rows, gathered from every captured micro-batch, run as few
        passes as they fill)."""
        if not self.enabled:
            return None
        if self.sampled or self.unsampled_tokens:
            return self._measure_sampled(logprobs, passes, idle, split)
        total, tokens = 0.0, 0.0
        for i in range(passes(len(self.pending))):
            if i >= len(self.pending):
                idle()
                continue
            mb, before = self.pending[i]
            s, n = abs_shift_sums(logprobs(mb), before, mb.loss_mask[:, 1:])
            total, tokens = total + s, tokens + n
        self.pending = []
        return total, tokens

    def _measure_sampled(self, logprobs: Callable[[TrainBatch], Tensor], passes: Callable[[int], int],
                         idle: Callable[[], object], split: Callable[[TrainBatch], list[TrainBatch]]
                         ) -> tuple[float, float]:
        micro = split(TrainBatch.concat(self.sampled)) if self.sampled else []
        total, tokens = 0.0, self.unsampled_tokens
        for i in range(passes(len(micro))):
            if i >= len(micro):
                idle()
                continue
            mb, mask = micro[i], micro[i].loss_mask[:, 1:]
            before, weights = cast(Tensor, mb.old_logprobs)[:, 1:], cast(Tensor, mb.move_weights)
            total += weighted_shift_sum(logprobs(mb), before, mask, weights)
            tokens += float(mask.sum())
        self.pending, self.sampled, self.unsampled_tokens = [], [], 0.0
        return total, tokens
