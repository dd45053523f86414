"""learners.update.policy_loss by hand: two rows (roles a and b), three shifted positions, every log-prob
0.5's, so each ratio, clip, weight and KL term below is a number one can check on paper."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from learners.update.policy_loss import policy_loss

ROLES = ["a", "b"]
MASK = torch.tensor([[True, True, False], [True, False, False]])  # a: 2 loss tokens, b: 1; N = 3
ADVANTAGES = torch.tensor([2.0, -1.0])
ENTROPY = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
LOG2 = math.log(2.0)


def algo(**overrides):
    settings = dict(clip_low=0.2, clip_high=0.28, loss_agg="token_mean", tis_cap=0.0, kl_coef=0.0,
                    kl_anchor_roles={}, kl_estimator="k1", dual_clip_c=0.0, log_ratio_clamp=0.0)
    return SimpleNamespace(**{**settings, **overrides})


def logprobs() -> torch.Tensor:
    return torch.full((2, 3), math.log(0.5), requires_grad=True)


def rows(a: float, b: float) -> torch.Tensor:
    """[2, 3]: `a` across row a, `b` across row b."""
    return torch.tensor([[a] * 3, [b] * 3])


def run(lp, old=None, rollout=None, ref=None, **settings):
    rollout = lp.detach() if rollout is None else rollout
    return policy_loss(lp, old, rollout, ADVANTAGES, MASK, ROLES, ref_logprobs=ref, entropy=ENTROPY,
                       algo=algo(**settings), normalizer=3.0)


def test_ratio_one_is_the_advantage_weighted_mean_and_its_gradient():
    lp = logprobs()
    rollout = lp.detach() - torch.tensor([[0.1, 0.2, 9.0], [0.3, 9.0, 9.0]])  # 9: outside the mask, ignored
    loss, m = run(lp, rollout=rollout)
    assert loss.item() == pytest.approx(-(2 + 2 - 1) / 3)
    loss.backward()
    assert torch.allclose(lp.grad, torch.tensor([[-2 / 3, -2 / 3, 0.0], [1 / 3, 0.0, 0.0]]))
    assert (m.loss, m.clip_frac, m.tokens, m.dual_clip_frac) == pytest.approx((-1.0, 0.0, 3.0, None))
    assert m.roles.tokens == {"a": 2.0, "b": 1.0} and m.roles.clip_frac == {"a": 0.0, "b": 0.0}
    assert m.roles.entropy == pytest.approx({"a": 1.0 + 2.0, "b": 4.0})
    assert m.roles.logprob_diff == pytest.approx({"a": 0.1 + 0.2, "b": 0.3}) and m.roles.kl == {}


def test_both_clip_bounds_hold_the_ratio_and_stop_its_gradient():
    # Row a: ratio 2 with A = 2 is held at 1 + 0.28; row b: ratio 0.5 with A = −1 is held at 1 − 0.2.
    lp = logprobs()
    loss, m = run(lp, old=lp.detach() - rows(LOG2, -LOG2))
    assert loss.item() == pytest.approx((-1.28 * 2 * 2 + 0.8 * 1) / 3)
    assert (m.clip_frac, m.roles.clip_frac["a"], m.roles.clip_frac["b"]) == (3.0, 2.0, 1.0)
    loss.backward()
    assert torch.equal(lp.grad, torch.zeros(2, 3))


def test_truncated_importance_weights_scale_the_advantages():
    # π_learner / π_rollout: 2 on row a (truncated to the cap 1.5), 0.5 on row b.
    lp = logprobs()
    loss, _ = run(lp, rollout=lp.detach() - rows(LOG2, -LOG2), tis_cap=1.5)
    assert loss.item() == pytest.approx(-(2 * 1.5 * 2 - 1 * 0.5) / 3)


def test_kl_term_weighs_each_row_by_the_coefficient_plus_its_roles_anchor():
    # k1 = lp − ref = 0.5 per token; coefficients a: 0.1, b: 0.1 + 1.0.
    lp = logprobs()
    loss, m = run(lp, ref=lp.detach() - 0.5, kl_coef=0.1, kl_anchor_roles={"b": 1.0})
    assert loss.item() == pytest.approx(-1.0 + (0.1 * 0.5 * 2 + 1.1 * 0.5) / 3)
    assert (m.roles.kl["a"], m.roles.kl["b"]) == pytest.approx((1.0, 0.5))
    assert m.loss == pytest.approx(loss.item())
    loss.backward()
    assert torch.allclose(
        lp.grad, torch.tensor([[(-2 + 0.1) / 3, (-2 + 0.1) / 3, 0.0], [(1 + 1.1) / 3, 0.0, 0.0]])
    )
    _, without = run(logprobs())
    assert not without.roles.kl


def test_micro_batches_under_the_global_normalizer_add_up_to_the_batch():
    lp = logprobs()
    whole, _ = run(lp, old=lp.detach() - rows(LOG2, 0.0))
    parts = [policy_loss(lp[i:i + 1], lp.detach()[i:i + 1] - rows(LOG2, 0.0)[i:i + 1], lp.detach()[i:i + 1],
                         ADVANTAGES[i:i + 1], MASK[i:i + 1], ROLES[i:i + 1], ref_logprobs=None,
                         entropy=ENTROPY[i:i + 1], algo=algo(), normalizer=3.0)[0] for i in range(2)]
    assert sum(parts).item() == pytest.approx(whole.item())


def test_dual_clip_caps_the_negative_advantage_row_and_counts_its_tokens():
    # Row b (A = −1) at ratio 4 costs 4 unclipped; dual-clip c = 3 caps it at 3 with no gradient. Row a (A =
    # 2) at ratio 4 is held at 1.28 by the upper clip either way.
    lp = logprobs()
    old = lp.detach() - rows(math.log(4.0), math.log(4.0))
    plain, m_plain = run(lp, old=old)
    capped, m = run(lp, old=old, dual_clip_c=3.0)
    assert plain.item() == pytest.approx((-1.28 * 2 * 2 + 4.0) / 3)
    assert capped.item() == pytest.approx((-1.28 * 2 * 2 + 3.0) / 3)
    assert m.dual_clip_frac == 1.0 and m_plain.dual_clip_frac is None
    capped.backward()
    assert torch.count_nonzero(lp.grad) == 0  # every token is held by a clip


def test_log_ratio_clamp_keeps_a_far_off_policy_token_finite():
    lp = logprobs()
    old = lp.detach() - rows(0.0, 100.0)  # row b: log-ratio 100, exp overflows float32
    assert not torch.isfinite(run(lp, old=old)[0])
    loss, _ = run(lp, old=old, log_ratio_clamp=20.0)
    assert loss.item() == pytest.approx((-2 * 2 + math.exp(20.0)) / 3, rel=1e-6)
