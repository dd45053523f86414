"""debate: two debaters answer, read each other's answer and revise for R rounds; a judge picks one.

A workflow written outside the project, against `marl` alone: train it with
    python -m jobs.train --config jobs/configs/tiny.yaml marl.workflow=examples/debate.py marl.max_rounds=1
A workflow module has ROLES, agents(opts) and an async run(task, client, family, opts, sample_index) that
returns an Episode; every model call goes through `client` (one Turn per call, routed by its role). Its
wording is data: PROMPT_SPEC names the templates each role fills, and the text comes from the prompt set
`marl.prompts` names when that set has a `debate` section (marl.prompts=my_prompts.yaml), else from
debate.yaml beside this file (PROMPT_FILE). Either is checked against PROMPT_SPEC at config load.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from marl.prompts import RoleWording, WorkflowWording
from marl.tasks.base import TaskFamily
from marl.types import Episode, PolicyClient, Task, Turn
from marl.workflows.common import (
    WorkflowOptions,
    ask,
    asking,
    assistant,
    first_number_in_range,
    parse_choice,
    set_final_answer,
    user,
    wording,
)

NAME = "debate"
ROLES: tuple[str, ...] = ("debater", "judge")  # each role gets its own policy under marl.sharing=isolated
SLOT_ROLES: tuple[str, ...] = ("debater",)  # debater0 and debater1 hold their own positions: one GRPO group each
DEBATERS = 2

# role -> template -> the placeholders it may use (as the built-in workflows' PROMPT_SPEC)
PROMPT_SPEC: dict[str, dict[str, tuple[str, ...]]] = {
    "debater": {"user": ("problem",), "revise": ("other",)},
    "judge": {"user": ("problem", "answers"), "answer": ("i", "text")},
}
# The wording when the set marl.prompts names has no `debate` section.
PROMPT_FILE = str(Path(__file__).with_suffix(".yaml"))


def agents(opts: WorkflowOptions) -> list[str]:
    return [f"debater{i}" for i in range(DEBATERS)] + ["judge"]


def _judge_prompt(task: Task, answers: list[str], judge: RoleWording) -> str:
    numbered = "\n\n".join(judge.fill("answer", i=i, text=text) for i, text in enumerate(answers, start=1))
    return judge.fill("user", problem=task.prompt, answers=numbered)


async def _debate(
    task: Task, client: PolicyClient, family: TaskFamily, rounds: int, w: WorkflowWording
) -> list[list[Turn]]:
    """Each debater's turns: an answer, then one revision per round after reading the other's latest."""
    names = [f"debater{i}" for i in range(DEBATERS)]
    d = w.role("debater")
    first = user(asking(w, d.fill("user", problem=task.prompt), family.instruction()))
    histories = [[*d.opening(), first] for _ in names]
    turns: list[list[Turn]] = [[] for _ in names]
    for r in range(rounds + 1):
        if r > 0:  # everyone reads the answers of the round before, then all revise at once
            latest = [t[-1].text for t in turns]
            for i, history in enumerate(histories):
                history += [assistant(latest[i]), user(d.fill("revise", other=latest[1 - i]))]
        said = await asyncio.gather(*(ask(client, "debater", n, r, h) for n, h in zip(names, histories, strict=True)))
        for mine, turn in zip(turns, said, strict=True):
            mine.append(turn)
    return turns


async def run(
    task: Task, client: PolicyClient, family: TaskFamily, opts: WorkflowOptions, sample_index: int
) -> Episode:
    episode = Episode(task=task, sample_index=sample_index, workflow=NAME)
    w = wording(opts, NAME, family, own_file=PROMPT_FILE)
    turns = await _debate(task, client, family, opts.max_rounds, w)
    episode.turns.extend(t for r in range(opts.max_rounds + 1) for t in (turns[0][r], turns[1][r]))
    finals = [t[-1] for t in turns]
    judging = w.role("judge")
    judge_messages = [*judging.opening(), user(_judge_prompt(task, [t.text for t in finals], judging))]
    judge = await ask(client, "judge", "judge", 0, judge_messages)
    episode.turns.append(judge)
    choice = parse_choice(judge.text, DEBATERS)
    if choice is None:  # recorded, then the fallbacks: a standalone 1 or 2 in the text, else debater 1
        episode.note_parse_failure("judge")
        choice = first_number_in_range(judge.text, DEBATERS) or 1
    set_final_answer(episode, family, finals[choice - 1])
    return episode
