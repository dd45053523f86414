"""debate: two debaters answer, read each other's answer and revise for R rounds; a judge picks one.

A workflow written outside the project, against `marl` alone: train it with
    python -m jobs.train --config jobs/configs/tiny.yaml marl.workflow=examples/debate.py marl.max_rounds=1
A workflow module has ROLES, agents(opts) and an async run(task, client, family, opts, sample_index) that
returns an Episode; every model call goes through `client` (one Turn per call, routed by its role).
"""

from __future__ import annotations

import asyncio

from marl.tasks.base import TaskFamily
from marl.types import Episode, PolicyClient, Task, Turn
from marl.workflows.common import (
    WorkflowOptions,
    ask,
    assistant,
    first_number_in_range,
    parse_choice,
    set_final_answer,
    system,
    user,
    with_instruction,
)

NAME = "debate"
ROLES: tuple[str, ...] = ("debater", "judge")  # each role gets its own policy under marl.sharing=isolated
SLOT_ROLES: tuple[str, ...] = ("debater",)  # debater0 and debater1 hold their own positions: one GRPO group each
DEBATERS = 2

DEBATER_SYSTEM = "You are a careful problem solver in a debate. Reason step by step, then give the final answer."
JUDGE_SYSTEM = "You judge a debate: pick the answer most likely to be correct."


def agents(opts: WorkflowOptions) -> list[str]:
    return [f"debater{i}" for i in range(DEBATERS)] + ["judge"]


def _revise_prompt(other: str) -> str:
    return f"The other debater answered:\n{other}\n\nRead it critically, then give your revised answer."


def _judge_prompt(task: Task, answers: list[str]) -> str:
    numbered = "\n\n".join(f"Debater {i}:\n{text}" for i, text in enumerate(answers, start=1))
    return f"Problem:\n{task.prompt}\n\n{numbered}\n\nWhich debater is right? Answer \\boxed{{1}} or \\boxed{{2}}."


async def _debate(task: Task, client: PolicyClient, family: TaskFamily, rounds: int) -> list[list[Turn]]:
    """Each debater's turns: an answer, then one revision per round after reading the other's latest."""
    names = [f"debater{i}" for i in range(DEBATERS)]
    histories = [[system(DEBATER_SYSTEM), user(with_instruction(task.prompt, family.instruction()))] for _ in names]
    turns: list[list[Turn]] = [[] for _ in names]
    for r in range(rounds + 1):
        if r > 0:  # everyone reads the answers of the round before, then all revise at once
            latest = [t[-1].text for t in turns]
            for i, history in enumerate(histories):
                history += [assistant(latest[i]), user(_revise_prompt(latest[1 - i]))]
        said = await asyncio.gather(*(ask(client, "debater", n, r, h) for n, h in zip(names, histories, strict=True)))
        for mine, turn in zip(turns, said, strict=True):
            mine.append(turn)
    return turns


async def run(
    task: Task, client: PolicyClient, family: TaskFamily, opts: WorkflowOptions, sample_index: int
) -> Episode:
    episode = Episode(task=task, sample_index=sample_index, workflow=NAME)
    turns = await _debate(task, client, family, opts.max_rounds)
    episode.turns.extend(t for r in range(opts.max_rounds + 1) for t in (turns[0][r], turns[1][r]))
    finals = [t[-1] for t in turns]
    judge_messages = [system(JUDGE_SYSTEM), user(_judge_prompt(task, [t.text for t in finals]))]
    judge = await ask(client, "judge", "judge", 0, judge_messages)
    episode.turns.append(judge)
    choice = parse_choice(judge.text, DEBATERS)
    if choice is None:  # recorded, then the fallbacks: a standalone 1 or 2 in the text, else debater 1
        episode.note_parse_failure("judge")
        choice = first_number_in_range(judge.text, DEBATERS) or 1
    set_final_answer(episode, family, finals[choice - 1])
    return episode
