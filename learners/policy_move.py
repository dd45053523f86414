"""How far one training step moved a policy: the mean |Δ log-prob| per response token of the step's rows,
after the update against before it (`update/policy_move/<policy>`, `learner.policy_move`).

"Before" is what the learner computed anyway before the weights moved: the log-probs of the first optimizer step
it takes (its forward runs on the weights of before the update) and, with `algo.old_logprobs=recompute`, the
no-grad pass over the later steps' rows. "After" is one extra no-grad forward over those rows once the step's last
optimizer step is taken. With `old_logprobs=rollout` only the first step's rows have learner log-probs from
before the update, so only they are measured (the engines' log-probs would add the engine/learner mismatch).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from learners.batch import TrainBatch


def abs_shift_sums(after: Tensor, before: Tensor, mask: Tensor) -> tuple[float, float]:
    """(Σ |after − before| over mask, Σ mask): the numerator and denominator of the mean shift per token.

    after, before [B, T] log-probs on the same tokens; mask [B, T] 1 on response tokens."""
    m = mask.to(after.dtype)
    return float(((after - before).abs() * m).sum()), float(m.sum())


class PolicyMove:
    """Collects (micro-batch, log-probs before the update) pairs during an update and measures them after it."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.capturing = False
        self.pending: list[tuple[TrainBatch, Tensor]] = []

    def start(self) -> None:
        """A new training step: capture the log-probs of the micro-batches computed until `stop_capture`."""
        self.pending, self.capturing = [], self.enabled

    def capture(self, mb: TrainBatch, logprobs: Tensor) -> None:
        """logprobs [B, T−1] of `mb`'s shifted positions, as the loss takes them."""
        if self.capturing:
            self.pending.append((mb, logprobs.detach()))

    def stop_capture(self) -> None:
        self.capturing = False

    def add(self, mb: TrainBatch) -> None:
        """Rows whose `old_logprobs` [B, T] (aligned as rollout_logprobs) come from before the update."""
        if self.enabled and len(mb) and mb.old_logprobs is not None:
            self.pending.append((mb, mb.old_logprobs[:, 1:]))

    @torch.no_grad()
    def measure(self, logprobs: Callable[[TrainBatch], Tensor], passes: Callable[[int], int],
                idle: Callable[[], object]) -> dict[str, float]:
        """Metric sums {move_sum, move_tokens} of this rank (merged over ranks by the group). `logprobs(mb)` the
        policy's current [B, T−1]; `passes(n)` the forward passes to run for n of this rank's own (ranks that
        communicate inside forward run equally many), filled with `idle()`."""
        if not self.enabled:
            return {}
        total, tokens = 0.0, 0.0
        for i in range(passes(len(self.pending))):
            if i >= len(self.pending):
                idle()
                continue
            mb, before = self.pending[i]
            s, n = abs_shift_sums(logprobs(mb), before, mb.loss_mask[:, 1:])
            total, tokens = total + s, tokens + n
        self.pending = []
        return {"move_sum": total, "move_tokens": tokens}
