"""Reward assignment: the outcome reaches every turn; shaping hooks replace one role's rewards."""

from __future__ import annotations

import asyncio

import pytest
from marl_scripted import ScriptedClient

from marl.episode import run_episode
from marl.rewards import assign
from marl.tasks import MathFamily
from marl.types import Task
from marl.workflows.common import WorkflowOptions

TASK = Task(task_id="t0", prompt="What is 6 * 7?", answer="42")


def voting_episode(shaping=None):
    replies = {"generator0": "\\boxed{42}", "generator1": "\\boxed{7}", "generator2": "\\boxed{42}"}
    client = ScriptedClient({**replies, "aggregator": "\\boxed{1}"})
    return asyncio.run(run_episode("voting", TASK, client, MathFamily(), WorkflowOptions(), 0, shaping))


def test_reward_copied_to_every_turn():
    ep = voting_episode()
    assert ep.reward == 1.0
    assert [t.reward for t in ep.turns] == [1.0] * 4


def test_shaping_hook_replaces_one_role():
    def penalise_long(episode, turn):
        return episode.reward - 0.01 * len(turn.text)

    ep = voting_episode({"aggregator": penalise_long})
    assert [t.reward for t in ep.turns[:3]] == [1.0] * 3
    assert ep.turns[3].reward == pytest.approx(1.0 - 0.01 * len("\\boxed{1}"))


def test_assign_overwrites_previous_rewards():
    ep = voting_episode()
    ep.reward = 0.0
    assign(ep)
    assert all(t.reward == 0.0 for t in ep.turns)


def test_format_penalty_example_docks_unboxed_turns():
    import importlib

    hook = importlib.import_module("examples.format_penalty").boxed_or_penalty
    ep = voting_episode({"generator": hook})
    assert [t.reward for t in ep.turns] == [1.0, 1.0, 1.0, 1.0]  # every turn boxed: nothing docked
    ep.turns[1].completion.text = "7"
    assign(ep, {"generator": hook})
    assert [t.reward for t in ep.turns] == [1.0, pytest.approx(0.9), 1.0, 1.0]
