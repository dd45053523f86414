"""The diagnostics folded into the training forward (docs/performance.md, the pass audit) equal what a pass of
their own would measure, to 1e-6: the trained rows' per-role entropy and engine gap, and the policy movement's
"before" log-probs, on a seeded update of the tiny model."""

import dataclasses

import pytest
import torch

from jobs.config import load_config
from jobs.models.resolve import resolve_model
from learners.learner import Learner
from learners.policy_move import abs_shift_sums
from learners.update.ppo_plan import UpdatePlan
from tests.builders import learner_spec, rows_batch
from tests.learners.test_learner_group import BASE, ROWS

TOL = 1e-6


def make_learner(*overrides: str) -> Learner:
    cfg = load_config("jobs/configs/tiny.yaml", [*BASE, "learner.micro_batch_size=2", *overrides])
    spec = learner_spec(cfg, resolve_model("builtin:tiny"), temperature=0.7)
    return Learner(spec)


def whole_plan(batch) -> UpdatePlan:
    return UpdatePlan.whole(len(batch), float(batch.loss_mask[:, 1:].sum()), sorted(set(batch.roles)))


@pytest.mark.parametrize("sample", ["all", "2"])
def test_trained_rows_diagnostics_from_the_training_forward_equal_their_own_pass(sample):
    batch = rows_batch(ROWS)
    learner = make_learner(f"learner.diagnostics.sample_rows={sample}")
    # a pass of their own, on the same weights
    own = learner.passes.skipped_row_metrics(batch, list(range(len(batch))))
    got = learner.update(batch, whole_plan(batch))
    pairs = [(f"{name}/{role}", getattr(got.sums.roles, name)[role], value)
             for name in ("entropy", "logprob_diff", "tokens")
             for role, value in getattr(own.roles, name).items()]
    assert len(pairs) == 6
    for key, value, expected in pairs:
        assert value == pytest.approx(expected, rel=TOL, abs=TOL), key


def test_policy_move_before_from_the_training_forward_equals_its_own_pass():
    batch = rows_batch(ROWS)
    learner = make_learner("learner.diagnostics.sample_rows=all")
    before = [learner.passes.policy_logprobs(mb) for mb in learner.passes.micro_batches(batch)]
    got = learner.update(batch, whole_plan(batch))
    total, tokens = 0.0, 0.0
    for mb, lp in zip(learner.passes.micro_batches(batch), before, strict=True):
        s, n = abs_shift_sums(learner.passes.policy_logprobs(mb), lp, mb.loss_mask[:, 1:])
        total, tokens = total + s, tokens + n
    assert got.sums.move_tokens == tokens and total > 0.0
    assert got.sums.move == pytest.approx(total, rel=TOL, abs=TOL)


def test_the_sampled_movement_weights_a_subset_of_the_same_rows():
    # Every row at weight 1 through the sampled path measures what `all` measures.
    batch = rows_batch(ROWS)
    every = make_learner("learner.diagnostics.sample_rows=all")
    sampled = make_learner("learner.diagnostics.sample_rows=8")
    plan = whole_plan(batch)
    m_all = every.update(batch, plan)
    m_one = sampled.update(batch, dataclasses.replace(plan, move_weights=(1.0,) * len(batch)))
    assert m_one.sums.move_tokens == m_all.sums.move_tokens
    assert m_one.sums.move == pytest.approx(m_all.sums.move, rel=TOL)
    w_all, w_one = every.get_weights(), sampled.get_weights()
    assert all(torch.equal(w_all[k], w_one[k]) for k in w_all)
