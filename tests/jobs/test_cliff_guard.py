"""The driver's cliff guard: warn keeps training, stop ends it; metrics say why."""

from __future__ import annotations

import pytest

from jobs.config import ConfigError, load_config
from jobs.driver.loop import cliff_guard
from marl.cliff import CliffTracker


@pytest.mark.parametrize(("action", "stops"), [("warn", False), ("stop", True)])
def test_guard_acts_on_a_sustained_drop(action, stops, capsys):
    cfg = load_config("jobs/configs/tiny.yaml", [f"cliff.action={action}", "cliff.drop=0.2", "cliff.window=2"])
    tracker = CliffTracker(cfg.cliff.drop, cfg.cliff.window)
    decisions = []
    for step, acc in enumerate([0.5, 0.7, 0.45, 0.4]):
        stop, metrics = cliff_guard(cfg, tracker, step, acc)
        decisions.append(stop)
    assert decisions == [False, False, False, stops]
    assert metrics["cliff/flagged"] == 1.0 and metrics["cliff/peak"] == 0.7
    assert "terminal cliff" in capsys.readouterr().out


def test_cliff_action_is_validated():
    with pytest.raises(ConfigError, match=r"cliff\.action"):
        load_config("jobs/configs/tiny.yaml", ["cliff.action=rewind"])
