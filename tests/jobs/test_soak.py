"""The soak (benchmarks/soak.py) for 60 steps, its exact parts only: the object store back to its level after
the first step after every step, exactly the run's actors and its one placement group throughout, checkpoints
within keep_last + keep_best, and no worker process started after the first step (each sync's sender
fingerprint runs inside the learner, not in a task worker of its own)."""

from __future__ import annotations

import pytest

from benchmarks.soak import expected_actors, soak

pytestmark = pytest.mark.slow


def test_sixty_steps_keep_the_store_the_actors_and_the_workers_where_they_were(tmp_path):
    samples, cfg = soak(60, [], str(tmp_path))
    assert [s.step for s in samples] == list(range(60))
    base = (samples[0].store_bytes, samples[0].store_objects)
    assert [s.step for s in samples if (s.store_bytes, s.store_objects) != base] == []
    actors = expected_actors(cfg)
    assert actors == ["soak:engine:aggregator:0", "soak:engine:generator:0", "soak:learner:aggregator:0",
                      "soak:learner:generator:0"]
    assert [s.step for s in samples if s.actors != actors or s.groups != ["soak:placement"]] == []
    assert max(s.checkpoints for s in samples) <= cfg.checkpoint.keep_last + cfg.checkpoint.keep_best == 3
    assert [s.step for s in samples[1:] if s.workers_started != samples[1].workers_started] == []
