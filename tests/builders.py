"""The synthetic inputs tests and benchmarks build a learner from, written once: a LearnerSpec read from a
loaded config, a batch of hand-written rows, and a batch of seeded random ids."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from learners.batch import TrainBatch
from learners.member import LearnerSpec


def learner_spec(cfg: Any, model_path: str, *, policy_id: str = "p", temperature: float = 1.0,
                 total_steps: int = 10, num_policies: int = 1, policy_index: int = 0) -> LearnerSpec:
    """Policy `policy_id`'s spec from a loaded config's model, learner and algo sections, seed 0."""
    return LearnerSpec(policy_id=policy_id, model_path=model_path, model=cfg.model, learner=cfg.learner,
                       algo=cfg.algo, temperature=temperature, total_steps=total_steps, seed=0,
                       num_policies=num_policies, policy_index=policy_index)


def rows_batch(rows: Sequence[tuple[Any, ...]], pad_id: int = 0) -> TrainBatch:
    """rows: (prompt ids, response ids, advantage, role[, tail ids]) → right-padded TrainBatch of policy p,
    each row's agent its role's instance 0.

    The loss mask covers the response only; a tail is attended to but never a loss token.
    """
    seqs = [list(r[0]) + list(r[1]) + list(r[4] if len(r) > 4 else []) for r in rows]
    shape = (len(rows), max(len(s) for s in seqs))
    input_ids = torch.full(shape, pad_id, dtype=torch.long)
    attention = torch.zeros(shape, dtype=torch.bool)
    loss_mask = torch.zeros(shape, dtype=torch.bool)
    for i, (seq, row) in enumerate(zip(seqs, rows, strict=True)):
        input_ids[i, : len(seq)] = torch.tensor(seq)
        attention[i, : len(seq)] = True
        loss_mask[i, len(row[0]) : len(row[0]) + len(row[1])] = True
    return TrainBatch(
        policy_id="p", input_ids=input_ids, attention_mask=attention, loss_mask=loss_mask,
        rollout_logprobs=torch.zeros(shape), advantages=torch.tensor([float(r[2]) for r in rows]),
        rewards=torch.zeros(len(rows)), roles=[r[3] for r in rows], agents=[r[3] + "0" for r in rows],
        pad_id=pad_id,
    )


def random_batch(rows: int, width: int, prompt: int, vocab: int, *, seed: int = 0, policy_id: str = "p",
                 roles: Sequence[str] = ("solver",), agents: list[str] | None = None,
                 advantages: torch.Tensor | Callable[[torch.Generator], torch.Tensor] | None = None
                 ) -> TrainBatch:
    """`rows` rows of `width` ids below `vocab`, drawn from a generator seeded `seed`, every position
    attended, the loss on the positions from `prompt` on. Row i's role is roles[i % len(roles)], its agent
    (by default) that role's instance 0. `advantages` [rows]: linspace(-1, 1) by default, or drawn by a
    function of the generator after the ids."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (rows, width), generator=g)
    loss_mask = torch.zeros(rows, width, dtype=torch.bool)
    loss_mask[:, prompt:] = True
    if advantages is None:
        advantages = torch.linspace(-1, 1, rows)
    elif callable(advantages):
        advantages = advantages(g)
    row_roles = [roles[i % len(roles)] for i in range(rows)]
    return TrainBatch(
        policy_id=policy_id, input_ids=ids, attention_mask=torch.ones_like(loss_mask), loss_mask=loss_mask,
        rollout_logprobs=torch.zeros(rows, width), advantages=advantages, rewards=torch.zeros(rows),
        roles=row_roles, agents=agents if agents is not None else [r + "0" for r in row_roles],
    )
