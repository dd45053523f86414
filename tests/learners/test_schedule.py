"""Hand-computed values of the learning-rate multiplier: this project's schedule, verl's (start at 0,
unclamped cosine), and the positions each schedule unit gives."""

import math
from types import SimpleNamespace

import pytest

from learners.schedule import SCHEDULES, lr_factor, lr_lambda, schedule_position


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


def verl_cosine(s: int, warmup: int, total: int, min_ratio: float = 0.0) -> float:
    """verl 0.6.1's get_cosine_schedule_with_warmup lambda (init_lr_ratio 0, num_cycles 0.5), written out."""
    if s < warmup:
        return s / max(1, warmup)
    progress = (s - warmup) / max(1, total - warmup)
    return max(min_ratio, math.cos(math.pi * progress) * (1 - min_ratio) * 0.5 + (1 + min_ratio) * 0.5)


def test_warmup_start_zero_by_hand():
    # verl's warmup: lr 0 at step 0, k / 4 at step k, the full lr at step 4 (not at step 3).
    assert [lr_factor(k, 4, 20, "cosine", start_zero=True) for k in range(5)] == pytest.approx(
        [0, 0.25, 0.5, 0.75, 1]
    )
    assert lr_factor(2, 4, 20, "constant", start_zero=True) == pytest.approx(0.5)


def test_unclamped_cosine_climbs_back_after_its_end():
    warmup, total = 2, 12  # decay spans total - warmup = 10 steps
    got = [lr_factor(k, warmup, total, "cosine", start_zero=True, clamp=False) for k in range(40)]
    assert got == pytest.approx([verl_cosine(k, warmup, total) for k in range(40)])
    assert got[7] == pytest.approx(0.5)  # halfway: step 2 + 5
    assert got[12] == pytest.approx(0.0, abs=1e-12)  # the end is one step past the run's last step (11)
    assert got[17] == pytest.approx(0.5) and got[22] == pytest.approx(1.0)  # back up: warmup + 2 * 10
    assert got[11] == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.9)))  # 0.0245, not 0 at the last step
    floored = [lr_factor(k, 0, 10, "cosine", 0.2, clamp=False) for k in (5, 10, 15, 20)]
    # min_lr_ratio is the trough, not a floor it stays at
    assert floored == pytest.approx([0.6, 0.2, 0.6, 1.0])


@pytest.mark.parametrize("unit,positions", [
    ("step", [0, 1, 2]), ("optimizer_step", [0, 1, 2]), ("update_call", [1, 4, 7])])
def test_schedule_position_of_the_second_of_three_policies(unit, positions):
    # update_call: one schedule, three update calls per training step, this policy called second.
    assert [schedule_position(t, unit, 3, 1) for t in range(3)] == positions


def test_update_call_runs_three_policies_schedules_three_times_faster():
    optim = SimpleNamespace(schedule_unit="update_call", warmup_steps=15, schedule="cosine", min_lr_ratio=0.0,
                            warmup_start_zero=True, cosine_clamp=False)
    lambdas = [lr_lambda(optim, 500, 3, p) for p in range(3)]
    assert [f(0) for f in lambdas] == pytest.approx([0.0, 1 / 15, 2 / 15])  # the first policy trains at lr 0
    assert lambdas[2](4) == pytest.approx(verl_cosine(14, 15, 500))
    assert lambdas[2](166) == pytest.approx(0.0, abs=1e-12)  # position 3·166 + 2 = 500: the cosine's end
    assert lambdas[1](328) == pytest.approx(1.0)  # position 985 = 15 + 2·485: back at the full lr at step 328
    step = SimpleNamespace(**{**vars(optim), "schedule_unit": "step"})
    assert lr_lambda(step, 500, 3, 2)(4) == pytest.approx(4 / 15)  # step: the policy's position plays no part


def verl_constant(s: int, warmup: int) -> float:
    """verl 0.6.1's get_constant_schedule_with_warmup lambda, written out: s / warmup, then 1."""
    return s / max(1.0, warmup) if s < warmup else 1.0


def test_paper_schedule_is_verls_constant_after_warmup_and_update_call_only_warms_faster():
    # The paper's scheduler as verl 0.6.1 built it: lr 0 at step 0, k / 15 at step k,
    # the full lr from step 15 on.
    got = [lr_factor(k, 15, 500, "constant", start_zero=True, clamp=False) for k in range(600)]
    assert got == pytest.approx([verl_constant(k, 15) for k in range(600)])
    assert got[7] == pytest.approx(7 / 15) and got[15] == 1.0 and got[499] == 1.0
    # update_call with 3 isolated policies: positions 3t + p, so the full lr from training step 5 (15 / 3) on,
    # and nothing changes after the warmup (no decay to run through faster).
    optim = SimpleNamespace(
        schedule_unit="update_call",
        warmup_steps=15,
        schedule="constant",
        min_lr_ratio=0.0,
        warmup_start_zero=True,
        cosine_clamp=False,
    )
    lambdas = [lr_lambda(optim, 500, 3, p) for p in range(3)]
    assert [f(1) for f in lambdas] == pytest.approx([3 / 15, 4 / 15, 5 / 15])
    assert [f(4) for f in lambdas] == pytest.approx([12 / 15, 13 / 15, 14 / 15])
    assert all(f(t) == 1.0 for f in lambdas for t in range(5, 500))
