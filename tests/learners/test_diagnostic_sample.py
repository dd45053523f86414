"""The diagnostics' sample (learners/diagnostic_sample.py): quotas and weights by hand, its estimates unbiased
over seeds (pure, and through a learner on a fixed batch), and the weights untouched by it (all, sampled,
off)."""

import random
import statistics

import pytest
import torch

from jobs.config import ConfigError, load_config
from learners.diagnostic_sample import role_quotas, sample_diagnostics, sample_size, stratified_sample
from learners.rank_metrics import TokenSums
from learners.update.ppo_plan import UpdatePlan
from tests.builders import rows_batch
from tests.learners.test_learner_group import make_group, weights


def test_sample_size_reads_all_zero_and_counts():
    assert sample_size("all") is None and sample_size("0") == 0 and sample_size("8") == 8
    with pytest.raises(ValueError, match="learner.diagnostics.sample_rows"):
        sample_size("some")


@pytest.mark.parametrize("value", ["-1", "some"])
def test_a_bad_sample_rows_is_refused_at_config_load_naming_the_key(value):
    with pytest.raises(ConfigError, match=r"learner\.diagnostics\.sample_rows must be a whole number >= 0"):
        load_config("jobs/configs/tiny.yaml", [f"learner.diagnostics.sample_rows={value}"])


def test_role_quotas_give_every_role_a_row_then_share_the_rest():
    assert role_quotas({"a": 10, "b": 1, "c": 4}, 8) == {"a": 4, "b": 1, "c": 3}
    assert role_quotas({"a": 10, "b": 10, "c": 10}, 2) == {"a": 1, "b": 1, "c": 1}  # every role measured
    assert role_quotas({"a": 2, "b": 1}, 8) == {"a": 2, "b": 1}  # never more than a role has
    assert role_quotas({"a": 0, "b": 3}, 8) == {"b": 3}


def test_stratified_sample_weights_and_seeds():
    roles = ["a"] * 12 + ["b"] * 3
    sample = stratified_sample(roles, range(15), 4, seed=1)
    assert sorted(roles[i] for i in sample) == ["a", "a", "b", "b"]
    assert {roles[i]: w for i, w in sample.items()} == {"a": 6.0, "b": 1.5}  # N_h / n_h
    assert stratified_sample(roles, range(15), 4, seed=1) == sample  # same seed, same rows
    assert any(stratified_sample(roles, range(15), 4, seed=s) != sample for s in range(2, 6))
    assert stratified_sample(roles, range(15), None, seed=1) == {i: 1.0 for i in range(15)}
    assert stratified_sample(roles, range(15), 0, seed=1) == {}


def test_weighted_sums_are_unbiased_over_seeds():
    # Per-role Horvitz-Thompson sums of fixed values over 4,000 seeds: their mean lies within 4 standard
    # errors of the all-rows sum (a wrong weight, e.g. 1 instead of N_h / n_h, misses by > 50 standard
    # errors).
    rng = random.Random(0)
    roles = ["a"] * 30 + ["b"] * 7 + ["c"] * 2
    values = [rng.uniform(0.0, 3.0) for _ in roles]
    for role in "abc":
        true = sum(v for v, r in zip(values, roles, strict=True) if r == role)
        estimates = [sum(w * values[i] for i, w in stratified_sample(roles, range(len(roles)), 8, s).items()
                         if roles[i] == role) for s in range(4000)]
        se = statistics.stdev(estimates) / len(estimates) ** 0.5 if role != "c" else 0.0
        assert abs(statistics.fmean(estimates) - true) <= 4 * se + 1e-9, role


def test_sample_diagnostics_sends_only_sampled_skipped_rows_and_counts_the_rest():
    roles = ["a"] * 6 + ["b"] * 4
    tokens = torch.arange(1.0, 11.0)
    # one rank: rows 0-3 train (steps of two), 4-9 were skipped
    rows = [list(range(10))]
    plan = UpdatePlan([[0, 1], [2, 3]], [1.0, 1.0], metric_rows=[4, 5, 6, 7, 8, 9])
    out = sample_diagnostics(roles, tokens, rows, [plan], 2, (1, 2), recompute=True)
    (sent,), (p,) = out.rows, out.plans
    measured = sent[4:]
    assert sent[:4] == [0, 1, 2, 3] and len(measured) == 2 and {roles[g] for g in measured} == {"a", "b"}
    assert p.metric_rows == [4, 5] and p.metric_weights == (2.0, 4.0)  # a: 2 skipped rows, b: 4
    left = [g for g in range(4, 10) if g not in measured]
    assert out.unmeasured.tokens == sum(float(tokens[g]) for g in left)
    assert sum(out.unmeasured.roles.tokens.values()) == out.unmeasured.tokens
    assert out.counts == {"diag": 6.0, "move": 2.0}
    assert p.move_weights is not None and sum(w > 0 for w in p.move_weights) == 2
    assert sample_diagnostics(roles, tokens, rows, [plan], None, (1, 2), True).plans == [plan]
    off = sample_diagnostics(roles, tokens, rows, [plan], 0, (1, 2), True)
    assert off.rows == [[0, 1, 2, 3]] and off.plans[0].metric_rows is None and off.unmeasured == TokenSums()


# A fixed batch of 24 rows, two roles, every advantage 0: every row is skipped, no optimizer step is taken
# (algo.skip_empty_optimizer_steps), so the weights never move and each update measures the same rows.
ZERO_ROWS = [([10 + i, 11 + i], [20 + i] * (2 + i % 5), 0.0, "generator" if i % 3 else "evaluator")
             for i in range(24)]


def with_advantages(rows, skipped: int):
    """`rows` with the first `skipped` at advantage 0 and the rest at ±1."""
    return [(p, r, 0.0 if i < skipped else (1.0 if i % 2 else -1.0), role)
            for i, (p, r, _, role) in enumerate(rows)]


def test_sampled_entropy_is_unbiased_on_a_fixed_batch():
    batch = rows_batch(ZERO_ROWS)
    fixed = ("algo.skip_empty_optimizer_steps=true", "learner.role_grad_diagnostics=false")
    every = make_group(*fixed, "learner.diagnostics.sample_rows=all").update(batch)
    sampled = make_group(*fixed, "learner.diagnostics.sample_rows=4")
    runs = [sampled.update(batch, step) for step in range(60)]  # the step seeds the draw
    assert {m["update/diag_rows/p"] for m in runs} == {4.0} and every["update/diag_rows/p"] == 24.0
    for key in ("entropy/generator", "entropy/evaluator"):
        values = [m[key] for m in runs]
        assert len(set(values)) > 1  # a sample, not every row
        se = statistics.stdev(values) / len(values) ** 0.5
        # Stated tolerance: 4 standard errors of the mean over 60 seeds.
        assert abs(statistics.fmean(values) - every[key]) <= 4 * se, key


def test_weights_are_bit_identical_with_diagnostics_all_sampled_and_off():
    batch = rows_batch(with_advantages(ZERO_ROWS, 12))
    final, metrics = {}, {}
    for mode in ("all", "3", "0"):
        group = make_group(f"learner.diagnostics.sample_rows={mode}", "algo.ppo_mini_batch_size=6")
        metrics[mode] = [group.update(batch, step) for step in range(2)]
        final[mode] = weights(group)
    for mode in ("3", "0"):
        assert all(torch.equal(final[mode][k], final["all"][k]) for k in final["all"]), mode
        for before, after in zip(metrics["all"], metrics[mode], strict=True):
            assert after["loss/p"] == before["loss/p"] and after["grad/norm/p"] == before["grad/norm/p"]
    assert metrics["all"][0]["update/diag_rows/p"] == 24.0 and metrics["0"][0]["update/diag_rows/p"] == 12.0
    assert "update/policy_move/p" not in metrics["0"][0]
    assert metrics["3"][0]["update/policy_move_rows/p"] == 3.0


def test_a_sample_of_every_row_measures_what_all_measures():
    # More rows asked for than there are: every row sampled at weight 1, through the sampled code paths.
    batch = rows_batch(with_advantages(ZERO_ROWS[:12], 6))
    every = make_group("learner.diagnostics.sample_rows=all", "algo.ppo_mini_batch_size=4").update(batch)
    many = make_group("learner.diagnostics.sample_rows=50", "algo.ppo_mini_batch_size=4").update(batch)
    assert set(many) == set(every)
    assert many == pytest.approx(every, rel=1e-6, abs=1e-9)
