"""LearnerGroup: metric merging by hand, empty batches, and two gloo ranks (Ray actors) against one
in-process learner on the same batch and seed."""

import pytest
import torch

from jobs.config import load_config
from jobs.models.resolve import resolve_model
from learners.batch import TrainBatch, empty_batch
from learners.group import LearnerGroup
from learners.member import LearnerMember
from learners.rank_metrics import RankMetrics, RoleSums, StepMetrics, TokenSums, merge_rank_metrics
from tests.builders import learner_spec, rows_batch

# Everything these tests rely on, pinned here so edits to tiny.yaml cannot change what they check.
BASE = [
    "learner.ranks=0", "learner.micro_batch_size=32", "learner.optim.lr=1e-3", "learner.optim.warmup_steps=0",
    "learner.optim.schedule=cosine", "learner.optim.weight_decay=0.0", "learner.optim.grad_clip=1.0",
    "algo.loss_agg=token_mean", "algo.kl_coef=0.0", "model.dtype=float32", "model.lora.enabled=false",
]
TIMEOUT = 120.0
# Measured 1.9e-6 on weights, 5e-7 on metrics: two ranks' summed gradients differ from one pass only in
# float summation order.
WEIGHT_TOL = 1e-5


ROWS = [
    ([10, 11, 12], [20, 21, 22, 23], 1.0, "generator"),
    ([13, 14], [24, 25], -1.0, "evaluator"),
    ([15, 16, 17, 18], [26, 27, 28], 0.5, "generator"),
    ([30, 31], [40, 41, 42, 43, 44], -0.5, "evaluator"),
    ([32, 33, 34], [45], 2.0, "generator"),
]  # five rows: the two ranks get 3 and 2


def make_group(*overrides: str) -> LearnerGroup:
    cfg = load_config("jobs/configs/tiny.yaml", [*BASE, "learner.micro_batch_size=2", *overrides])
    path = resolve_model("builtin:tiny")
    spec = learner_spec(cfg, path, temperature=0.7)
    return LearnerGroup(spec, "test")


def weights(group: LearnerGroup, rank: int = 0) -> dict[str, torch.Tensor]:
    # An in-process learner hands out views of its live parameters: copy before the next update.
    weights = group.group.submit_to([rank], LearnerMember.get_weights).result(TIMEOUT)[0]
    return {k: v.clone() for k, v in weights.items()}


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_merge_rank_metrics_by_hand():
    steps = StepMetrics(optimizer_steps=2, skipped_steps=1, last_grad_norm=2.5, last_lr=9e-4, grad_norm=3.0,
                        lr=1e-3)  # every rank's
    rank0 = RankMetrics(TokenSums(
        move=0.3, move_tokens=10.0, loss=0.5, clip_frac=2.0, tokens=10.0, padded_positions=3.0,
        positions=20.0, roles=RoleSums(entropy={"generator": 8.0, "evaluator": 6.0},
                                       tokens={"generator": 4.0, "evaluator": 6.0},
                                       logprob_diff={"generator": 0.4, "evaluator": 1.2},
                                       kl={"generator": 0.2, "evaluator": 0.0})),
        steps)
    rank1 = RankMetrics(TokenSums(
        move=0.1, move_tokens=2.0, loss=-0.25, clip_frac=1.0, tokens=2.0, padded_positions=1.0, positions=5.0,
        roles=RoleSums(entropy={"generator": 4.0}, tokens={"generator": 2.0}, logprob_diff={"generator": 0.2},
                       kl={"generator": 0.1})), steps)
    assert merge_rank_metrics([rank0, rank1], "p") == pytest.approx(
        {
            "loss/p": 0.25,
            "grad/norm/p": 3.0,
            "lr/p": 1e-3,
            "clip_frac/p": 3.0 / 12.0,
            "last/grad/norm/p": 2.5,
            "last/lr/p": 9e-4,
            "optim/steps/p": 2.0,
            "batch/padding_frac/p": 4.0 / 25.0,
            "update/skipped_steps/p": 1.0,
            "update/nonfinite_steps/p": 0.0,
            "update/nonfinite_run/p": 0.0,
            "update/policy_move/p": 0.4 / 12.0,
            "entropy/generator": 12.0 / 6.0,
            "rollout/logprob_diff/generator": 0.6 / 6.0,
            "kl/generator": 0.3 / 6.0,
            "entropy/evaluator": 1.0,
            "rollout/logprob_diff/evaluator": 0.2,
            "kl/evaluator": 0.0,
        }
    )


def test_merge_rank_metrics_with_no_tokens_anywhere():
    empty = RankMetrics(TokenSums(), StepMetrics(grad_norm=0.0, lr=5e-4, last_grad_norm=0.0, last_lr=5e-4,
                                                 optimizer_steps=1, skipped_steps=0))
    assert merge_rank_metrics([empty, empty], "p") == {
        "loss/p": 0.0, "grad/norm/p": 0.0, "lr/p": 5e-4, "clip_frac/p": 0.0,
        "last/grad/norm/p": 0.0, "last/lr/p": 5e-4, "optim/steps/p": 1.0, "batch/padding_frac/p": 0.0,
        "update/skipped_steps/p": 0.0, "update/nonfinite_steps/p": 0.0, "update/nonfinite_run/p": 0.0,
    }


def test_in_process_group_steps_on_an_empty_batch():
    # A policy whose roles produced no turn still takes its step (and its lr advances).
    group = make_group("learner.optim.warmup_steps=2")
    first = group.update(empty_batch("p"))
    assert first == {
        "loss/p": 0.0,
        "grad/norm/p": 0.0,
        "lr/p": pytest.approx(5e-4),
        "clip_frac/p": 0.0,
        "batch/dropped_zero_adv/p": 0.0,
        "last/grad/norm/p": 0.0,
        "last/lr/p": pytest.approx(5e-4),
        "optim/steps/p": 1.0,
        "batch/padding_frac/p": 0.0,
        "update/skipped_steps/p": 0.0,
        "update/nonfinite_steps/p": 0.0,
        "update/nonfinite_run/p": 0.0,
        "update/policy_move/p": 0.0,
        "update/diag_rows/p": 0.0,
        "update/policy_move_rows/p": 0.0,
    }
    assert group.update(rows_batch(ROWS))["lr/p"] == pytest.approx(1e-3)
    group.shutdown()


@pytest.fixture(scope="module")
def one_and_two_ranks(ray_cluster):
    """An in-process learner and two gloo ranks, same seed; each test applies the same updates to both."""
    one, two = make_group(), make_group("learner.ranks=2")
    yield one, two
    one.shutdown()
    two.shutdown()


def assert_same_update(one: LearnerGroup, two: LearnerGroup, batch: TrainBatch) -> dict[str, float]:
    before = weights(one)
    m1, m2 = one.update(batch), two.update(batch)
    # Padding is of the micro-batches each rank ran: shards of fewer rows pad differently.
    m1.pop("batch/padding_frac/p"), m2.pop("batch/padding_frac/p")
    assert m2 == pytest.approx(m1, rel=1e-5, abs=1e-7)
    after = weights(one)
    assert max_abs_diff(after, before) > 1e-4  # the update did move the weights
    assert max_abs_diff(weights(two, 0), after) < WEIGHT_TOL
    assert max_abs_diff(weights(two, 1), weights(two, 0)) == 0.0  # ranks stay identical
    return m2


# Per-optimizer-step metrics: the step's mean under the key, the last optimizer step's under last/.
LAST = {f"last/{k}" for k in ("grad/norm/p", "lr/p", "grad/role_norm/generator", "grad/role_norm/evaluator",
                              "grad/norm_share/generator", "grad/norm_share/evaluator", "grad/dominance/p",
                              "grad/cos/evaluator__generator")}


def test_two_ranks_match_one_learner(one_and_two_ranks):
    m = assert_same_update(*one_and_two_ranks, rows_batch(ROWS))
    assert {"loss/p", "grad/norm/p", "lr/p", "clip_frac/p", "entropy/generator", "entropy/evaluator",
            "rollout/logprob_diff/generator", "rollout/logprob_diff/evaluator", "batch/dropped_zero_adv/p",
            "grad/role_norm/generator", "grad/role_norm/evaluator",
            "grad/norm_share/generator", "grad/norm_share/evaluator",
            "grad/dominance/p", "grad/cos/evaluator__generator", "grad/mass_share/generator",
            "grad/mass_share/evaluator", "grad/mass/generator", "grad/mass/evaluator",
            "clip_frac/role/generator", "clip_frac/role/evaluator",
            "optim/steps/p", "update/skipped_steps/p", "update/policy_move/p", "update/diag_rows/p",
            "update/policy_move_rows/p", "update/nonfinite_steps/p",
            "update/nonfinite_run/p"} | LAST == set(m)


def test_two_ranks_with_one_row(one_and_two_ranks):
    # Rank 1 gets an empty shard: it still joins the all-reduce and the step.
    m = assert_same_update(*one_and_two_ranks, rows_batch(ROWS[:1]))
    assert set(m) >= {"entropy/generator"} and "entropy/evaluator" not in m


def test_two_ranks_with_an_empty_batch(one_and_two_ranks):
    one, two = one_and_two_ranks
    m1, m2 = one.update(empty_batch("p")), two.update(empty_batch("p"))
    assert m2 == pytest.approx(m1) and m2["loss/p"] == 0.0 and m2["grad/norm/p"] == 0.0
    assert max_abs_diff(weights(two), weights(one)) < WEIGHT_TOL  # Adam momentum moves both alike


def test_dropping_zero_advantage_rows_leaves_the_update_unchanged():
    rows = [*ROWS, ([50, 51], [60, 61, 62, 63, 64, 65], 0.0, "generator"), ([52], [66, 67], 0.0, "evaluator")]
    batch = rows_batch(rows)
    dropping, keeping = make_group(), make_group("algo.skip_zero_advantage=false")
    assert dropping.drop_zero_advantage and not keeping.drop_zero_advantage
    m_drop, m_keep = dropping.update(batch), keeping.update(batch)
    assert m_drop["batch/dropped_zero_adv/p"] == 2.0 and m_keep["batch/dropped_zero_adv/p"] == 0.0
    assert m_drop["loss/p"] == pytest.approx(m_keep["loss/p"], rel=1e-5)
    assert m_drop["grad/norm/p"] == pytest.approx(m_keep["grad/norm/p"], rel=1e-5)
    assert max_abs_diff(weights(dropping), weights(keeping)) < WEIGHT_TOL
    # The skipped rows' metrics-only pass: the diagnostics cover every row, as if they had trained.
    for key in ("entropy/generator", "entropy/evaluator", "rollout/logprob_diff/generator",
                "rollout/logprob_diff/evaluator", "clip_frac/p", "clip_frac/role/generator"):
        assert m_drop[key] == pytest.approx(m_keep[key], rel=1e-5), key
    assert m_drop["entropy/generator"] != pytest.approx(
        make_group().update(rows_batch(ROWS))["entropy/generator"]
    )


def test_two_ranks_with_a_skipped_row_on_one_rank(one_and_two_ranks):
    # Rank 0's shard holds the zero-advantage row: only it runs the metrics-only pass.
    rows = [([50, 51], [60, 61, 62], 0.0, "generator"), *ROWS[:3]]
    m = assert_same_update(*one_and_two_ranks, rows_batch(rows))
    assert m["batch/dropped_zero_adv/p"] == 1.0


def test_zero_advantage_rows_are_kept_when_a_kl_term_needs_them():
    group = make_group("algo.kl_coef=0.1")
    assert group.update(rows_batch(ROWS))["batch/dropped_zero_adv/p"] == 0.0
    assert not group.drop_zero_advantage


def test_two_ranks_draw_the_one_rank_sample(one_and_two_ranks):
    # The diagnostics' sample is drawn from the whole batch, before it is scattered: two ranks measure the
    # rows one learner measures (8 of 9 skipped rows at the default budget, weighted; the 5 trained rows'
    # movement).
    skipped = [([50 + i, 51], [60 + i, 61, 62][: 1 + i % 3], 0.0, "generator" if i % 2 else "evaluator")
               for i in range(9)]
    m = assert_same_update(*one_and_two_ranks, rows_batch([*skipped[:5], *ROWS, *skipped[5:]]))
    assert m["update/diag_rows/p"] == 5.0 + 8.0 and m["update/policy_move_rows/p"] == 5.0
