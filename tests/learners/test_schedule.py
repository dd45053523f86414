"""Hand-computed values of the per-training-step learning-rate multiplier."""

import math

import pytest

from learners.schedule import SCHEDULES, lr_factor


def test_linear_warmup_starts_at_one_over_warmup():
    # Step k of a 4-step warmup gets (k + 1) / 4, whatever the schedule after it.
    for schedule in SCHEDULES:
        got = [lr_factor(k, 4, 20, schedule) for k in range(4)]
        assert got == pytest.approx([0.25, 0.5, 0.75, 1.0])


def test_cosine_goes_from_one_to_min_ratio_at_last_step():
    warmup, total, floor = 2, 12, 0.1
    assert lr_factor(warmup, warmup, total, "cosine", floor) == pytest.approx(1.0)  # first step after warmup
    # span = total - warmup - 1 = 9; step 6.5 would be the midpoint, step 5 is a third of the way.
    third = floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi / 3))  # 0.1 + 0.9 * 0.75 = 0.775
    assert lr_factor(5, warmup, total, "cosine", floor) == pytest.approx(third)
    assert lr_factor(total - 1, warmup, total, "cosine", floor) == pytest.approx(floor)
    assert lr_factor(total + 5, warmup, total, "cosine", floor) == pytest.approx(floor)  # stays at the floor
    after = [lr_factor(k, warmup, total, "cosine", floor) for k in range(warmup, total)]
    assert all(a >= b for a, b in zip(after, after[1:], strict=False))  # non-increasing


def test_cosine_without_warmup():
    # Step 0 gets the full lr (no 1/0 warmup); midpoint of 11 steps (span 10) is step 5.
    assert lr_factor(0, 0, 11, "cosine") == pytest.approx(1.0)
    assert lr_factor(5, 0, 11, "cosine") == pytest.approx(0.5)
    assert lr_factor(10, 0, 11, "cosine") == pytest.approx(0.0, abs=1e-12)
    assert lr_factor(0, 0, 1, "cosine") == pytest.approx(1.0)  # a one-step run is not a division by zero


def test_constant_stays_one():
    assert [lr_factor(k, 0, 10, "constant", 0.3) for k in range(12)] == [1.0] * 12
    assert lr_factor(1, 3, 10, "constant") == pytest.approx(2 / 3)  # warmup still applies
    assert lr_factor(3, 3, 10, "constant") == 1.0
