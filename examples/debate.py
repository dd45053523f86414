"""debate: N debaters answer, read each other's answers and revise for R rounds; a judge picks one.

A workflow written outside the project, against `marl` alone: train it with
    python -m jobs.train --config jobs/configs/tiny.yaml marl.workflow=examples/debate.py marl.max_rounds=1
A workflow module has ROLES, agents(opts) and an async run(task, client, family, opts, sample_index) that
returns an Episode; every model call goes through `client` (one Turn per call, routed by its role). Its
own options are the dataclass OPTIONS names, each field with its bounds: `marl.options.debaters=3` sets N,
checked at config load like any key; `opts.own(Options)` reads them. turn_shape(opts) tells the planner how
many turns each role takes at the caps. Beside them, guards(opts) declares the
judge's output guard (on with `marl.guards.judge=builtin`). Its
wording is data: PROMPT_SPEC names the templates each role fills, and the text comes from the prompt set
`marl.prompts` names when that set has a `debate` section (marl.prompts=my_prompts.yaml), else from
debate.yaml beside this file (PROMPT_FILE). Either is checked against PROMPT_SPEC at config load.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from marl.field_rules import at_least
from marl.guards import Guard, boxed_choices
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
from marl.workflows.turns import TurnShape
from marl.workflows.voting import choices

NAME = "debate"
ROLES: tuple[str, ...] = ("debater", "judge")  # each role gets its own policy under marl.sharing=isolated
SLOT_ROLES: tuple[str, ...] = ("debater",)  # each debater holds its own position: one GRPO group each


@dataclass(frozen=True)
class Options:
    debaters: int = at_least(2, 2)  # debaters, each reading the others' answers (marl.options.debaters)


OPTIONS = Options


def guards(opts: WorkflowOptions) -> dict[str, Guard]:
    """The judge's built-in output guard (`marl.guards.judge: builtin`): 200 characters of reasoning at most,
    then \\boxed{i} for one of the debaters, what `parse_choice` reads (marl/guards.py)."""
    picks = [str(i) for i in range(1, opts.own(Options).debaters + 1)]
    return {"judge": Guard("choice", boxed_choices(picks), budget=200)}

# role -> template -> the placeholders it may use (as the built-in workflows' PROMPT_SPEC)
PROMPT_SPEC: dict[str, dict[str, tuple[str, ...]]] = {
    "debater": {"user": ("problem",), "revise": ("other",)},
    # choices: "\boxed{1} or \boxed{2}" for two debaters
    "judge": {"user": ("problem", "answers", "choices"), "answer": ("i", "text")},
}
# The wording when the set marl.prompts names has no `debate` section.
PROMPT_FILE = str(Path(__file__).with_suffix(".yaml"))


def agents(opts: WorkflowOptions) -> list[str]:
    return _debaters(opts) + ["judge"]


def turn_shape(opts: WorkflowOptions) -> TurnShape:
    """What the planner sizes a step by: every debater answers, then revises R times, all at once each
    round; then the judge."""
    rounds = opts.max_rounds + 1
    return TurnShape({"debater": opts.own(Options).debaters * rounds, "judge": 1}, rounds + 1)


def _debaters(opts: WorkflowOptions) -> list[str]:
    return [f"debater{i}" for i in range(opts.own(Options).debaters)]


def _judge_prompt(task: Task, answers: list[str], judge: RoleWording) -> str:
    numbered = "\n\n".join(judge.fill("answer", i=i, text=text) for i, text in enumerate(answers, start=1))
    return judge.fill("user", problem=task.prompt, answers=numbered, choices=choices(len(answers)))


async def _debate(
    task: Task, client: PolicyClient, family: TaskFamily, names: list[str], rounds: int, w: WorkflowWording
) -> list[list[Turn]]:
    """Each debater's turns: an answer, then one revision per round after reading the others' latest."""
    d = w.role("debater")
    first = user(asking(w, d.fill("user", problem=task.prompt), family.instruction()))
    histories = [[*d.opening(), first] for _ in names]
    turns: list[list[Turn]] = [[] for _ in names]
    for r in range(rounds + 1):
        if r > 0:  # everyone reads the answers of the round before, then all revise at once
            latest = [t[-1].text for t in turns]
            for i, history in enumerate(histories):
                others = "\n\n".join(text for j, text in enumerate(latest) if j != i)
                history += [assistant(latest[i]), user(d.fill("revise", other=others))]
        said = await asyncio.gather(
            *(ask(client, "debater", n, r, h) for n, h in zip(names, histories, strict=True))
        )
        for mine, turn in zip(turns, said, strict=True):
            mine.append(turn)
    return turns


async def run(
    task: Task, client: PolicyClient, family: TaskFamily, opts: WorkflowOptions, sample_index: int
) -> Episode:
    episode = Episode(task=task, sample_index=sample_index, workflow=NAME)
    w = wording(opts, NAME, family, own_file=PROMPT_FILE)
    turns = await _debate(task, client, family, _debaters(opts), opts.max_rounds, w)
    episode.turns.extend(mine[r] for r in range(opts.max_rounds + 1) for mine in turns)
    finals = [t[-1] for t in turns]
    judging = w.role("judge")
    judge_messages = [*judging.opening(), user(_judge_prompt(task, [t.text for t in finals], judging))]
    judge = await ask(client, "judge", "judge", 0, judge_messages)
    episode.turns.append(judge)
    choice = parse_choice(judge.text, len(finals))
    if choice is None:  # recorded, then the fallbacks: a debater's standalone number in the text, else 1
        episode.note_parse_failure("judge")
        choice = first_number_in_range(judge.text, len(finals)) or 1
    set_final_answer(episode, family, finals[choice - 1])
    return episode
