"""The driver's cliff guard: warn keeps training, stop ends it; metrics say why."""

from __future__ import annotations

import pytest

from jobs.config import ConfigError, load_config
from jobs.driver.loop import cliff_guard, final_cliff_guard
from marl.cliff import CliffTracker


@pytest.mark.parametrize(("action", "stops"), [("warn", False), ("stop", True)])
def test_guard_acts_on_a_sustained_drop(action, stops, capsys):
    cfg = load_config(
        "jobs/configs/tiny.yaml", [f"cliff.action={action}", "cliff.drop=0.2", "cliff.window=2"]
    )
    tracker = CliffTracker(cfg.cliff.drop, cfg.cliff.window)
    decisions = []
    for step, acc in enumerate([0.5, 0.7, 0.45, 0.4]):
        stop, metrics = cliff_guard(cfg, tracker, step, acc)
        decisions.append(stop)
    assert decisions == [False, False, False, stops]
    assert metrics["cliff/flagged"] == 1.0 and metrics["cliff/peak"] == 0.7
    assert "terminal cliff" in capsys.readouterr().out


def test_the_final_evaluation_counts_toward_the_flag():
    """The periodic evaluations skip the last step; the final one completes a drop they began (the case that
    went unflagged: 0.20 peak, then 0.03, then 0.06 at the end)."""
    cfg = load_config("jobs/configs/tiny.yaml", ["steps=40", "cliff.drop=0.1", "cliff.window=2"])
    tracker = CliffTracker(cfg.cliff.drop, cfg.cliff.window)
    for step, acc in ((0, 0.14), (10, 0.12), (20, 0.20), (30, 0.03)):
        assert not cliff_guard(cfg, tracker, step, acc)[0]
    assert final_cliff_guard(cfg, tracker, 39, 0.06) == {}, (
        "a run stopped early already fed its last evaluation"
    )
    assert final_cliff_guard(cfg, tracker, 40, float("nan")) == {}, "no held-out tasks: nothing to feed"
    assert final_cliff_guard(cfg, tracker, 40, 0.06)["cliff/flagged"] == 1.0
    assert tracker.history[-1] == (40, 0.06)


def test_cliff_action_is_validated():
    with pytest.raises(ConfigError, match=r"cliff\.action"):
        load_config("jobs/configs/tiny.yaml", ["cliff.action=rewind"])
