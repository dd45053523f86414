"""Per-role gradient diagnostics and the mitigations: hand-computed values and end-to-end identities."""

from __future__ import annotations

import math

import pytest
import torch

from learners.role_grads import advantage_mass, role_grad_metrics, step_role_shares
from learners.update.losses import tis_weights
from learners.update.mitigations import parallel_agent_weights, role_balance_weights
from tests.builders import rows_batch
from tests.learners.test_learner_group import ROWS, make_group, max_abs_diff, weights


def test_role_grad_metrics_by_hand():
    grads = torch.tensor([[3.0, 4.0, 0.0], [0.0, 0.0, 5.0], [0.0, 0.0, 0.0]])
    m = role_grad_metrics(grads, ["a", "b", "c"], "p")
    assert m["grad/role_norm/a"] == 5.0 and m["grad/role_norm/b"] == 5.0 and m["grad/role_norm/c"] == 0.0
    assert m["grad/norm_share/a"] == 0.5 and m["grad/dominance/p"] == 0.5
    assert m["grad/cos/a__b"] == 0.0
    assert "grad/cos/a__c" not in m  # undefined for a zero gradient


def test_advantage_mass_by_hand():
    m = advantage_mass(["g", "g", "e"], torch.tensor([1.0, -2.0, 0.5]), torch.tensor([2, 1, 4]))
    assert m == pytest.approx({"grad/mass/g": 4.0, "grad/mass/e": 2.0, "grad/mass_share/g": 4.0 / 6.0,
                               "grad/mass_share/e": 2.0 / 6.0})


def test_step_role_shares_span_policies():
    # Isolated: each policy's only role has within-policy share 1; across the step the generator carries 3/4.
    per_policy = {"grad/mass/g": 6.0, "grad/mass_share/g": 1.0, "grad/mass/a": 2.0, "grad/mass_share/a": 1.0,
                  "grad/role_norm/g": 0.5, "grad/role_norm/a": 2.0}
    m = step_role_shares(per_policy, ["g", "a"])
    assert m == pytest.approx({"grad/step_mass_share/g": 0.75, "grad/step_mass_share/a": 0.25,
                               "grad/step_norm_share/g": 0.2, "grad/step_norm_share/a": 0.8})
    # A role with no recorded norms (diagnostics off) gets no norm share; a zero step gets zeros, not NaN.
    assert step_role_shares({"grad/mass/g": 0.0, "grad/mass/a": 0.0}, ["g", "a"]) == {
        "grad/step_mass_share/g": 0.0, "grad/step_mass_share/a": 0.0}


def test_role_balance_weights_equalise_each_roles_mean():
    w = role_balance_weights(["g", "g", "g", "e"], torch.tensor([2, 2, 2, 6]))
    # N = 12, R = 2: g rows get 12 / (2·6) = 1, e gets 12 / (2·6) = 1; now unequal masses:
    assert torch.allclose(w, torch.tensor([1.0, 1.0, 1.0, 1.0]))
    w = role_balance_weights(["g", "g", "g", "e"], torch.tensor([4, 4, 4, 3]))
    assert torch.allclose(w, torch.tensor([15 / 24, 15 / 24, 15 / 24, 15 / 6]))
    # each role's weighted token mass is now N / R
    assert float((w * torch.tensor([4, 4, 4, 3]))[:3].sum()) == pytest.approx(7.5)


def test_parallel_agent_weights():
    w = parallel_agent_weights(["generator"] * 4 + ["aggregator"], ["g0", "g1", "g2", "g0", "agg"])
    assert torch.allclose(w, torch.tensor([1 / 3, 1 / 3, 1 / 3, 1 / 3, 1.0]))


def test_tis_weights_truncate_the_ratio():
    lp = torch.tensor([[0.0, math.log(0.5), math.log(4.0)]])
    rollout = torch.zeros(1, 3)
    mask = torch.tensor([[False, True, True]])
    assert torch.allclose(tis_weights(lp, rollout, mask, cap=2.0), torch.tensor([[1.0, 0.5, 2.0]]))


def test_per_role_gradients_sum_to_the_plain_update():
    with_diag, without = make_group(), make_group("learner.role_grad_diagnostics=false")
    m = with_diag.update(rows_batch(ROWS))
    without.update(rows_batch(ROWS))
    assert {"grad/role_norm/generator", "grad/role_norm/evaluator", "grad/dominance/p"} <= set(m)
    assert max_abs_diff(weights(with_diag), weights(without)) < 1e-5


IDENTICAL = ([10, 11, 12], [20, 21, 22, 23], 1.0)


def _parallel_batch():
    """Role 'generator' has 3 parallel agents answering the identical prompt identically (same advantage);
    role 'evaluator' has one agent with the very same row."""
    batch = rows_batch([(*IDENTICAL, "generator")] * 3 + [(*IDENTICAL, "evaluator")])
    batch.agents = ["generator0", "generator1", "generator2", "evaluator"]
    return batch


def test_three_parallel_agents_triple_their_roles_gradient_and_normalisation_removes_it():
    m = make_group().update(_parallel_batch())
    assert m["grad/role_norm/generator"] == pytest.approx(3 * m["grad/role_norm/evaluator"], rel=1e-4)
    assert m["grad/norm_share/generator"] == pytest.approx(0.75, rel=1e-4)
    normed = make_group("algo.parallel_agent_norm=true").update(_parallel_batch())
    assert normed["grad/role_norm/generator"] == pytest.approx(normed["grad/role_norm/evaluator"], rel=1e-4)


def test_role_balance_equalises_roles_of_unequal_token_mass():
    m = make_group("algo.role_balance=true").update(_parallel_batch())
    assert m["grad/role_norm/generator"] == pytest.approx(m["grad/role_norm/evaluator"], rel=1e-4)


def test_role_metrics_never_overwrite_the_policy_total_when_names_coincide():
    # Under isolated maps a policy is named after its role: both keys must survive, with their own meaning.
    m = role_grad_metrics(torch.tensor([[3.0, 4.0]]), ["generator"], "generator")
    assert "grad/norm/generator" not in m and m["grad/role_norm/generator"] == 5.0


def test_mitigations_leave_the_callers_batch_unchanged():
    batch = _parallel_batch()
    before = batch.advantages.clone()
    make_group("algo.parallel_agent_norm=true", "algo.role_balance=true").update(batch)
    assert torch.equal(batch.advantages, before)
