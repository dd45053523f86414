"""eval_opt: a `generator` answers, an `evaluator` judges; the generator revises until judged correct.

Round r (0..R-1) is one generator turn then one evaluator turn, both with `round = r`. The loop
stops after the first \\boxed{Correct} verdict, or after R rounds. The evaluator also judges the last
answer, so every generator answer is evaluated and both roles have one turn per round. A verdict that
is neither Correct nor Incorrect counts as a parse failure of 'evaluator' and is treated as Incorrect
(its text still reaches the generator as feedback). Both agents keep a multi-turn chat history.
The final answer is extracted from the last generator turn.
"""

from __future__ import annotations

from marl.tasks.base import TaskFamily
from marl.types import Episode, PolicyClient, Task
from marl.workflows.common import (
    WorkflowOptions,
    ask,
    assistant,
    parse_verdict,
    set_final_answer,
    system,
    user,
    with_instruction,
)

NAME = "eval_opt"
ROLES: tuple[str, ...] = ("generator", "evaluator")

GENERATOR_SYSTEM = "You are a careful problem solver. Reason step by step, then give the final answer."
EVALUATOR_SYSTEM = (
    "You are a strict reviewer of solutions. Check the reasoning and the final answer. "
    "Explain any mistake briefly, then end with \\boxed{Correct} or \\boxed{Incorrect}."
)


def agents(opts: WorkflowOptions) -> list[str]:
    return ["generator", "evaluator"]


def _first_review(task: Task, answer: str) -> str:
    return (
        f"Problem:\n{task.prompt}\n\nProposed solution:\n{answer}\n\n"
        "Is this solution correct? Give brief feedback, then end with \\boxed{Correct} or \\boxed{Incorrect}."
    )


def _next_review(answer: str) -> str:
    return (
        f"Revised solution:\n{answer}\n\n"
        "Is it correct now? Give brief feedback, then end with \\boxed{Correct} or \\boxed{Incorrect}."
    )


def _revise(feedback: str, instruction: str) -> str:
    return with_instruction(
        f"A reviewer judged your solution incorrect:\n{feedback}\n\nRevise your solution.", instruction
    )


async def run(
    task: Task, client: PolicyClient, family: TaskFamily, opts: WorkflowOptions, sample_index: int
) -> Episode:
    episode = Episode(task=task, sample_index=sample_index, workflow=NAME)
    instruction = family.instruction()
    gen_msgs = [system(GENERATOR_SYSTEM), user(with_instruction(task.prompt, instruction))]
    eval_msgs = [system(EVALUATOR_SYSTEM)]
    for r in range(opts.max_rounds):
        gen = await ask(client, "generator", "generator", r, gen_msgs)
        episode.turns.append(gen)
        gen_msgs.append(assistant(gen.text))
        eval_msgs.append(user(_first_review(task, gen.text) if r == 0 else _next_review(gen.text)))
        ev = await ask(client, "evaluator", "evaluator", r, eval_msgs)
        episode.turns.append(ev)
        eval_msgs.append(assistant(ev.text))
        verdict = parse_verdict(ev.text)
        if verdict is None:
            episode.note_parse_failure("evaluator")
        if verdict:
            break
        gen_msgs.append(user(_revise(ev.text, instruction)))
    last_generator = [t for t in episode.turns if t.role == "generator"][-1]
    set_final_answer(episode, family, last_generator)
    return episode
