"""Engine health through the real run handles (HF engines as Ray actors, in-process learner): a killed engine
is replaced under its name, caught up to the current weights (fingerprint-checked) and its call retried once,
so the step loses and duplicates nothing; an engine that stops generating tokens is replaced once it has been
flat for rollout.stall_timeout_s, and named when its replacement stalls too; a slow engine that keeps
generating is left alone however long it takes. The stand-ins stall or slow the engine's serving step."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import ray
import torch

from cluster.group import GroupTimeout
from jobs.config import load_config
from jobs.driver.handles import build_handles
from jobs.models.resolve import resolve_model
from jobs.plan.layout import run_layout
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
    """An engine whose first serving step (in any process) marks `flag` and
    stalls; later steps serve normally.
    Built in a function so that Ray ships the class, with `flag`, by value."""

    class StallOnce(HFEngine):
        def step(self, count):
            if not os.path.exists(flag):
                open(flag, "w").close()
                time.sleep(600)  # until killed
            return super().step(count)

    return StallOnce


def _hung() -> type:
    class Hung(HFEngine):
        def step(self, count):
            time.sleep(600)

    return Hung


def _stops_once(flag: str, tokens: int) -> type:
    """Generates `tokens` tokens (slowly), then, the first time in any process, records the time in `flag` and
    stops generating; afterwards it serves normally."""

    class StopsOnce(HFEngine):
        def step(self, count):
            if not os.path.exists(flag):
                for _ in range(tokens):
                    time.sleep(0.1)
                    count(1)
                with open(flag, "w") as f:
                    f.write(repr(time.time()))
                time.sleep(600)  # until killed
            return super().step(count)

    return StopsOnce


def _slow(tokens: int, every_s: float) -> type:
    """Generates a token every `every_s` seconds for `tokens` tokens before each step's real work."""

    class Slow(HFEngine):
        def step(self, count):
            for _ in range(tokens):
                time.sleep(every_s)
                count(1)
            return super().step(count)

    return Slow


def _system(tmp_path, monkeypatch, engine_cls: type, *overrides: str):
    monkeypatch.setattr(engine_group, "ENGINES", {"hf": engine_cls})
    cfg = load_config("jobs/configs/tiny.yaml", [
        f"run_name={RUN}", f"out_dir={tmp_path}", "marl.workflow=single_agent", "marl.sharing=shared",
        "rollout.backend=hf", "rollout.engines_per_role=1", "learner.ranks=0", "rollout.torch_threads=1",
        "rollout.max_batch_size=2", *overrides])
    return build_handles(run_layout(cfg), resolve_model(cfg.model.path), get_family("digit"))


def _wait_for(path: str, timeout: float) -> None:
    end = time.monotonic() + timeout
    while not os.path.exists(path):
        assert time.monotonic() < end, f"{path} never appeared"
        time.sleep(0.05)


@pytest.mark.slow  # a replacement actor's start: 15-25 s
def test_killed_engine_is_replaced_caught_up_and_its_chunk_retried_once(ray_cluster, tmp_path, monkeypatch):
    flag = str(tmp_path / "stalled")
    handles = _system(tmp_path, monkeypatch, _stall_once(flag))
    try:
        learner = handles.learners["shared"].group._members[0]
        with torch.no_grad():
            learner.model.model.norm.weight.mul_(-1.0)  # weights the engine's start-up copy does not have
        assert handles.sync(3)["sync/verified"] == 1.0
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(handles.collector.collect, TASKS, SAMPLES, SAMPLING)
            _wait_for(flag, 120.0)  # the engine is inside generate now
            ray.kill(ray.get_actor(f"{RUN}:engine:solver:0"))
            episodes = running.result(timeout=300).episodes
        group = handles.engines["solver"]
        assert group.replacements == 1
        assert len(episodes) == len(TASKS) * SAMPLES
        assert sorted((e.task.task_id, e.sample_index) for e in episodes) == sorted(
            (t.task_id, i) for t in TASKS for i in range(SAMPLES))
        assert {turn.completion.version for e in episodes for turn in e.turns} == {3}
        assert group.versions() == [3]
        assert ray.get_actor(f"{RUN}:engine:solver:0") is not None  # the replacement holds the name
    finally:
        handles.shutdown()


@pytest.mark.slow  # a replacement actor's start: 15-25 s
def test_hung_engine_trips_its_stall_deadline_and_is_named_after_one_replacement(ray_cluster, tmp_path,
                                                                                monkeypatch):
    handles = _system(tmp_path, monkeypatch, _hung(), "rollout.stall_timeout_s=2")
    try:
        with pytest.raises(
            GroupTimeout,
            match=rf"^{RUN}:engine:solver:0\.generate made no progress for 2s "
            r"\(rollout\.stall_timeout_s\) \(serving role 'solver'\) after "
            r"replacing the engine$",
        ):
            handles.collector.collect(TASKS[:1], 1, SAMPLING)
        assert handles.engines["solver"].replacements == 1
    finally:
        handles.shutdown()


def test_without_replacement_a_hung_engine_fails_at_its_first_stall(ray_cluster, tmp_path, monkeypatch):
    handles = _system(tmp_path, monkeypatch, _hung(), "rollout.stall_timeout_s=2",
                     "rollout.replace_dead_engines=false")
    try:
        t0 = time.monotonic()
        with pytest.raises(GroupTimeout, match=rf"^{RUN}:engine:solver:0\.generate made no progress for 2s"):
            handles.collector.collect(TASKS[:1], 1, SAMPLING)
        assert time.monotonic() - t0 < 30  # the deadline, not the 600 s hang (slack for a loaded machine)
        assert handles.engines["solver"].replacements == 0
    finally:
        handles.shutdown()


@pytest.mark.slow
def test_an_engine_that_stops_generating_is_replaced_within_the_stall_deadline(ray_cluster, tmp_path,
                                                                              monkeypatch):
    stall_s, margin_s = 2.0, 3.0  # margin: polling (1/8 of the deadline) and a loaded machine
    flag = str(tmp_path / "stopped")
    handles = _system(
        tmp_path, monkeypatch, _stops_once(flag, tokens=10), f"rollout.stall_timeout_s={stall_s}"
    )
    group = handles.engines["solver"]
    replaced_at: list[float] = []
    replace_now = group._replace_now
    monkeypatch.setattr(group, "_replace_now", lambda i: (replaced_at.append(time.time()), replace_now(i)))
    try:
        episodes = handles.collector.collect(TASKS[:1], 1, SAMPLING).episodes
        assert len(episodes) == 1 and group.replacements == 1
        waited = replaced_at[0] - float(open(flag).read())
        assert stall_s <= waited <= stall_s + margin_s
    finally:
        handles.shutdown()


@pytest.mark.slow
def test_a_slow_engine_that_keeps_generating_outlives_the_stall_deadline(ray_cluster, tmp_path, monkeypatch):
    stall_s = 1.5
    handles = _system(
        tmp_path, monkeypatch, _slow(tokens=10, every_s=0.4), f"rollout.stall_timeout_s={stall_s}"
    )
    try:
        t0 = time.monotonic()
        episodes = handles.collector.collect(TASKS[:1], 1, SAMPLING).episodes
        assert time.monotonic() - t0 > 2 * stall_s  # a 4 s call, twice the deadline, never flat for 1.5 s
        assert len(episodes) == 1 and handles.engines["solver"].replacements == 0
    finally:
        handles.shutdown()
