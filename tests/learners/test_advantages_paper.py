"""The paper's GRPO grouping preset (`algo.group_by: [paper]`) on episodes the real workflows produce with a
scripted client: group sizes per prompt for every workflow, and one hand-checked advantage."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
import torch

from jobs.config.loading import ConfigError, load_config
from learners.update.advantages import group_keys, grpo_advantages, keys_to_ids
from marl.episode import run_episode
from marl.tasks import MathFamily
from marl.types import Episode, Task
from marl.workflows.common import WorkflowOptions
from tests.marl.marl_scripted import ScriptedClient

N = 4  # samples per prompt
TASKS = [Task("p0", "What is 6 * 7?", "42"), Task("p1", "What is 5 * 8?", "40")]
RIGHT = {"p0": "\\boxed{42}", "p1": "\\boxed{40}"}
PLAN = "STRATEGY 1: add\nSTRATEGY 2: multiply\nSTRATEGY 3: split"


def _replies(workflow: str, task: Task, sample: int) -> dict:
    right = RIGHT[task.task_id]
    if workflow == "single_agent":
        return {"solver": right}
    if workflow == "voting":
        return {"generator0": right, "generator1": right, "generator2": right, "aggregator": "\\boxed{1}"}
    if workflow == "orch_workers":  # sample 0 answers right, the others wrong
        final = right if sample == 0 else "\\boxed{0}"
        return {
            "orchestrator": PLAN,
            "worker0": right,
            "worker1": right,
            "worker2": right,
            "synthesizer": final,
        }
    # eval_opt, 2 rounds: samples 0 and 1 are judged correct at once, 2 and 3 revise once
    verdicts = ["\\boxed{Correct}"] if sample < 2 else ["\\boxed{Incorrect}", "\\boxed{Correct}"]
    return {"generator": right, "evaluator": verdicts}


def _episodes(workflow: str, replies=_replies) -> list[Episode]:
    """N samples of each of TASKS, in order, scored and with rewards assigned to every turn."""
    opts = WorkflowOptions(max_rounds=2)

    async def all_of_them():
        return [await run_episode(workflow, t, ScriptedClient(replies(workflow, t, i)), MathFamily(), opts, i)
                for t in TASKS for i in range(N)]

    return asyncio.run(all_of_them())


def _sizes(episodes: list[Episode], group_by) -> dict[tuple, int]:
    return dict(Counter(group_keys(episodes, group_by)))


@pytest.mark.parametrize(("workflow", "per_prompt"), [
    ("single_agent", {"solver": N}),
    # one group per generator slot plus the aggregator's
    ("voting", {"generator0": N, "generator1": N, "generator2": N, "aggregator": N}),
    # worker0..2 pooled into one group of 3 x N beside the orchestrator's and the synthesizer's
    ("orch_workers", {"orchestrator": N, "worker": 3 * N, "synthesizer": N}),
    # one group per role across rounds: 2 + 2 samples with 1 and 2 rounds -> 2 x 1 + 2 x 2 turns each
    ("eval_opt", {"generator": 6, "evaluator": 6}),
])
def test_paper_groups_per_prompt(workflow, per_prompt):
    expected = {(t.task_id, name): size for t in TASKS for name, size in per_prompt.items()}
    assert _sizes(_episodes(workflow), ["paper"]) == expected


def test_eval_opt_with_two_rounds_in_every_sample_pools_2n_turns_per_role():
    def revise_once(workflow, task, sample):
        return {"generator": RIGHT[task.task_id], "evaluator": ["\\boxed{Incorrect}", "\\boxed{Correct}"]}

    episodes = _episodes("eval_opt", revise_once)
    assert _sizes(episodes, ["paper"]) == {
        (t.task_id, r): 2 * N for t in TASKS for r in ("generator", "evaluator")
    }


def test_paper_differs_from_per_agent_grouping_only_for_pooled_workers():
    orch = _episodes("orch_workers")
    per_agent = _sizes(orch, ("task", "agent"))
    assert per_agent[("p0", "worker0")] == per_agent[("p0", "worker1")] == N
    for workflow in ("single_agent", "voting", "eval_opt"):
        episodes = _episodes(workflow)
        paper_ids = keys_to_ids(group_keys(episodes, ["paper"]))
        assert torch.equal(paper_ids, keys_to_ids(group_keys(episodes, ("task", "agent"))))


def test_pooled_worker_advantage_is_hand_checked():
    # Per prompt, sample 0 scores 1 and samples 1-3 score 0; each reward is copied to the episode's 3 workers.
    # Pooled (paper): 3 ones and 9 zeros, mean 1/4, unbiased std sqrt((3 (3/4)^2 + 9 (1/4)^2) / 11) =
    # sqrt(2.25 / 11) = 0.452267, so a rewarded worker gets 0.75 / 0.452267 = 1.658312 and the others
    # -0.25 / 0.452267 = -0.552771. Per agent (groups [1, 0, 0, 0]: mean 1/4, std 1/2) it would be 1.5, -0.5.
    episodes = _episodes("orch_workers")
    rewards = torch.tensor([t.reward for ep in episodes for t in ep.turns])
    for group_by, (up, down) in ((["paper"], (1.658312, -0.552771)), (("task", "agent"), (1.5, -0.5))):
        keys = group_keys(episodes, group_by)
        adv = grpo_advantages(rewards, keys_to_ids(keys), norm_std=True, eps=0.0).tolist()
        for task in TASKS:
            workers = [a for k, a, t in zip(keys, adv, _flat_turns(episodes), strict=True)
                       if k[0] == task.task_id and t.role == "worker"]
            assert workers == pytest.approx([up] * 3 + [down] * 9, abs=1e-5)


def _flat_turns(episodes: list[Episode]) -> list:
    return [t for ep in episodes for t in ep.turns]


def test_a_preset_stands_alone_and_config_names_the_key():
    with pytest.raises(ValueError, match="group_by"):
        group_keys(_episodes("single_agent"), ["paper", "task"])
    with pytest.raises(ConfigError, match=r"algo\.group_by takes a non-empty subset of .* or one preset"):
        load_config("jobs/configs/tiny.yaml", ["algo.group_by=[paper,task]"])
    assert list(load_config("jobs/configs/tiny.yaml", ["algo.group_by=[paper]"]).algo.group_by) == ["paper"]
    assert list(load_config("jobs/configs/sweeps/paper_base.yaml").algo.group_by) == ["paper"]
    for bad in ("[paper,task]", "[task,paper]", "[]", "[Paper]"):
        with pytest.raises(ConfigError, match=r"algo\.group_by"):
            load_config("jobs/configs/tiny.yaml", [f"algo.group_by={bad}"])
