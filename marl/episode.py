"""One sample end to end: run a workflow on a task, score its final answer, assign turn rewards."""

from __future__ import annotations

from marl.rewards import RewardShaping, assign
from marl.tasks.base import AsyncScoring, TaskFamily
from marl.types import Episode, PolicyClient, Task
from marl.workflows import get_workflow
from marl.workflows.common import WorkflowOptions


async def run_episode(
    workflow_name: str,
    task: Task,
    client: PolicyClient,
    family: TaskFamily,
    opts: WorkflowOptions,
    sample_index: int,
    shaping: RewardShaping | None = None,
) -> Episode:
    """The scored Episode. A failed episode (episode.failure set) scores 0.0 whatever its answer."""
    episode = await get_workflow(workflow_name).run(task, client, family, opts, sample_index)
    # Named as the config names it: a user module's episodes are then found again by it (slot roles, reports).
    episode.workflow = workflow_name
    if episode.failure:
        episode.reward = 0.0
    elif isinstance(family, AsyncScoring):
        # Slow scorers (the code sandbox) run off the event loop, so other episodes keep talking to engines.
        scored = await family.score_async(task, episode.final_answer)
        episode.reward = scored.reward
        episode.score_info.update(scored.info)
    else:
        # Inline: math-verify is capped (answer length, timeout) and typically takes ms.
        episode.reward = family.score(task, episode.final_answer)
    return assign(episode, shaping)
