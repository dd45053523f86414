"""Cliff detection flags a sustained drop from the peak, and nothing else."""

from __future__ import annotations

import random

from marl.cliff import CliffTracker, detect


def test_terminal_cliff_is_flagged():
    curve = [0.30, 0.40, 0.50, 0.55, 0.56, 0.20, 0.05, 0.02, 0.01]
    flags = detect(curve, drop=0.1, window=2)
    assert flags and flags[0] == 6  # second evaluation below peak - 0.1


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
    assert b.metrics() == a.metrics() == {"cliff/peak": 0.6, "cliff/peak_step": 1.0, "cliff/evals_below": 3.0}
