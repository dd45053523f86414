"""A user workflow defined in the tests: `laps` runners, one after another, each passing the baton once per
round, then a coach who reads the last answer. It declares its turn shape as a function of its options."""

from __future__ import annotations

from dataclasses import dataclass

from marl.field_rules import positive
from marl.types import Episode, PolicyClient, Task
from marl.workflows.common import WorkflowOptions, ask, set_final_answer, user
from marl.workflows.turns import TurnShape

NAME = "relay"
ROLES: tuple[str, ...] = ("runner", "coach")


@dataclass(frozen=True)
class Options:
    laps: int = positive(2)  # runner turns per round (marl.options.laps)


OPTIONS = Options


def agents(opts: WorkflowOptions) -> list[str]:
    return ["runner", "coach"]


def turn_shape(opts: WorkflowOptions) -> TurnShape:
    laps = opts.own(Options).laps * opts.max_rounds
    return TurnShape({"runner": laps, "coach": 1}, laps + 1)


async def run(task: Task, client: PolicyClient, family, opts: WorkflowOptions, sample_index: int) -> Episode:
    episode = Episode(task=task, sample_index=sample_index, workflow=NAME)
    text = task.prompt
    for lap in range(opts.own(Options).laps * opts.max_rounds):
        turn = await ask(client, "runner", "runner", lap, [user(text)])
        episode.turns.append(turn)
        text = turn.text
    coach = await ask(client, "coach", "coach", 0, [user(text)])
    episode.turns.append(coach)
    set_final_answer(episode, family, coach)
    return episode
