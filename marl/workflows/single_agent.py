"""single_agent: one `solver` answers the problem; the baseline every multi-agent table compares to."""

from __future__ import annotations

from marl.tasks.base import TaskFamily
from marl.types import Episode, PolicyClient, Task
from marl.workflows.common import WorkflowOptions, ask, asking, set_final_answer, user, wording
from marl.workflows.turns import TurnShape

NAME = "single_agent"
ROLES: tuple[str, ...] = ("solver",)

# The wording each prompt set gives: role -> template -> the placeholders it may use (see voting.PROMPT_SPEC).
PROMPT_SPEC: dict[str, dict[str, tuple[str, ...]]] = {"solver": {"user": ("problem",)}}


def agents(opts: WorkflowOptions) -> list[str]:
    return ["solver"]


def turn_shape(opts: WorkflowOptions) -> TurnShape:
    return TurnShape({"solver": 1}, 1)


async def run(
    task: Task, client: PolicyClient, family: TaskFamily, opts: WorkflowOptions, sample_index: int
) -> Episode:
    episode = Episode(task=task, sample_index=sample_index, workflow=NAME)
    w = wording(opts, NAME, family)
    solver = w.role("solver")
    question = asking(w, solver.fill("user", problem=task.prompt), family.instruction())
    messages = [*solver.opening(), user(question)]
    turn = await ask(client, "solver", "solver", 0, messages)
    episode.turns.append(turn)
    set_final_answer(episode, family, turn)
    return episode
