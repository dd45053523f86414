"""Hand-computed checks of log-probs, entropy, the clipped PPO loss and the KL estimators."""

import math

import pytest
import torch

from learners.update.losses import (
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    entropy_from_logits,
    kl_penalty,
    local_normalizer,
    masked_mean,
    masked_sum,
    ppo_clip_loss,
    token_logprobs,
)

LN2, LN3 = math.log(2.0), math.log(3.0)


def test_token_logprobs_hand_computed_and_vs_log_softmax():
    logits = torch.tensor([[[0.0, LN3], [0.0, LN3]]])  # softmax = [1/4, 3/4]
    lp = token_logprobs(logits, torch.tensor([[1, 0]]))
    assert torch.allclose(lp, torch.tensor([[math.log(0.75), math.log(0.25)]]))  # -0.287682, -1.386294
    torch.manual_seed(0)
    logits, targets = torch.randn(2, 5, 11), torch.randint(0, 11, (2, 5))
    manual = torch.log_softmax(logits, -1).gather(-1, targets[..., None])[..., 0]
    assert torch.allclose(token_logprobs(logits, targets), manual, atol=1e-6)
    low = token_logprobs(logits.bfloat16(), targets)  # row-wise float32 upcast path
    assert low.dtype == torch.float32
    assert torch.allclose(
        low, torch.log_softmax(logits.bfloat16().float(), -1).gather(-1, targets[..., None])[..., 0]
    )


def test_entropy_from_logits_hand_computed():
    logits = torch.tensor([[[0.0, LN3]], [[1.0, 1.0]]])  # softmax [1/4, 3/4] and [1/2, 1/2]
    ent = entropy_from_logits(logits)
    expected_first = 0.25 * math.log(4.0) + 0.75 * math.log(4.0 / 3.0)  # 0.562335
    assert torch.allclose(ent, torch.tensor([[expected_first], [LN2]]), atol=1e-6)
    uniform4 = entropy_from_logits(torch.zeros(1, 1, 4, dtype=torch.bfloat16))
    assert uniform4.dtype == torch.float32 and torch.allclose(uniform4, torch.tensor([[math.log(4.0)]]))


def test_masked_sum_and_mean_ignore_non_finite_values_outside_the_mask():
    values = torch.tensor([[1.0, 2.0, math.nan], [4.0, math.inf, 6.0]])
    mask = torch.tensor([[True, True, False], [False, False, False]])
    assert masked_sum(values, mask).item() == 3.0
    assert torch.equal(masked_mean(values, mask, dim=-1), torch.tensor([1.5, 0.0]))
    assert masked_mean(values, mask).item() == 1.5


def test_ratio_one_gives_minus_mean_advantage_and_gradient_minus_a_over_normalizer():
    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, -0.9]])
    lp = old.clone().requires_grad_(True)
    adv = torch.tensor([[1.0, 2.0, -1.0], [0.5, 3.0, 3.0]])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    loss, m = ppo_clip_loss(lp, old, adv, mask, normalizer=4.0)
    assert loss.item() == pytest.approx(-0.625)  # −(1 + 2 − 1 + 0.5) / 4
    loss.backward()
    assert torch.allclose(lp.grad, torch.tensor([[-0.25, -0.5, 0.25], [-0.125, 0.0, 0.0]]))
    assert (m["clip_frac_sum"].item(), m["ratio_sum"].item(), m["tokens"].item()) == (0.0, 4.0, 4.0)
    assert not any(v.requires_grad for v in m.values())


# One row, six tokens; old = 0, lp = log(ratio). Per-token loss = max(−r·A, −clip(r, 0.8, 1.28)·A):
#   r=1.5  A=+1 → clipped  −1.28 (grad 0)      r=0.5  A=−1 → clipped  0.8 (grad 0)
#   r=1.5  A=−1 → unclipped 1.5 (grad 1.5)     r=0.5  A=+1 → unclipped −0.5 (grad −0.5)
#   r=1.25 A=+1 → unclipped −1.25 (inside the asymmetric 1.28 bound; grad −1.25)
#   r=0.78 A=−1 → clipped 0.8 (grad 0)
RATIOS = [1.5, 0.5, 1.5, 0.5, 1.25, 0.78]
ADVS = torch.tensor([[1.0, -1.0, -1.0, 1.0, 1.0, -1.0]])


def _clip_case(**kw):
    lp = torch.tensor([[math.log(r) for r in RATIOS]], requires_grad=True)
    loss, metrics = ppo_clip_loss(lp, torch.zeros(1, 6), ADVS, torch.ones(1, 6, dtype=torch.bool), **kw)
    loss.backward()
    return loss, metrics, lp.grad


def test_clipping_hand_computed_values_gradients_and_clip_fraction():
    loss, m, grad = _clip_case(normalizer=1.0)
    assert loss.item() == pytest.approx(-1.28 + 0.8 + 1.5 - 0.5 - 1.25 + 0.8, abs=1e-6)  # 0.07
    assert torch.allclose(grad, torch.tensor([[0.0, 0.0, 1.5, -0.5, -1.25, 0.0]]), atol=1e-6)
    assert m["clip_frac_sum"].item() == 3.0
    assert m["ratio_sum"].item() == pytest.approx(6.03, abs=1e-5)
    loss6, _, grad6 = _clip_case(normalizer=6.0)
    assert loss6.item() == pytest.approx(0.07 / 6, abs=1e-6)
    assert torch.allclose(grad6, grad / 6)


def test_asymmetric_bounds_symmetric_clip_catches_the_1_25_token():
    loss, m, grad = _clip_case(normalizer=1.0, clip_high=0.2)
    assert loss.item() == pytest.approx(-1.2 + 0.8 + 1.5 - 0.5 - 1.2 + 0.8, abs=1e-6)  # 0.2: r=1.5 now at 1.2
    assert grad[0, 4].item() == 0.0 and m["clip_frac_sum"].item() == 4.0
    loss, m, grad = _clip_case(normalizer=1.0, clip_low=0.25)  # lower bound 0.75: r=0.78 now unclipped
    assert loss.item() == pytest.approx(-1.28 + 0.75 + 1.5 - 0.5 - 1.25 + 0.78, abs=1e-6)
    assert grad[0, 5].item() == pytest.approx(0.78) and m["clip_frac_sum"].item() == 2.0


# Dual-clip, c = 3 (verl's clip_ratio_c): one row, old = 0, lp = log(ratio).
#   r=5 A=−1 → max(5, 1.28) = 5, capped at −A·c = 3 (grad 0)     r=2 A=−1 → 2 < 3, unchanged (grad 2)
#   r=5 A=+1 → −1.28, no cap for A > 0 (grad 0)                    r=0.5 A=−1 → 0.8 (lower clip, grad 0)
DUAL_RATIOS, DUAL_ADVS = [5.0, 2.0, 5.0, 0.5], torch.tensor([[-1.0, -1.0, 1.0, -1.0]])


def _dual_case(**kw):
    lp = torch.tensor([[math.log(r) for r in DUAL_RATIOS]], requires_grad=True)
    loss, metrics = ppo_clip_loss(lp, torch.zeros(1, 4), DUAL_ADVS, torch.ones(1, 4, dtype=torch.bool),
                                  normalizer=1.0, **kw)
    loss.backward()
    return loss, metrics, lp.grad


def test_dual_clip_hand_computed():
    loss, m, grad = _dual_case(dual_clip_c=3.0)
    assert loss.item() == pytest.approx(3.0 + 2.0 - 1.28 + 0.8, abs=1e-6)
    assert torch.allclose(grad, torch.tensor([[0.0, 2.0, 0.0, 0.0]]), atol=1e-6)
    assert m["dual_clip_frac_sum"].item() == 1.0
    loss, m, grad = _dual_case()  # off: the r = 5, A = −1 token costs 5 and pulls with gradient 5
    assert loss.item() == pytest.approx(5.0 + 2.0 - 1.28 + 0.8, abs=1e-6) and "dual_clip_frac_sum" not in m
    assert torch.allclose(grad, torch.tensor([[5.0, 2.0, 0.0, 0.0]]), atol=1e-5)


def test_log_ratio_clamp_hand_computed():
    # Log-ratios 100 (exp overflows float32) and ln 2, both with A = −1; clamped at ±20 (verl's).
    lp = torch.tensor([[100.0, math.log(2.0)]], requires_grad=True)
    mask, adv = torch.ones(1, 2, dtype=torch.bool), torch.tensor([-1.0])
    loss, _ = ppo_clip_loss(lp, torch.zeros(1, 2), adv, mask, normalizer=1.0, log_ratio_clamp=20.0)
    loss.backward()
    assert loss.item() == pytest.approx(math.exp(20.0) + 2.0, rel=1e-6)
    assert torch.allclose(lp.grad, torch.tensor([[0.0, 2.0]]))  # no gradient beyond the clamp
    assert not torch.isfinite(ppo_clip_loss(lp, torch.zeros(1, 2), adv, mask, normalizer=1.0)[0])
    both, _ = ppo_clip_loss(
        lp, torch.zeros(1, 2), adv, mask, normalizer=1.0, log_ratio_clamp=20.0, dual_clip_c=3.0
    )
    assert both.item() == pytest.approx(3.0 + 2.0)


# Row 0 has one loss token (A=4), row 1 three (A=1, 2, 3), row 2 none; ratio 1 so loss = −A.
AGG_ADV = torch.tensor([[4.0, 9.0, 9.0], [1.0, 2.0, 3.0], [5.0, 5.0, 5.0]])
AGG_MASK = torch.tensor([[True, False, False], [True, True, True], [False, False, False]])


def test_token_mean_vs_seq_mean_token_mean():
    lp = torch.zeros(3, 3)
    assert local_normalizer(AGG_MASK, "token_mean") == 4.0
    assert local_normalizer(AGG_MASK, "seq_mean_token_mean") == 2.0
    tok, _ = ppo_clip_loss(lp, lp, AGG_ADV, AGG_MASK, agg="token_mean", normalizer=4.0)
    seq, _ = ppo_clip_loss(lp, lp, AGG_ADV, AGG_MASK, agg="seq_mean_token_mean", normalizer=2.0)
    assert tok.item() == pytest.approx(-(4 + 1 + 2 + 3) / 4)  # −2.5
    assert seq.item() == pytest.approx(-(4 + (1 + 2 + 3) / 3) / 2)  # −3.0


@pytest.mark.parametrize("agg", sorted(LOSS_AGGREGATIONS))
def test_sharded_losses_with_global_normalizer_sum_to_the_unsharded_loss(agg):
    torch.manual_seed(1)
    old = -torch.rand(3, 3)
    lp = (old + 0.3 * torch.randn(3, 3)).requires_grad_(True)
    full, _ = ppo_clip_loss(lp, old, AGG_ADV, AGG_MASK, agg=agg, normalizer=local_normalizer(AGG_MASK, agg))
    shards = [slice(0, 1), slice(1, 3)]  # "ranks" with one and two rows
    norm = sum(local_normalizer(AGG_MASK[s], agg) for s in shards)
    parts = [
        ppo_clip_loss(lp[s], old[s], AGG_ADV[s], AGG_MASK[s], agg=agg, normalizer=norm)[0] for s in shards
    ]
    assert torch.allclose(sum(parts), full)
    (g_full,) = torch.autograd.grad(full, lp)
    (g_parts,) = torch.autograd.grad(sum(parts), lp)
    assert torch.allclose(g_full, g_parts)


def test_advantages_per_row_broadcast_and_masked_garbage_stays_finite():
    old = torch.tensor([[0.0, 0.0, 0.0]])
    lp = torch.tensor([[0.0, 1000.0, -1000.0]], requires_grad=True)  # huge ratios only off-mask
    mask = torch.tensor([[True, False, False]])
    loss, m = ppo_clip_loss(lp, old, torch.tensor([2.0]), mask, normalizer=1.0)
    loss.backward()
    assert loss.item() == -2.0 and m["ratio_sum"].item() == 1.0
    assert torch.equal(lp.grad, torch.tensor([[-2.0, 0.0, 0.0]]))


def test_empty_shard_gives_zero_loss_with_a_graph():
    lp = torch.zeros(0, 1, requires_grad=True)
    loss, m = ppo_clip_loss(
        lp, torch.zeros(0, 1), torch.zeros(0), torch.zeros(0, 1, dtype=torch.bool), normalizer=0
    )
    loss.backward()
    assert loss.item() == 0.0 and loss.requires_grad and m["tokens"].item() == 0.0


def test_unknown_aggregation_is_rejected():
    with pytest.raises(ValueError, match=r"algo\.loss_agg must be one of token_mean, seq_mean_token_mean"):
        local_normalizer(AGG_MASK, "sum")


def test_kl_estimators_hand_computed():
    lp, ref = torch.tensor([0.0, LN2, 0.3]), torch.tensor([LN2, 0.0, 0.3])
    assert torch.allclose(kl_penalty(lp, ref, "k1"), torch.tensor([-LN2, LN2, 0.0]))
    assert torch.allclose(
        kl_penalty(lp, ref, "k2"), torch.tensor([0.5 * LN2**2, 0.5 * LN2**2, 0.0])
    )  # 0.240227
    # ref − lp = ln2 → 2 − ln2 − 1 = 0.306853;  ref − lp = −ln2 → 0.5 + ln2 − 1 = 0.193147
    assert torch.allclose(kl_penalty(lp, ref, "k3"), torch.tensor([1 - LN2, LN2 - 0.5, 0.0]))
    torch.manual_seed(2)
    assert (kl_penalty(torch.randn(100), torch.randn(100), "k3") >= 0).all()
    assert set(KL_ESTIMATORS) == {"k1", "k2", "k3"}
    with pytest.raises(ValueError, match=r"algo\.kl_estimator must be one of k1, k2, k3; got 'k4'"):
        kl_penalty(lp, ref, "k4")
