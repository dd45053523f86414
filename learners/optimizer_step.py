"""One optimizer step of a Learner rank: the mini-batch's gradient (one backward per micro-batch through the
backend, or each role's gradient apart), summed over ranks, clipped and applied by the backend, and the count
of steps that did not apply (a non-finite gradient).

learners/learner.py runs the steps of a training step's UpdatePlan through it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import cast

import torch

from cluster import collective
from learners.batch import TrainBatch
from learners.config import AlgoConfig
from learners.gradients.backends import GradientBackend
from learners.passes import PolicyPasses
from learners.policy_move import PolicyMove
from learners.rank_metrics import TokenSums
from learners.role_grads import flat_autograd, role_grad_metrics
from learners.update.micro_batches import padding
from learners.update.policy_loss import policy_loss


class OptimizerStep:
    """The optimizer steps of policy `policy_id` on one rank, its micro-batches' forward passes by `passes`,
    their log-probs before the update offered to `move`."""

    def __init__(self, passes: PolicyPasses, backend: GradientBackend, move: PolicyMove,
                 params: list[torch.nn.Parameter], algo: AlgoConfig, policy_id: str):
        self.passes, self.backend, self.move = passes, backend, move
        self.params, self.algo, self.policy_id = params, algo, policy_id
        # Optimizer steps that left the weights as they were (a non-finite gradient): this training step's,
        # and the run of consecutive ones across training steps (the driver stops the run on a long one).
        self.nonfinite_steps, self.nonfinite_run = 0, 0

    def run(self, mb: TrainBatch, normalizer: float, roles: list[str] | None,
            sums: TokenSums) -> tuple[dict[str, float], TokenSums]:
        """One optimizer step on mini-batch `mb`: its gradient summed over ranks, clipping, the step.
        Returns (the step's metrics: lr, grad norm and the per-role gradient metrics, if taken; `sums` plus
        its micro-batches' metric sums).

        With `roles` (and a backend holding whole weights outside forward) each role's gradient is taken apart
        and the step uses their sum, which is the plain gradient. Otherwise the backend runs one backward per
        micro-batch, and idle ones up to the passes it matches across ranks."""
        metrics: dict[str, float] = {}
        if roles and self.backend.per_role_gradients:
            role_grads, total = self._role_gradients(mb, normalizer, roles, sums)
            self.backend.apply_gradient(role_grads.sum(0))
            metrics = role_grad_metrics(role_grads, roles, self.policy_id)
        else:
            total = self._backward(mb, normalizer, sums)
        lr, norm, applied = self.backend.step()
        metrics["lr"], metrics["grad_norm"] = lr, norm
        self._count_applied(applied and math.isfinite(norm))
        return metrics, total

    def _count_applied(self, applied: bool) -> None:
        """A step that did not apply (the backend skipped it, or its gradient norm is inf or NaN) counts in
        this training step's `nonfinite_steps` and in the run of consecutive ones; an applied step ends
        that run."""
        self.nonfinite_steps += not applied
        self.nonfinite_run = 0 if applied else self.nonfinite_run + 1

    def _backward(self, data: TrainBatch, normalizer: float, sums: TokenSums) -> TokenSums:
        """The backend's backward through each micro-batch's loss, built as the backend consumes it
        (one graph alive at a time), then idle ones; returns `sums` plus the micro-batches' metric
        sums, in the order they ran."""
        total = sums

        def losses() -> Iterator[torch.Tensor]:
            nonlocal total
            micro = self.passes.micro_batches(data)
            for i in range(max(self.backend.matched_passes(len(micro)), self.backend.min_backward_passes)):
                if i >= len(micro):
                    yield self.passes.idle_loss()
                    continue
                loss, metrics = self.micro_step(micro[i], normalizer)
                total = total.plus(metrics)
                yield loss

        self.backend.backward(losses())
        return total

    def _role_gradients(self, data: TrainBatch, normalizer: float, roles: list[str],
                        sums: TokenSums) -> tuple[torch.Tensor, TokenSums]:
        """([R, P] summed over ranks: row r is the gradient of role r's rows' share of the mini-batch's loss;
        `sums` plus the micro-batches' metric sums).

        Taken with torch.autograd.grad through the plain module, outside any engine's reduction hooks."""
        out = torch.zeros(len(roles), sum(p.numel() for p in self.params), device=self.backend.device)
        total = sums
        for r, role in enumerate(roles):
            rows = [i for i, x in enumerate(data.roles) if x == role]
            for mb in self.passes.micro_batches(data.select(rows)) if rows else []:
                loss, metrics = self.micro_step(mb, normalizer, plain=True)
                total = total.plus(metrics)
                out[r] += flat_autograd(
                    torch.autograd.grad(loss, self.params, allow_unused=True), self.params
                )
        collective.all_reduce_sum(out)
        return out, total

    def micro_step(self, mb: TrainBatch, normalizer: float,
                   plain: bool = False) -> tuple[torch.Tensor, TokenSums]:
        """(One micro-batch's loss (learners.update.policy_loss, normalised by the global `normalizer`), its
        metric sums: padded_positions, positions and policy_loss's). The PPO ratio is taken against
        `mb.old_logprobs` (the behaviour policy), or against the current log-probs, detached, when there are
        none (the first optimizer step of a recomputed plan)."""
        lp, entropy = self.passes.logprobs(mb, plain, entropy=True)
        entropy = cast(torch.Tensor, entropy)  # asked for, so present
        self.move.capture(mb, lp)
        padded, positions = padding(mb.attention_mask.sum(-1).tolist())
        algo = self.algo
        reference = (
            self.passes.reference_logprobs(mb) if algo.uses_kl else None
        )
        old = mb.old_logprobs[:, 1:] if mb.old_logprobs is not None else None
        loss, sums = policy_loss(lp, old, mb.rollout_logprobs[:, 1:], mb.advantages, mb.loss_mask[:, 1:],
                                 mb.roles, ref_logprobs=reference, entropy=entropy, algo=algo,
                                 normalizer=normalizer)
        return loss, dataclasses.replace(sums, padded_positions=float(padded), positions=float(positions))
