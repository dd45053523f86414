"""PolicyPasses: a learner rank's forward passes over its policy, outside the optimizer-step loop.

It owns how a rank's rows become micro-batches (`learner.micro_batch_size` rows, or a token budget:
learners.update.micro_batches), how log-probs and entropy come out of them (the chunked LM head,
learners.compute.logprob_head, under bf16 autocast when the rank trains mixed precision), the reference's
log-probs (a separate frozen copy, or the LoRA policy with its adapter disabled), the no-grad passes that run
before the first optimizer step (the behaviour policy's log-probs for the PPO ratio; the diagnostics of rows
no step trains), and the idle passes a rank runs when ranks must agree on their number (the backend's
`matched_passes`). The Learner (learners/learner.py) takes the gradient of what these passes return.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

import torch

from learners.batch import TrainBatch
from learners.compute.guard_masks import GuardReplay, LossMasks
from learners.compute.logprob_head import sequence_logprobs
from learners.config import AlgoConfig, LearnerConfig
from learners.gradients.backends import GradientBackend
from learners.rank_metrics import TokenSums
from learners.update.micro_batches import micro_batch_rows
from learners.update.policy_loss import diagnostic_terms
from learners.update.ppo_plan import UpdatePlan

if TYPE_CHECKING:  # annotations only
    from learners.state.weights import PolicyModel


@dataclasses.dataclass
class PolicyPasses:
    """The forward passes of one rank's policy `model`, run through `backend` (its device, its forward runner,
    the passes it matches across ranks).

    reference: a frozen copy for the KL term, or None (a LoRA policy's reference
    is its base, the adapter off).
    temperature: the rollout's sampling temperature (> 0) the log-probs are scaled by, as the engines sampled.
    autocast: torch.bfloat16 for mixed precision on the torch backend, else None."""

    model: Any
    reference: Any
    backend: GradientBackend
    cfg: LearnerConfig
    algo: AlgoConfig
    temperature: float
    autocast: torch.dtype | None
    # the policy's model folder: its tokenizer replays guarded rows' grammars
    # (learners/compute/guard_masks.py)
    model_path: str = ""
    replay_guards: bool = True  # False only to measure what the replay corrects (benchmarks/guards.py)
    _replay: GuardReplay | None = None

    def micro_rows(self, lengths: list[int]) -> list[list[int]]:
        """Row positions per micro-batch: `learner.micro_batch_size` rows, or
        learner.max_tokens_per_micro_batch tokens (rows × widest row; padding-free: their sum) when set
        (learners.update.micro_batches)."""
        return micro_batch_rows(lengths, self.cfg.micro_batch_size, self.cfg.max_tokens_per_micro_batch,
                                packed=self.cfg.padding_free)

    def micro_batches(self, data: TrainBatch) -> list[TrainBatch]:
        return [data.select(rows) for rows in self.micro_rows(data.attention_mask.sum(-1).tolist())]

    def passes(self, data: TrainBatch, rows: list[int]) -> Iterator[tuple[list[int], TrainBatch]]:
        """(row positions, micro-batch) of `rows` (longest first) in micro-batches for one pass each, then the
        idle passes the backend matches across ranks (run here, yielding nothing)."""
        chunks = [
            [rows[i] for i in group] for group in self.micro_rows(data.attention_mask[rows].sum(-1).tolist())
        ]
        for j in range(self.backend.matched_passes(len(chunks))):
            if j < len(chunks):
                yield chunks[j], data.select(chunks[j])
            else:
                self.idle_loss()

    @torch.no_grad()
    def with_old_logprobs(self, data: TrainBatch, plan: UpdatePlan) -> TrainBatch:
        """`data` with the behaviour policy's log-probs for the PPO ratio
        ([B, T], aligned as rollout_logprobs).

        rollout: the engines' own. recompute: one no-grad pass of this learner, before the first optimizer
        step, over the rows a later step trains (the first step's rows use their current log-probs)."""
        if self.algo.old_logprobs == "rollout":
            return dataclasses.replace(data, old_logprobs=data.rollout_logprobs)
        if len(plan.steps) < 2:
            return data
        old = torch.zeros_like(data.rollout_logprobs)
        for rows, mb in self.passes(data, data.longest_first(sorted({i for r in plan.steps[1:] for i in r}))):
            old[torch.tensor(rows), 1:mb.input_ids.shape[1]] = self.logprobs(mb)[0]
        return dataclasses.replace(data, old_logprobs=old)

    @torch.no_grad()
    def skipped_row_metrics(self, data: TrainBatch, rows: list[int],
                            weights: tuple[float, ...] | None = None) -> TokenSums:
        """The diagnostics' sums (learners.update.policy_loss.diagnostic_terms, and the tokens the clip
        fraction counts) of the rows that train in no step, a zero advantage's, from one no-grad pass before
        the first step: the per-role entropy and engine gap then cover every row, as if they had trained
        (their loss and gradient are exactly zero). `weights[j]`: rows[j]'s weight when they are a sample
        (learners/diagnostic_sample.py)."""
        sums = TokenSums()
        weight_of = dict(zip(rows, weights, strict=True)) if weights is not None else None
        for chunk, mb in self.passes(data, data.longest_first(rows)):
            lp, entropy = self.logprobs(mb, entropy=True)
            entropy = cast(torch.Tensor, entropy)  # asked for, so present
            mask = mb.loss_mask[:, 1:]
            w = torch.tensor([weight_of[i] for i in chunk]) if weight_of is not None else None
            diag = diagnostic_terms(lp, mb.rollout_logprobs[:, 1:], entropy, mask, mb.roles, w)
            sums = dataclasses.replace(sums, tokens=sums.tokens + float(mask.sum()), roles=sums.roles.added(
                entropy=diag.entropy, logprob_diff=diag.logprob_diff, tokens=diag.tokens))
        return sums

    def idle_loss(self) -> torch.Tensor:
        """A zero loss whose graph reaches every weight: this rank's share of a pass it has no rows
        for. It runs the same head path as a real pass (no loss token: a ZeRO-3 head runs the
        chunks the other ranks run). Its tokens are id 0, in every vocabulary: the loss is scaled to zero, so
        which token it reads does not matter."""
        ids = torch.zeros((1, 2), dtype=torch.long, device=self.backend.device)
        ones = torch.ones_like(ids, dtype=torch.bool)
        return (
            self._sequence_logprobs(self.model, self.backend.runner(False), ids, ones, ~ones)[0].sum() * 0.0
        )

    def logprobs(self, mb: TrainBatch, plain: bool = False, model: PolicyModel | None = None,
                 entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(log-probs [B, T−1] of mb's tokens 1.., entropy [B, T−1] detached or None) of the
        temperature-scaled policy, or of `model` (the reference), through the LM head in chunks of
        `learner.logits_chunk_tokens` positions (learners.compute.logprob_head). `plain`: through the
        module itself, outside the backend's engine (per-role gradients). Only positions under
        loss_mask[:, 1:] are meaningful."""
        runner = self.backend.runner(plain) if model is None else model
        return self._sequence_logprobs(self.model if model is None else model, runner, mb.input_ids,
                                       mb.attention_mask, mb.loss_mask, entropy=entropy,
                                       allowed=self.guard_masks(mb))

    def guard_masks(self, mb: TrainBatch) -> LossMasks | None:
        """The allowed tokens at mb's loss positions of guarded rows (their grammar replayed), or None."""
        if not mb.guards or not self.replay_guards:
            return None
        if self._replay is None:
            self._replay = GuardReplay(self.model_path, int(self.model.config.vocab_size))
        return self._replay.loss_masks(mb.input_ids, mb.loss_mask, mb.roles, mb.guards)

    @torch.no_grad()
    def policy_logprobs(self, mb: TrainBatch) -> torch.Tensor:
        """The policy's log-probs [B, T−1], 0 before the response window (as in the loss)."""
        return self.logprobs(mb)[0]

    @torch.no_grad()
    def reference_logprobs(self, mb: TrainBatch) -> torch.Tensor:
        """The reference's log-probs [B, T−1], 0 before the response window (as the policy's)."""
        if self.reference is None:
            with self.model.disable_adapter():
                return self.logprobs(mb, model=self.model)[0]
        return self.logprobs(mb, model=self.reference)[0]

    def _sequence_logprobs(
        self,
        model: PolicyModel,
        runner: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        loss_mask: torch.Tensor,
        entropy: bool = False,
        allowed: LossMasks | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        with torch.autocast("cpu", dtype=self.autocast) if self.autocast else contextlib.nullcontext():
            return sequence_logprobs(model, runner, input_ids, attention_mask, loss_mask,
                                     temperature=self.temperature, chunk=self.cfg.logits_chunk_tokens,
                                     entropy=entropy, padding_free=self.cfg.padding_free,
                                     agree=self.backend.matched_passes, allowed=allowed)
