"""Collector over a recording fake of EngineGroup (lockstep batching; streaming turns, their seeds and their
overlap across rounds), and EngineGroup itself (in-process and two Ray replicas) on the tiny model."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
from types import SimpleNamespace

import pytest
import torch

from cluster.member import Call
from jobs.models.resolve import resolve_model
from marl.engine_map import EngineGroupSpec, EngineMap
from marl.policy_map import PolicyMap
from marl.tasks import get_family
from marl.types import Completion, Message, Task
from marl.workflows.common import WorkflowOptions
from rollout.collector import Collector
from rollout.engine import EngineMember, Sampling
from rollout.engine_group import EngineGroup
from rollout.hf_engine import HFEngine

SAMPLING = Sampling(temperature=0.9, max_new_tokens=5, seed=17)
TASKS = [Task(f"digit:t{i}", f"Write the digit {d}.", str(d), kind="digit") for i, d in enumerate((3, 5, 8))]
WRONG_ON = "5"  # generators answer this task wrongly, so its episodes score 0


class RecordingEngines:
    """Stands in for EngineGroup (same `generate` and `complete` signatures): records each call (a streamed
    turn is a batch of one) and replies per request."""

    def __init__(self, reply, error: Exception | None = None, key: str = "g"):
        self.reply, self.error, self.key = reply, error, key
        self.batches: list[tuple[list[list[Message]], Sampling]] = []

    async def complete(
        self, request: list[Message], sampling: Sampling, role: str | None = None
    ) -> Completion:
        return (await self.generate([request], sampling, role))[0]

    async def generate(self, requests: list[list[Message]], sampling: Sampling,
                       role: str | None = None) -> list[Completion]:
        self.batches.append(([[dict(m) for m in r] for r in requests], sampling))
        await asyncio.sleep(0)  # like a real engine call, yields to the loop before answering
        if self.error is not None:
            raise self.error
        texts = [self.reply(r) for r in requests]
        return [Completion(text=t, prompt_ids=[len(r)], response_ids=[ord(c) for c in t],
                           logprobs=[-0.1] * len(t)) for r, t in zip(requests, texts, strict=True)]


def _generator_reply(messages: list[Message]) -> str:
    match = re.search(r"Write the digit (\d)\.", messages[-1]["content"])
    assert match is not None
    digit = match.group(1)
    return f"{'4' if digit == WRONG_ON else digit} is my answer"


def _engines(**errors: Exception) -> dict[str, RecordingEngines]:
    return {
        "generator": RecordingEngines(_generator_reply, errors.get("generator"), "generator"),
        "aggregator": RecordingEngines(lambda _: "I pick \\boxed{2}", errors.get("aggregator"), "aggregator"),
    }


def _collector(engines, mode: str = "lockstep") -> Collector:
    return Collector(engines, "voting", get_family("digit"), WorkflowOptions(num_generators=3), mode=mode)


def test_quiescence_batches_each_role_once_and_returns_episodes_task_major():
    engines = _engines()
    episodes = _collector(engines).collect(TASKS, samples_per_prompt=2, sampling=SAMPLING).episodes

    gen, agg = engines["generator"].batches, engines["aggregator"].batches
    assert [len(reqs) for reqs, _ in gen] == [18]  # 3 tasks x 2 samples x 3 generators, one call
    assert [len(reqs) for reqs, _ in agg] == [6]  # one aggregator turn per episode, one call
    prompts = [r[-1]["content"] for r in gen[0][0]]
    assert sorted(prompts) == sorted(t.prompt for t in TASKS for _ in range(6))
    for _, sampling in gen + agg:
        assert (sampling.temperature, sampling.max_new_tokens) == (
            SAMPLING.temperature,
            SAMPLING.max_new_tokens,
        )
    assert gen[0][1].seed != agg[0][1].seed

    assert [(e.task.task_id, e.sample_index) for e in episodes] == [
        (t.task_id, i) for t in TASKS for i in range(2)
    ]
    for ep in episodes:
        assert ep.workflow == "voting"
        assert [t.agent for t in ep.turns] == ["generator0", "generator1", "generator2", "aggregator"]
        right = ep.task.answer != WRONG_ON
        for turn in ep.turns[:3]:  # each reply came back to the episode that asked
            assert turn.text == _generator_reply(turn.messages)
            assert ep.task.prompt in turn.messages[-1]["content"]
        assert ep.turns[3].text == "I pick \\boxed{2}"
        assert all(f"Response {i}:\n{t.text}" in ep.turns[3].messages[-1]["content"]
                   for i, t in enumerate(ep.turns[:3], start=1))
        assert ep.final_answer == (ep.task.answer if right else "4")
        assert ep.reward == (1.0 if right else 0.0)
        assert [t.reward for t in ep.turns] == [ep.reward] * 4
        assert ep.parse_failures == {}


def test_a_role_cap_reaches_that_roles_engine_alone():
    engines = _engines()
    _collector(engines).collect(TASKS, 1, dataclasses.replace(SAMPLING, role_caps=(("aggregator", 64),)))
    assert [s.max_new_tokens for _, s in engines["generator"].batches] == [5]
    assert [s.max_new_tokens for _, s in engines["aggregator"].batches] == [64]


def test_progress_callback_counts_each_finished_episode_once():
    seen: list[tuple[int, int]] = []
    episodes = (
        _collector(_engines())
        .collect(TASKS, 2, SAMPLING, on_episode=lambda d, t: seen.append((d, t)))
        .episodes
    )
    assert seen == [(i, len(episodes)) for i in range(1, len(episodes) + 1)]


class SlowEngines(RecordingEngines):
    """Each batched call takes `delay` seconds, as an engine's generate would."""

    def __init__(self, reply, delay: float):
        super().__init__(reply)
        self.delay = delay

    async def generate(self, requests, sampling, role=None):
        await asyncio.sleep(self.delay)
        return await super().generate(requests, sampling, role)


def test_generate_time_is_the_wall_time_with_an_engine_call_in_flight():
    delay = 0.2
    engines = {"generator": SlowEngines(_generator_reply, delay),
               "aggregator": SlowEngines(lambda _: "I pick \\boxed{2}", delay)}
    t0 = time.perf_counter()
    generate_s = _collector(engines).collect(TASKS, 2, SAMPLING).generate_s
    wall = time.perf_counter() - t0
    calls = len(engines["generator"].batches) + len(engines["aggregator"].batches)
    assert calls == 2  # one batch per role: the generators' turns, then the aggregators'
    # Two calls one after the other: two delays (a sum over the 24 requests would be 24).
    assert 2 * delay <= generate_s <= min(wall, 2 * delay + 0.15)


@pytest.mark.parametrize("role", ["generator", "aggregator"])
def test_engine_exception_propagates_to_collect(role):
    engines = _engines(**{role: RuntimeError(f"{role} engine down")})
    with pytest.raises(RuntimeError, match=f"{role} engine down"):
        _collector(engines).collect(TASKS, samples_per_prompt=2, sampling=SAMPLING)
    assert len(engines[role].batches) == 1


def test_role_without_engine_group_is_an_error():
    engines = _engines()
    del engines["aggregator"]
    with pytest.raises(KeyError, match="aggregator"):
        _collector(engines).collect(TASKS[:1], samples_per_prompt=1, sampling=SAMPLING)


# ---------------------------------------------------------------- streaming over the fake

class GatedGenerators(RecordingEngines):
    """Generators whose turns on task `held` wait until some aggregator has been asked: in streaming, the
    other episodes reach their aggregator while those turns are out; in lockstep nothing would ever ask it."""

    def __init__(self, held: str, asked: asyncio.Event):
        super().__init__(_generator_reply, key="generator")
        self.held, self.asked = held, asked

    async def complete(self, request, sampling, role=None):
        if f"Write the digit {self.held}." in request[-1]["content"]:
            # bounded: a lockstep client fails instead of hanging
            await asyncio.wait_for(self.asked.wait(), 30)
        return await super().complete(request, sampling, role)


class AskedAggregator(RecordingEngines):
    def __init__(self, asked: asyncio.Event):
        super().__init__(lambda _: "I pick \\boxed{2}", key="aggregator")
        self.asked = asked

    async def complete(self, request, sampling, role=None):
        self.asked.set()
        return await super().complete(request, sampling, role)


def test_streaming_sends_each_turn_alone_and_an_episode_does_not_wait_for_other_episodes_turns():
    async def run() -> tuple[list, dict]:
        asked = asyncio.Event()
        engines = {"generator": GatedGenerators(TASKS[0].answer, asked), "aggregator": AskedAggregator(asked)}
        episodes, _, timings = await asyncio.to_thread(
            _collector(engines, "streaming").collect, TASKS, 2, SAMPLING
        )
        return episodes, {**timings, "calls": [len(r) for e in engines.values() for r, _ in e.batches]}

    episodes, timings = asyncio.run(run())
    assert set(timings.pop("calls")) == {1} and len(episodes) == 6  # 24 turns, one call each
    assert all(ep.reward == (1.0 if ep.task.answer != WRONG_ON else 0.0) for ep in episodes)
    assert set(timings) == {
        "rollout/engine_busy_frac/generator",
        "rollout/engine_busy_frac/aggregator",
        *(f"rollout/turn_latency_{q}_s/{r}" for q in ("p50", "p99") for r in ("generator", "aggregator")),
    }
    assert all(0.0 <= timings[f"rollout/engine_busy_frac/{g}"] <= 1.0 for g in ("generator", "aggregator"))


def test_streaming_seeds_each_turn_by_its_episode_agent_and_turn():
    engines = _engines()
    _collector(engines, "streaming").collect(TASKS, 2, SAMPLING)
    seeds = {role: sorted(s.seed for _, s in e.batches) for role, e in engines.items()}
    want = {
        "generator": sorted(
            SAMPLING.derive(t, i, f"generator{j}", 0).seed
            for t in range(3)
            for i in range(2)
            for j in range(3)
        ),
        "aggregator": sorted(SAMPLING.derive(t, i, "aggregator", 0).seed for t in range(3) for i in range(2)),
    }
    assert seeds == want
    assert len(set(seeds["generator"])) == 18  # identical prompts of one episode still draw apart


# ---------------------------------------------------------------- EngineGroup on the tiny model

REQUESTS = [[{"role": "user", "content": f"Write the digit {d}." + " x" * d}] for d in range(10)]
MAX_BATCH = 4


def _spec() -> EngineGroupSpec:
    return EngineMap.build(PolicyMap.shared(["generator"], "pi"), "t").groups[0]


def _rollout(engines_per_role: int) -> SimpleNamespace:
    return SimpleNamespace(
        backend="hf",
        engines_per_role=engines_per_role,
        engine_num_cpus=0.5,
        torch_threads=1,
        max_batch_size=MAX_BATCH,
        stall_timeout_s=120.0,
        start_timeout_s=600.0,
        lora_serving="single",
        replace_dead_engines=True,
    )


@pytest.fixture(scope="module")
def tiny() -> str:
    return resolve_model("builtin:tiny")


@pytest.fixture(scope="module")
def expected(tiny):
    """What EngineGroup.generate must return: chunks of max_batch_size, chunk k sampled with its own seed."""
    threads = torch.get_num_threads()
    try:
        engine = HFEngine(tiny, torch_threads=1, policy_id="pi")  # the replicas' thread count
        chunks = [REQUESTS[i:i + MAX_BATCH] for i in range(0, len(REQUESTS), MAX_BATCH)]
        out = [c for k, chunk in enumerate(chunks)
               for c in engine.generate(chunk, SAMPLING.derive("chunk", k))]
        return out, {k: v.clone() for k, v in engine.model.state_dict().items()}
    finally:
        torch.set_num_threads(threads)


def _assert_same(got: list[Completion], want: list[Completion]) -> None:
    assert len(got) == len(want) == len(REQUESTS)
    for g, w in zip(got, want, strict=True):
        assert (g.prompt_ids, g.response_ids, g.finish_reason, g.policy_id) == (
            w.prompt_ids, w.response_ids, w.finish_reason, w.policy_id)
        assert g.logprobs == pytest.approx(w.logprobs, abs=1e-5)


def test_in_process_engine_group_splits_by_max_batch_size(tiny, expected):
    want, _ = expected
    group = EngineGroup(_spec(), tiny, _rollout(0), "float32")
    threads = torch.get_num_threads()
    try:
        assert group.group.local
        _assert_same(asyncio.run(group.generate(REQUESTS, SAMPLING)), want)
        assert group.versions() == [0]
    finally:
        group.shutdown()
        torch.set_num_threads(threads)


def test_two_ray_replicas_take_chunks_round_robin(ray_cluster, tiny, expected):
    want, state = expected
    group = EngineGroup(_spec(), tiny, _rollout(2), "float32")
    try:
        assert group.group.size == 2 and not group.group.local
        # Same weights, distinct versions: each completion then says which replica produced it.
        loads = [Call(EngineMember.load_weights, state, 1), Call(EngineMember.load_weights, state, 2)]
        group.group.submit_each(loads).result(120)
        assert group.versions() == [1, 2]
        got = asyncio.run(group.generate(REQUESTS, SAMPLING))
        _assert_same(got, want)
        assert [c.version for c in got] == [1] * 4 + [2] * 4 + [1] * 2
    finally:
        group.shutdown()
