"""Streaming rollouts on the tiny model through in-process HF engines: a streamed request draws what it would
alone (its own seed, whatever it is batched with), two streaming collections with the same seeds give the same
episodes, and a weight load waits for the calls in flight."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from jobs.models.resolve import resolve_model
from marl.engine_map import EngineMap
from marl.policy_map import PolicyMap
from marl.tasks import get_family
from marl.types import Task
from marl.workflows.common import WorkflowOptions
from rollout.collector import Collector
from rollout.config import RolloutConfig
from rollout.engine import Sampling
from rollout.engine_group import EngineGroup
from rollout.hf_engine import HFEngine
from rollout.serving import Job

SAMPLING = Sampling(temperature=1.0, max_new_tokens=6, seed=11)
TASKS = [Task(f"digit:t{d}", f"Write the digit {d}.", str(d), kind="digit") for d in (2, 7)]
REQUESTS = [[{"role": "user", "content": f"Write the digit {d}." + " x" * d}] for d in range(6)]


@pytest.fixture(scope="module")
def tiny() -> str:
    return resolve_model("builtin:tiny")


@pytest.fixture
def threads():
    saved = torch.get_num_threads()
    yield
    torch.set_num_threads(saved)


def _rollout() -> RolloutConfig:
    return RolloutConfig(backend="hf", engine_num_cpus=0.5, torch_threads=1, max_batch_size=4,
                         stall_timeout_s=60.0)


def _groups(tiny: str, roles: list[str]) -> dict[str, EngineGroup]:
    engine_map = EngineMap.build(PolicyMap.isolated(roles), "t")
    return {spec.roles[0]: EngineGroup(spec, tiny, _rollout(), "float32") for spec in engine_map.groups}


def test_a_streamed_request_draws_what_it_would_alone(tiny, threads):
    groups = _groups(tiny, ["solver"])
    alone = HFEngine(tiny, torch_threads=1, policy_id="solver")
    try:
        async def streamed():
            return await asyncio.gather(*(groups["solver"].complete(r, SAMPLING.derive(i), role="solver")
                                          for i, r in enumerate(REQUESTS)))

        got = asyncio.run(streamed())
        for i, (request, c) in enumerate(zip(REQUESTS, got, strict=True)):
            want = alone.generate([request], SAMPLING.derive(i))[0]
            assert (c.prompt_ids, c.response_ids) == (want.prompt_ids, want.response_ids)
            assert c.logprobs == pytest.approx(want.logprobs, abs=1e-5)  # padding moves logits by ~1e-7
    finally:
        groups["solver"].shutdown()


def test_two_streaming_collections_with_the_same_seeds_give_the_same_episodes(tiny, threads):
    def run() -> list:
        groups = _groups(tiny, ["generator", "evaluator"])
        try:
            collector = Collector(groups, "eval_opt", get_family("digit"), WorkflowOptions(max_rounds=2))
            return collector.collect(TASKS, 2, SAMPLING).episodes
        finally:
            for g in groups.values():
                g.shutdown()

    first, again = run(), run()
    assert len(first) == len(again) == 4
    for a, b in zip(first, again, strict=True):
        assert [(t.agent, t.round, t.completion.response_ids) for t in a.turns] == [
            (t.agent, t.round, t.completion.response_ids) for t in b.turns]
        for ta, tb in zip(a.turns, b.turns, strict=True):
            assert ta.completion.logprobs == pytest.approx(tb.completion.logprobs, abs=1e-5)
        assert (a.final_answer, a.reward) == (b.final_answer, b.reward)


class _Announcing(HFEngine):
    """Tells `admitted` once the serving loop has taken calls in."""

    def __init__(self, *args, **kwargs):
        self.admitted = threading.Event()
        super().__init__(*args, **kwargs)

    def admit(self, jobs):
        super().admit(jobs)
        self.admitted.set()


def test_a_weight_load_waits_for_the_calls_in_flight(tiny):
    engine = _Announcing(tiny, torch_threads=1, policy_id="pi")
    state = {k: v.clone() for k, v in engine.model.state_dict().items()}
    running = engine.loop.submit(Job([engine.encode(r) for r in REQUESTS], SAMPLING, None))
    assert engine.admitted.wait(60)
    engine.load_weights(state, 5)
    assert running.done()  # the load started only once the admitted call had finished
    assert {c.version for c in running.result()} == {0}
    assert engine.generate(REQUESTS[:1], SAMPLING)[0].version == 5
