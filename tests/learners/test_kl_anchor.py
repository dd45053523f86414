"""The per-role KL anchor (algo.kl_anchor_roles) and the per-role KL / clip-fraction metrics: hand-computed
values on the pure functions, config validation, and end to end on the in-process learner group."""

from __future__ import annotations

import pytest
import torch

from jobs.config import ConfigError, load_config
from learners.config import AlgoConfig
from learners.rank_metrics import RankMetrics, RoleSums, StepMetrics, TokenSums, merge_rank_metrics
from learners.update.losses import LOSS_AGGREGATIONS, ppo_clip_loss
from learners.update.mitigations import kl_coefficients
from tests.builders import rows_batch
from tests.learners.test_learner_group import ROWS, make_group

EVAL_OPT = "marl.workflow=eval_opt"  # roles generator and evaluator, as in ROWS


def test_kl_coefficients_by_hand():
    coef = kl_coefficients(["generator", "evaluator", "generator"], 0.1, {"evaluator": 0.5})
    assert torch.allclose(coef, torch.tensor([0.1, 0.6, 0.1]))
    assert torch.allclose(kl_coefficients(["generator"], 0.2, {}), torch.tensor([0.2]))

    def uses_kl(coef: float, anchors: dict[str, float]) -> bool:
        return AlgoConfig(kl_coef=coef, kl_anchor_roles=anchors).uses_kl

    assert uses_kl(0.0, {"evaluator": 0.5}) and uses_kl(0.1, {}) and not uses_kl(0.0, {"evaluator": 0.0})


@pytest.mark.parametrize("agg,normalizer,expected", [
    # token_mean: Σ coef·kl over loss tokens / 4 tokens = (0·(0.2 + 0.4) + 0.5·(1 + 3)) / 4
    ("token_mean", 4.0, 0.5),
    # seq_mean_token_mean: Σ rows of coef·mean(kl) / 2 rows = (0·0.3 + 0.5·2) / 2
    ("seq_mean_token_mean", 2.0, 0.5),
])
def test_only_the_anchored_roles_tokens_get_the_term(agg, normalizer, expected):
    kl = torch.tensor([[0.2, 0.4, 9.0], [1.0, 3.0, 7.0]], requires_grad=True)  # 9 and 7 lie outside the mask
    mask = torch.tensor([[True, True, False], [True, True, False]])
    coef = kl_coefficients(["generator", "evaluator"], 0.0, {"evaluator": 0.5}).unsqueeze(-1)
    term = LOSS_AGGREGATIONS[agg].reduce(kl * coef, mask, normalizer)
    assert term.item() == pytest.approx(expected)
    term.backward()
    per_token = 0.5 / 4 if agg == "token_mean" else 0.5 / 2 / 2
    assert torch.equal(kl.grad[0], torch.zeros(3))  # the generator's tokens get no pull at all
    assert torch.allclose(kl.grad[1], torch.tensor([per_token, per_token, 0.0]))


def test_config_validates_the_anchor():
    cfg = load_config("jobs/configs/tiny.yaml", [EVAL_OPT, "algo.kl_anchor_roles={evaluator: 0.5}"])
    assert dict(cfg.algo.kl_anchor_roles) == {"evaluator": 0.5}
    with pytest.raises(ConfigError, match="algo.kl_anchor_roles.critic: eval_opt has no role 'critic'"):
        load_config("jobs/configs/tiny.yaml", [EVAL_OPT, "algo.kl_anchor_roles={critic: 0.5}"])
    with pytest.raises(ConfigError, match="algo.kl_anchor_roles.evaluator must be >= 0"):
        load_config("jobs/configs/tiny.yaml", [EVAL_OPT, "algo.kl_anchor_roles={evaluator: -0.1}"])


def test_anchor_pulls_back_only_the_anchored_role():
    group = make_group(EVAL_OPT, "algo.kl_anchor_roles={evaluator: 1.0}")
    assert not group.drop_zero_advantage  # the anchored rows need their KL term even at zero advantage
    first = group.update(rows_batch(ROWS))  # moves the policy away from the reference (both roles)
    assert first["kl/generator"] == pytest.approx(0.0, abs=1e-6)
    zero = [(prompt, response, 0.0, role) for prompt, response, _, role in ROWS]
    second = group.update(rows_batch(zero))  # zero advantages: only the anchor's KL term has a gradient
    assert second["kl/generator"] > 1e-6 and second["kl/evaluator"] > 1e-6  # both drifted and are reported
    assert second["grad/role_norm/generator"] == 0.0
    assert second["grad/role_norm/evaluator"] > 1e-4
    group.shutdown()


def test_clipped_tokens_by_hand_and_per_role_clip_fraction():
    lp = torch.log(torch.tensor([[1.5, 1.0], [0.5, 1.0]]))  # ratios against old logprobs of 0
    _, m = ppo_clip_loss(lp, torch.zeros(2, 2), torch.tensor([1.0, -1.0]), torch.ones(2, 2, dtype=torch.bool),
                         clip_low=0.2, clip_high=0.28, normalizer=4.0)
    # 1.5 > 1.28 with A > 0 and 0.5 < 0.8 with A < 0 are clipped; ratio 1 never is.
    assert m["clipped"].tolist() == [[True, False], [True, False]] and m["clip_frac_sum"].item() == 2.0
    rank = RankMetrics(
        TokenSums(clip_frac=3.0, tokens=10.0, roles=RoleSums(clip_frac={"generator": 3.0, "evaluator": 0.0},
                                                            tokens={"generator": 4.0, "evaluator": 6.0})),
        StepMetrics(grad_norm=1.0, lr=1e-3, last_grad_norm=1.0, last_lr=1e-3, optimizer_steps=1,
                    skipped_steps=0))
    out = merge_rank_metrics([rank, rank], "generator")  # a policy named after one of its roles
    assert out["clip_frac/generator"] == pytest.approx(0.3)  # the policy's, over all its tokens
    assert out["clip_frac/role/generator"] == pytest.approx(0.75) and out["clip_frac/role/evaluator"] == 0.0
