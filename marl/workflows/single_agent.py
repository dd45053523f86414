"""single_agent: one `solver` answers the problem; the baseline every multi-agent table compares to."""

from __future__ import annotations

from marl.tasks.base import TaskFamily
from marl.types import Episode, PolicyClient, Task
from marl.workflows.common import WorkflowOptions, ask, set_final_answer, system, user, with_instruction

NAME = "single_agent"
ROLES: tuple[str, ...] = ("solver",)

SOLVER_SYSTEM = "You are a careful problem solver. Reason step by step, then give the final answer."


def agents(opts: WorkflowOptions) -> list[str]:
    return ["solver"]


async def run(
    task: Task, client: PolicyClient, family: TaskFamily, opts: WorkflowOptions, sample_index: int
) -> Episode:
    episode = Episode(task=task, sample_index=sample_index, workflow=NAME)
    messages = [system(SOLVER_SYSTEM), user(with_instruction(task.prompt, family.instruction()))]
    turn = await ask(client, "solver", "solver", 0, messages)
    episode.turns.append(turn)
    set_final_answer(episode, family, turn)
    return episode
