"""Learner state I/O: a restored learner continues exactly as the original (weights, optimizer, schedule,
RNG), a LoRA checkpoint holds the adapter only, damaged files are named."""

from __future__ import annotations

import random

import pytest
import ray
import torch

from learners.state.state_io import MODEL, OPTIMIZER, SCHEDULER, StateError, rng_file
from tests.builders import rows_batch
from tests.learners.test_learner_group import ROWS, make_group, weights


def _step_and_weights(group, batch):
    metrics = group.update(batch)
    return metrics, weights(group)


def test_restore_continues_bit_for_bit(tmp_path):
    batch = rows_batch(ROWS)
    group = make_group("learner.optim.warmup_steps=3")
    group.update(batch)
    group.save(str(tmp_path))
    later = [_step_and_weights(group, batch) for _ in range(2)]
    fresh = make_group("learner.optim.warmup_steps=3")  # a new learner, as after a restart
    fresh.load(str(tmp_path))
    for metrics, w in later:
        metrics_again, w_again = _step_and_weights(fresh, batch)
        assert metrics_again == metrics  # loss, grad norm and lr (the schedule's position) included
        assert all(torch.equal(w_again[k], w[k]) for k in w)
    group.shutdown()
    fresh.shutdown()


def test_rng_states_are_restored(tmp_path):
    import numpy as np

    group = make_group()
    torch.manual_seed(5)
    random.seed(5)
    np.random.seed(5)
    group.save(str(tmp_path))
    expected = (torch.rand(3), random.random(), float(np.random.rand()))
    group.load(str(tmp_path))  # an in-process rank: the process's RNGs are the rank's
    got = (torch.rand(3), random.random(), float(np.random.rand()))
    assert torch.equal(got[0], expected[0]) and got[1:] == expected[1:]
    group.shutdown()


def test_lora_checkpoint_holds_only_the_adapter(tmp_path):
    group = make_group("model.lora.enabled=true", "model.lora.rank=4")
    group.update(rows_batch(ROWS))
    group.save(str(tmp_path))
    saved = torch.load(tmp_path / MODEL, weights_only=False)["weights"]
    assert saved and all("lora_" in k for k in saved)
    before = weights(group)
    group.update(rows_batch(ROWS))
    group.load(str(tmp_path))
    assert all(torch.equal(before[k], v) for k, v in weights(group).items())
    group.shutdown()


def test_missing_and_damaged_files_are_named(tmp_path):
    group = make_group()
    group.save(str(tmp_path))
    (tmp_path / OPTIMIZER).write_bytes(b"not a torch file")
    with pytest.raises(Exception, match=r"checkpoint file unreadable: .*optimizer\.pt") as err:
        group.load(str(tmp_path))
    assert isinstance(err.value.__cause__, StateError)
    (tmp_path / MODEL).unlink()
    with pytest.raises(
        Exception, match=r"test:learner:p:0\.load_state failed: checkpoint file missing: .*model\.pt"
    ):
        group.load(str(tmp_path))
    group.shutdown()


def test_state_of_another_model_shape_is_refused(tmp_path):
    group = make_group("model.lora.enabled=true", "model.lora.rank=4")
    group.save(str(tmp_path))
    other = make_group("model.lora.enabled=true", "model.lora.rank=8")
    with pytest.raises(Exception, match="has shape"):
        other.load(str(tmp_path))
    group.shutdown()
    other.shutdown()


@pytest.mark.slow  # two gloo ranks as Ray actors, twice
def test_two_ranks_write_their_own_rng_and_restore_together(tmp_path):
    ray.init(address="local", num_cpus=4, include_dashboard=False)
    try:
        batch = rows_batch(ROWS)
        group = make_group("learner.ranks=2")
        group.update(batch)
        group.save(str(tmp_path))
        assert {p.name for p in tmp_path.iterdir()} == {MODEL, OPTIMIZER, SCHEDULER, rng_file(0), rng_file(1)}
        expected = _step_and_weights(group, batch)
        group.shutdown()
        fresh = make_group("learner.ranks=2")
        fresh.load(str(tmp_path))
        metrics, w = _step_and_weights(fresh, batch)
        assert metrics == expected[0] and all(torch.equal(w[k], expected[1][k]) for k in w)
        assert all(torch.equal(weights(fresh, 1)[k], w[k]) for k in w)  # both ranks restored alike
        fresh.shutdown()
    finally:
        ray.shutdown()
