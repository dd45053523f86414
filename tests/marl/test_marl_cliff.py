"""Cliff detection flags a sustained drop from the peak, and nothing else."""

from __future__ import annotations

import random

import pytest

from marl.cliff import CliffTracker, detect, first_cliff


def test_terminal_cliff_is_flagged():
    curve = [0.30, 0.40, 0.50, 0.55, 0.56, 0.20, 0.05, 0.02, 0.01]
    flags = detect(curve, drop=0.1, window=2)
    assert flags and flags[0] == 6  # second evaluation below peak - 0.1


def test_first_cliff_names_the_running_peak_and_whether_the_curve_came_back():
    # Flagged at index 3 (two evaluations >= 0.1 below 0.3); the later 0.32 is not the peak it fell from.
    dip = first_cliff([0.12, 0.30, 0.13, 0.19, 0.30, 0.32], drop=0.1, window=2)
    assert dip is not None and (dip.index, dip.peak, dip.peak_index, dip.recovered) == (3, 0.30, 1, True)
    fall = first_cliff([0.2, 0.25, 0.0, 0.0, 0.01], drop=0.1, window=2)
    assert fall is not None and (fall.index, fall.peak, fall.recovered) == (3, 0.25, False)
    # Back near the peak but still 0.1 below it at the end: not recovered.
    cliff = first_cliff([0.5, 0.3, 0.3, 0.6, 0.4], drop=0.1, window=2)
    assert cliff is not None and cliff.recovered is False
    assert first_cliff([0.5, 0.6, 0.45, 0.6], drop=0.1, window=2) is None


def test_noisy_plateau_is_not_flagged():
    rng = random.Random(0)
    curve = [0.5 + rng.uniform(-0.04, 0.04) for _ in range(60)]
    assert detect(curve, drop=0.1, window=2) == []


def test_slow_rise_is_not_flagged():
    curve = [0.1 + 0.01 * i + (0.03 if i % 2 else -0.03) for i in range(50)]
    assert detect(curve, drop=0.1, window=2) == []


def test_single_dip_recovering_is_not_flagged():
    assert detect([0.5, 0.6, 0.45, 0.6, 0.62], drop=0.1, window=2) == []


def test_state_round_trip_resumes_the_count():
    a = CliffTracker(0.1, 3)
    for step, acc in enumerate([0.5, 0.6, 0.4, 0.4]):
        a.update(step, acc)
    b = CliffTracker(0.1, 3)
    b.load_state(a.state())
    assert b.update(4, 0.3) and a.update(4, 0.3)
    assert b.metrics() == a.metrics() == {"cliff/peak": 0.6, "cliff/peak_step": 1.0, "cliff/evals_below": 3.0,
                                          "cliff/flagged_absolute": 1.0, "cliff/flagged_relative": 0.0}


# Hand-checked relative thresholds: with relative_drop r a drop holds at accuracy <= (1 - r) x peak.
LOW = [0.02, 0.08, 0.05, 0.03, 0.03]  # peak 0.08: never 0.1 below it; half of it is 0.04


def test_relative_drop_flags_a_low_accuracy_collapse():
    assert detect(LOW, drop=0.1, window=2) == []  # off by default: 0.08 - 0.03 = 0.05 < 0.1
    assert detect(LOW, drop=0.1, window=2, relative_drop=0.5) == [4]  # 0.05 > 0.04; 0.03, 0.03 <= 0.04
    assert detect(LOW, drop=0.1, window=2, relative_drop=0.75) == []  # a quarter of the peak is 0.02


def _metrics(curve, **kwargs) -> dict[str, float]:
    tracker = CliffTracker(**kwargs)
    flags = [tracker.update(i, acc) for i, acc in enumerate(curve)]
    return {**tracker.metrics(), "flagged": float(flags[-1])}


@pytest.mark.parametrize(("curve", "absolute", "relative"), [
    (LOW, 0.0, 1.0),  # only the relative drop: 0.03 <= 0.04 twice
    ([0.8, 0.65, 0.6], 1.0, 0.0),  # 0.15 and 0.2 below the peak, both above 0.4 = half of it
    ([0.8, 0.3, 0.2], 1.0, 1.0),  # both conditions at both evaluations
    ([0.3, 0.1, 0.18], 1.0, 0.0),  # 0.1: both; 0.18: 0.12 below the peak but above 0.15 = half of it
])
def test_metrics_say_which_condition_flagged(curve, absolute, relative):
    m = _metrics(curve, drop=0.1, window=2, relative_drop=0.5)
    assert m["flagged"] == 1.0 and m["cliff/evals_below"] == 2.0
    assert (m["cliff/flagged_absolute"], m["cliff/flagged_relative"]) == (absolute, relative)


def test_a_window_may_mix_conditions_and_the_one_held_throughout_is_reported():
    # peak 0.3, drop 0.1 (absolute line 0.2), relative_drop 0.2 (relative line 0.24): 0.22 is only 0.08 below
    # the peak but under 0.24, so only the relative condition holds; 0.15 is under both lines.
    tracker = CliffTracker(drop=0.1, window=2, relative_drop=0.2)
    assert [tracker.update(i, a) for i, a in enumerate([0.3, 0.22, 0.15])] == [False, False, True]
    m = tracker.metrics()
    assert m["cliff/evals_below"] == 2.0
    assert (m["cliff/flagged_absolute"], m["cliff/flagged_relative"]) == (0.0, 1.0)


def test_a_zero_peak_never_drops_relatively_and_a_restart_clears_the_flags():
    assert detect([0.0, 0.0, 0.0, 0.0], drop=0.1, window=2, relative_drop=0.5) == []
    tracker = CliffTracker(drop=0.1, window=2, relative_drop=0.5)
    for i, acc in enumerate(LOW):
        tracker.update(i, acc)
    tracker.below = 0  # what the driver's cliff rollback does: the window restarts
    assert tracker.metrics()["cliff/flagged_relative"] == 0.0
    assert not tracker.update(5, 0.03) and tracker.update(6, 0.03)
    assert tracker.metrics()["cliff/flagged_relative"] == 1.0


def test_relative_drop_is_validated():
    from jobs.config import ConfigError, load_config

    assert load_config("jobs/configs/tiny.yaml").cliff.relative_drop == 0.0
    assert load_config("jobs/configs/tiny.yaml", ["cliff.relative_drop=0.5"]).cliff.relative_drop == 0.5
    for bad in ("-0.1", "1.5"):
        with pytest.raises(ConfigError, match=r"cliff\.relative_drop"):
            load_config("jobs/configs/tiny.yaml", [f"cliff.relative_drop={bad}"])
