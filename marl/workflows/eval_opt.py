"""eval_opt: a `generator` answers, an `evaluator` judges; the generator revises until judged correct.

Round r (0..R-1) is one generator turn then one evaluator turn, both with `round = r`. The loop
stops after the first \\boxed{Correct} verdict, or after R rounds. The evaluator also judges the last
answer, so every generator answer is evaluated and both roles have one turn per round. A verdict that
is neither Correct nor Incorrect counts as a parse failure of 'evaluator' and is treated as Incorrect
(its text still reaches the generator as feedback). Both agents keep a multi-turn chat history.
The final answer is extracted from the last generator turn. The wording comes from `marl.prompts`
(PROMPTS): `default`, or `paper`, which has its own personas for code tasks.

The context differs by prompt set. default: two chats; the evaluator's user turn quotes the problem and the
answer, and the generator's next user turn quotes the feedback. paper: one shared conversation, as the paper's
workflow shares its history: the problem (user), each answer (assistant), the review request (user), each
verdict (assistant) and the revision request (user); each role reads all of it after its own system prompt.
"""

from __future__ import annotations

from dataclasses import dataclass

from marl.tasks.base import TaskFamily
from marl.types import Episode, PolicyClient, Task
from marl.workflows.common import (
    WorkflowOptions,
    ask,
    assistant,
    parse_verdict,
    prompt_kind,
    set_final_answer,
    system,
    user,
    with_instruction,
)

NAME = "eval_opt"
ROLES: tuple[str, ...] = ("generator", "evaluator")


@dataclass(frozen=True)
class Prompts:
    """One wording of eval_opt: the two system prompts and the requests that close each review and revision."""

    generator: str
    evaluator: str
    review: str  # ends the evaluator's first review
    rereview: str  # ends each later review
    revise: str  # asks the generator for another solution, after the evaluator's feedback


_VERDICT = "then end with \\boxed{Correct} or \\boxed{Incorrect}."
_SOLVER = "You are a careful problem solver. Reason step by step, then give the final answer."
DEFAULT = Prompts(
    generator=_SOLVER,
    evaluator=(
        "You are a strict reviewer of solutions. Check the reasoning and the final answer. "
        "Explain any mistake briefly, then end with \\boxed{Correct} or \\boxed{Incorrect}."
    ),
    review=f"Is this solution correct? Give brief feedback, {_VERDICT}",
    rereview=f"Is it correct now? Give brief feedback, {_VERDICT}",
    revise="Revise your solution.",
)
# The paper's wording: the evaluator critiques without ever giving the answer away (otherwise the generator
# could copy it and the evaluator would be rewarded for solving), and a rejected generator tries another method.
PAPER_MATH = Prompts(
    generator=_SOLVER,
    evaluator=(
        "You are a critical evaluator of solutions. Check every step of the reasoning and the final answer, "
        "and point out each mistake with brief feedback. Never reveal the correct final answer and never write "
        f"a corrected solution. Give your feedback, {_VERDICT}"
    ),
    review=f"Is this solution correct? Give feedback without revealing the answer, {_VERDICT}",
    rereview=f"Is it correct now? Give feedback without revealing the answer, {_VERDICT}",
    revise=("Write a new solution that addresses the feedback and uses a different method or approach from your "
            "previous attempt."),
)
PAPER_CODE = Prompts(
    generator=(
        "You are an expert programmer. Read the problem carefully and write a complete, correct solution "
        "in a single ```python code block."
    ),
    evaluator=(
        "You are a code reviewer. Check whether the program solves the problem as stated: its logic, its "
        "input and output format, and edge cases (empty input, boundary values, large inputs). Explain each "
        f"bug briefly, but do not write the fixed code. Give your feedback, {_VERDICT}"
    ),
    review=f"Does this program solve the problem? Give feedback without writing the fixed code, {_VERDICT}",
    rereview=f"Is it correct now? Give feedback without writing the fixed code, {_VERDICT}",
    revise=("Write a new program that addresses the review and uses a different method or approach from your "
            "previous attempt."),
)
# (marl.prompts, task kind) -> wording; the default set has one wording for every task.
PROMPTS: dict[tuple[str, str], Prompts] = {
    ("default", "math"): DEFAULT,
    ("default", "code"): DEFAULT,
    ("paper", "math"): PAPER_MATH,
    ("paper", "code"): PAPER_CODE,
}


def prompts_for(prompt_set: str, family: TaskFamily) -> Prompts:
    """The wording for `prompt_set` (marl.prompts) and the family's kind: code, or math (every other family)."""
    return PROMPTS[(prompt_set, prompt_kind(family))]


def agents(opts: WorkflowOptions) -> list[str]:
    return ["generator", "evaluator"]


def _first_review(task: Task, answer: str, p: Prompts) -> str:
    return f"Problem:\n{task.prompt}\n\nProposed solution:\n{answer}\n\n{p.review}"


def _next_review(answer: str, p: Prompts) -> str:
    return f"Revised solution:\n{answer}\n\n{p.rereview}"


def _revise(feedback: str, instruction: str, p: Prompts) -> str:
    return with_instruction(f"A reviewer judged your solution incorrect:\n{feedback}\n\n{p.revise}", instruction)


async def run(
    task: Task, client: PolicyClient, family: TaskFamily, opts: WorkflowOptions, sample_index: int
) -> Episode:
    episode = Episode(task=task, sample_index=sample_index, workflow=NAME)
    p = prompts_for(opts.prompts, family)
    rounds = _shared_rounds if opts.prompts == "paper" else _separate_rounds
    await rounds(task, client, family.instruction(), opts.max_rounds, p, episode)
    last_generator = [t for t in episode.turns if t.role == "generator"][-1]
    set_final_answer(episode, family, last_generator)
    return episode


def _judged_correct(text: str, episode: Episode) -> bool:
    """The verdict; an unparsable one is a parse failure of 'evaluator' and counts as Incorrect."""
    verdict = parse_verdict(text)
    if verdict is None:
        episode.note_parse_failure("evaluator")
    return bool(verdict)


async def _separate_rounds(
    task: Task, client: PolicyClient, instruction: str, max_rounds: int, p: Prompts, episode: Episode
) -> None:
    """Two chats: the evaluator is shown each answer in a user turn, the generator each verdict."""
    gen_msgs = [system(p.generator), user(with_instruction(task.prompt, instruction))]
    eval_msgs = [system(p.evaluator)]
    for r in range(max_rounds):
        gen = await ask(client, "generator", "generator", r, gen_msgs)
        episode.turns.append(gen)
        gen_msgs.append(assistant(gen.text))
        eval_msgs.append(user(_first_review(task, gen.text, p) if r == 0 else _next_review(gen.text, p)))
        ev = await ask(client, "evaluator", "evaluator", r, eval_msgs)
        episode.turns.append(ev)
        eval_msgs.append(assistant(ev.text))
        if _judged_correct(ev.text, episode):
            return
        gen_msgs.append(user(_revise(ev.text, instruction, p)))


async def _shared_rounds(
    task: Task, client: PolicyClient, instruction: str, max_rounds: int, p: Prompts, episode: Episode
) -> None:
    """One conversation both roles read after their own system prompt: answers and verdicts are its assistant
    turns, the review and revision requests its user turns."""
    history = [user(with_instruction(task.prompt, instruction))]
    for r in range(max_rounds):
        gen = await ask(client, "generator", "generator", r, [system(p.generator), *history])
        episode.turns.append(gen)
        history += [assistant(gen.text), user(p.review if r == 0 else p.rereview)]
        ev = await ask(client, "evaluator", "evaluator", r, [system(p.evaluator), *history])
        episode.turns.append(ev)
        history.append(assistant(ev.text))
        if _judged_correct(ev.text, episode):
            return
        history.append(user(with_instruction(p.revise, instruction)))
