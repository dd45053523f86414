"""The step's parts without a model: every request's sampling seed through the real Collector and EngineGroups
(in-process, a recording engine), the RolloutSource's prefetching and sampler state, and the PhaseTimer."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import cast

import pytest

from jobs.config import load_config
from jobs.driver.step import PHASES, PhaseTimer, RolloutSource
from marl.engine_map import EngineMap
from marl.policy_map import PolicyMap
from marl.tasks import get_family
from marl.tasks.data import digit_tasks
from marl.tasks.sampler import PromptSampler
from marl.types import Completion
from marl.workflows.common import WorkflowOptions
from rollout.collector import Collected, Collector
from rollout.engine import EngineMember
from rollout.engine_group import EngineGroup

ROLES = ["generator", "evaluator"]


class SeedRecorder:
    """An engine (the members' constructor, `generate_async` and `progress`) that records the seed
    each request is sampled with, as a vLLM engine seeds each request; the evaluator always says
    Incorrect, so every round runs."""

    seeds: list[int] = []
    lock = threading.Lock()

    # The engine's arguments, unused by this stand-in.
    def __init__(self, model_path: str, dtype: str, threads: int, policy_id: str):
        self.policy_id = policy_id

    async def progress(self) -> int:
        return 0

    async def generate_async(self, requests, sampling, adapter=None) -> list[Completion]:  # noqa: ARG002
        with self.lock:
            self.seeds.extend(sampling.request_seed(i) for i in range(len(requests)))
        text = "\\boxed{Incorrect}" if self.policy_id == "evaluator" else "\\boxed{7}"
        return [Completion(text, [1], [2], [-0.1], policy_id=self.policy_id) for _ in requests]


def _cfg(tmp_path, *overrides: str):
    return load_config("jobs/configs/tiny.yaml", [
        f"out_dir={tmp_path}", "marl.workflow=eval_opt", "marl.sharing=isolated", "marl.max_rounds=3",
        "rollout.engines_per_role=0", "rollout.max_batch_size=3", "rollout.prompts_per_step=4",
        "rollout.samples_per_prompt=4", "steps=3", *overrides])


def _handles(cfg) -> SimpleNamespace:
    engine_map = EngineMap.build(PolicyMap.isolated(ROLES), cfg.run_name)
    engines = {spec.roles[0]: EngineGroup(spec, "unused", cfg.rollout, "float32",
                                              engine_cls=cast(type[EngineMember], SeedRecorder))
               for spec in engine_map.groups}
    collector = Collector(engines, "eval_opt", get_family("digit"), WorkflowOptions(max_rounds=3))
    return SimpleNamespace(collector=collector, engines=engines, weight_versions=dict)


def test_no_two_requests_share_a_seed_within_or_across_consecutive_steps(tmp_path):
    cfg = _cfg(tmp_path)
    handles = _handles(cfg)
    source = RolloutSource(handles, cfg, PromptSampler(digit_tasks(16, 0), cfg.seed))
    SeedRecorder.seeds = []
    per_step = []
    try:
        for step in range(3):
            source.take(step, PhaseTimer())
            per_step.append(list(SeedRecorder.seeds))
            SeedRecorder.seeds.clear()
    finally:
        for group in handles.engines.values():
            group.shutdown()
    # 4 prompts x 4 samples x 3 rounds x 2 roles, each turn a streamed call of its own.
    assert [len(s) for s in per_step] == [96] * 3
    for step in range(3):
        assert len(set(per_step[step])) == 96, f"step {step} reuses a seed within the step"
    for a, b in zip(per_step, per_step[1:], strict=False):
        assert not set(a) & set(b), "consecutive steps share a sampling seed"


class FakeCollector:
    def __init__(self):
        self.calls: list[tuple[list[str], int]] = []

    def collect(self, tasks, n, sampling, on_episode=None):  # noqa: ARG002 - Collector signature
        self.calls.append(([t.task_id for t in tasks], sampling.seed))
        return Collected([], 0.5, {})


def test_prefetching_collects_the_next_step_during_the_update_and_checkpoints_before_its_prompts(tmp_path):
    cfg = _cfg(
        tmp_path,
        "rollout.one_step_off_policy=true",
        "algo.old_logprobs=rollout",
        "rollout.prompts_per_step=2",
    )
    collector = FakeCollector()
    sampler = PromptSampler(digit_tasks(8, 0), 0)
    source = RolloutSource(SimpleNamespace(collector=collector, weight_versions=dict), cfg, sampler)
    timer = PhaseTimer()
    source.take(0, timer)  # nothing prefetched yet: collected now, timed as the step's rollout
    after_step0 = sampler.state()
    assert source.sampler_state == after_step0 and timer.seconds["generate"] == 0.5
    source.during_update(0)()  # step 1's prompts drawn and collected during step 0's update
    assert source.sampler_state == after_step0  # a checkpoint of step 0 does not hold them
    timer = PhaseTimer()
    source.take(1, timer)
    assert len(collector.calls) == 2 and timer.seconds["rollout"] == timer.seconds["generate"] == 0.0
    assert collector.calls[1][1] == source.sampling(1).seed != collector.calls[0][1]
    assert source.during_update(2) is None  # the last step (steps=3) has no next step to prefetch
    # A rollback drops what was prefetched and draws its prompts again.
    source.during_update(1)()
    source.rewind(source.sampler_state)
    source.take(2, PhaseTimer())
    assert collector.calls[3][0] == collector.calls[2][0]


def test_synchronous_source_never_prefetches(tmp_path):
    source = RolloutSource(SimpleNamespace(collector=FakeCollector(), weight_versions=dict), _cfg(tmp_path),
                           PromptSampler(digit_tasks(8, 0), 0))
    assert source.during_update(0) is None


def test_phase_timer_reports_every_phase_and_the_step(monkeypatch):
    clock = iter([10.0, 11.0, 13.5, 20.0])
    monkeypatch.setattr("jobs.driver.step.time.perf_counter", lambda: next(clock))
    timer = PhaseTimer()  # starts at 10
    with timer.phase("store"):  # 11 .. 13.5
        pass
    timer.add("prefetch", 0.25)
    assert timer.metrics() == {**{f"time/{p}_s": 0.0 for p in PHASES}, "time/store_s": 2.5,
                               "time/prefetch_s": 0.25, "time/step_s": 10.0}
    with pytest.raises(KeyError):
        timer.add("unknown", 1.0)
