"""Engine health through the real System (HF engines as Ray actors, in-process learner): a killed engine is
replaced under its name, caught up to the current weights (fingerprint-checked) and its chunk retried once,
so the step loses and duplicates nothing; a hung engine trips its deadline and is named."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import ray
import torch

from cluster.group import GroupTimeout
from jobs.config import load_config
from jobs.models import resolve_model
from jobs.system import build_system
from marl.policy_map import PolicyMap
from marl.tasks import get_family
from marl.types import Task
from rollout import engine_group
from rollout.engine import Sampling
from rollout.hf_engine import HFEngine

RUN = "faults"
TASKS = [Task(task_id=f"t{i}", prompt=f"Write the digit {i}.", answer=str(i)) for i in range(3)]
SAMPLES = 2
SAMPLING = Sampling(temperature=1.0, max_new_tokens=4)


def _stall_once(flag: str) -> type:
    """An engine whose first generate (in any process) marks `flag` and stalls; later calls serve normally.
    Built in a function so Ray ships the class, with `flag`, by value."""

    class StallOnce(HFEngine):
        def generate(self, requests, sampling, adapter=None):
            if not os.path.exists(flag):
                open(flag, "w").close()
                time.sleep(600)  # until killed
            return super().generate(requests, sampling, adapter)

    return StallOnce


def _hung() -> type:
    class Hung(HFEngine):
        def generate(self, requests, sampling, adapter=None):
            time.sleep(600)

    return Hung


def _system(tmp_path, monkeypatch, engine_cls: type, *overrides: str):
    monkeypatch.setattr(engine_group, "_engine_class", lambda backend: engine_cls)
    cfg = load_config("jobs/configs/tiny.yaml", [
        f"run_name={RUN}", f"out_dir={tmp_path}", "marl.workflow=single_agent", "marl.sharing=shared",
        "rollout.backend=hf", "rollout.engines_per_role=1", "learner.ranks=0", "rollout.torch_threads=1",
        "rollout.max_batch_size=2", *overrides])
    policy_map = PolicyMap.build("shared", ["solver"])
    return build_system(cfg, resolve_model(cfg.model.path), policy_map, get_family("digit"))


def _wait_for(path: str, timeout: float) -> None:
    end = time.monotonic() + timeout
    while not os.path.exists(path):
        assert time.monotonic() < end, f"{path} never appeared"
        time.sleep(0.05)


def test_killed_engine_is_replaced_caught_up_and_its_chunk_retried_once(ray_cluster, tmp_path, monkeypatch):
    flag = str(tmp_path / "stalled")
    system = _system(tmp_path, monkeypatch, _stall_once(flag))
    try:
        learner = system.learners["shared"].group._members[0]
        with torch.no_grad():
            learner.model.model.norm.weight.mul_(-1.0)  # weights the engine's start-up copy does not have
        assert system.sync(3)["sync/verified"] == 1.0
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(system.collector.collect, TASKS, SAMPLES, SAMPLING)
            _wait_for(flag, 120.0)  # the engine is inside generate now
            ray.kill(ray.get_actor(f"{RUN}:engine:solver:0"))
            episodes = running.result(timeout=300)
        group = system.engines["solver"]
        assert group.replacements == 1
        assert len(episodes) == len(TASKS) * SAMPLES
        assert sorted((e.task.task_id, e.sample_index) for e in episodes) == sorted(
            (t.task_id, i) for t in TASKS for i in range(SAMPLES))
        assert {turn.completion.version for e in episodes for turn in e.turns} == {3}
        assert group.versions() == [3]
        assert ray.get_actor(f"{RUN}:engine:solver:0") is not None  # the replacement holds the name
    finally:
        system.shutdown()


def test_hung_engine_trips_its_deadline_and_is_named_after_one_replacement(ray_cluster, tmp_path, monkeypatch):
    system = _system(tmp_path, monkeypatch, _hung(), "rollout.call_timeout_s=3")
    try:
        with pytest.raises(GroupTimeout, match=rf"^{RUN}:engine:solver:0\.generate missed its 3s deadline "
                                               r"\(serving role 'solver'\) after replacing the engine$"):
            system.collector.collect(TASKS[:1], 1, SAMPLING)
        assert system.engines["solver"].replacements == 1
    finally:
        system.shutdown()


def test_without_replacement_a_hung_engine_fails_at_its_first_deadline(ray_cluster, tmp_path, monkeypatch):
    system = _system(tmp_path, monkeypatch, _hung(), "rollout.call_timeout_s=2",
                     "rollout.replace_dead_engines=false")
    try:
        t0 = time.monotonic()
        with pytest.raises(GroupTimeout, match=rf"^{RUN}:engine:solver:0\.generate missed its 2s deadline"):
            system.collector.collect(TASKS[:1], 1, SAMPLING)
        assert time.monotonic() - t0 < 30  # the deadline, not the 600 s hang (slack for a loaded machine)
        assert system.engines["solver"].replacements == 0
    finally:
        system.shutdown()
