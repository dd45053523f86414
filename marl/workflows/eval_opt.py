"""eval_opt: a `generator` answers, an `evaluator` judges; the generator revises until judged correct.

Round r (0..R-1) is one generator turn then one evaluator turn, both with `round = r`. The loop stops after
the first \\boxed{Correct} verdict, or after R rounds. The evaluator also judges the last answer, so every
generator answer is evaluated and both roles have one turn per round. A verdict that is neither Correct nor
Incorrect counts as a parse failure of 'evaluator' and is treated as Incorrect (its text still reaches the
generator as feedback). Both agents keep a multi-turn chat history. The final answer is extracted from the
last generator turn. The wording comes from the prompt set `marl.prompts` names (marl/prompts/; PROMPT_SPEC
below): `default`, or `paper`, which has its own personas for code tasks.

The context is the set's `history` setting. separate (default's): two chats; the evaluator's user turn quotes
the problem and the answer, and the generator's next user turn quotes the feedback. shared (paper's): one
shared conversation, as the paper's workflow shares its history: the problem (user), each answer (assistant),
the review request (user), each verdict (assistant) and the revision request (user); each role reads all of it
after its own system prompt (and worked examples, if the set gives any).
"""

from __future__ import annotations

from marl.guards import Guard, boxed_choices
from marl.prompts import RoleWording, WorkflowWording
from marl.tasks.base import TaskFamily
from marl.types import Episode, PolicyClient, Task
from marl.workflows.common import (
    WorkflowOptions,
    ask,
    asking,
    assistant,
    parse_verdict,
    set_final_answer,
    user,
    wording,
)
from marl.workflows.turns import TurnShape

NAME = "eval_opt"
ROLES: tuple[str, ...] = ("generator", "evaluator")


# The wording each prompt set gives: role -> template -> the placeholders it may use (see voting.PROMPT_SPEC).
# Under history: shared the review and revision requests stand alone (the answers and verdicts are in the
# shared conversation); under history: separate the evaluator's reviews quote the answer and the revision
# quotes the feedback.
PROMPT_SPEC: dict[str, dict[str, tuple[str, ...]]] = {
    "generator": {"user": ("problem",), "revise": ("feedback",)},
    "evaluator": {"review": ("problem", "answer"), "rereview": ("answer",)},
}
HISTORIES: tuple[str, ...] = ("separate", "shared")  # the set's `settings: {history: ...}`; separate if unset


def agents(opts: WorkflowOptions) -> list[str]:
    return ["generator", "evaluator"]


def turn_shape(opts: WorkflowOptions) -> TurnShape:
    """At the caps every round runs: a generator turn, then an evaluator turn, R times."""
    return TurnShape({"generator": opts.max_rounds, "evaluator": opts.max_rounds}, 2 * opts.max_rounds)


def guards(opts: WorkflowOptions) -> dict[str, Guard]:
    """The built-in guards (marl.guards.evaluator: builtin): the evaluator writes its feedback within 200
    characters, then its verdict \\boxed{Correct} or \\boxed{Incorrect}, what `parse_verdict` reads."""
    return {"evaluator": Guard("choice", boxed_choices(["Correct", "Incorrect"]), budget=200)}


async def run(
    task: Task, client: PolicyClient, family: TaskFamily, opts: WorkflowOptions, sample_index: int
) -> Episode:
    episode = Episode(task=task, sample_index=sample_index, workflow=NAME)
    w = wording(opts, NAME, family)
    rounds = _shared_rounds if w.settings.get("history", "separate") == "shared" else _separate_rounds
    await rounds(task, client, family.instruction(), opts.max_rounds, w, episode)
    last_generator = [t for t in episode.turns if t.role == "generator"][-1]
    set_final_answer(episode, family, last_generator)
    return episode


def _review(evaluator: RoleWording, round_: int, task: Task, answer: str) -> str:
    """The evaluator's request: the first review, or a later one."""
    if round_ == 0:
        return evaluator.fill("review", problem=task.prompt, answer=answer)
    return evaluator.fill("rereview", answer=answer)


def _judged_correct(text: str, episode: Episode) -> bool:
    """The verdict; an unparsable one is a parse failure of 'evaluator' and counts as Incorrect."""
    verdict = parse_verdict(text)
    if verdict is None:
        episode.note_parse_failure("evaluator")
    return bool(verdict)


async def _separate_rounds(
    task: Task, client: PolicyClient, instruction: str, max_rounds: int, w: WorkflowWording, episode: Episode
) -> None:
    """Two chats: the evaluator is shown each answer in a user turn, the generator each verdict."""
    g, e = w.role("generator"), w.role("evaluator")
    gen_msgs = [*g.opening(), user(asking(w, g.fill("user", problem=task.prompt), instruction))]
    eval_msgs = e.opening()
    for r in range(max_rounds):
        gen = await ask(client, "generator", "generator", r, gen_msgs)
        episode.turns.append(gen)
        gen_msgs.append(assistant(gen.text))
        review = _review(e, r, task, gen.text)
        eval_msgs.append(user(review))
        ev = await ask(client, "evaluator", "evaluator", r, eval_msgs)
        episode.turns.append(ev)
        eval_msgs.append(assistant(ev.text))
        if _judged_correct(ev.text, episode):
            return
        gen_msgs.append(user(asking(w, g.fill("revise", feedback=ev.text), instruction)))


async def _shared_rounds(
    task: Task, client: PolicyClient, instruction: str, max_rounds: int, w: WorkflowWording, episode: Episode
) -> None:
    """One conversation both roles read after their own opening (system message, worked examples): answers and
    verdicts are its assistant turns, the review and revision requests its user turns."""
    g, e = w.role("generator"), w.role("evaluator")
    history = [user(asking(w, g.fill("user", problem=task.prompt), instruction))]
    for r in range(max_rounds):
        gen = await ask(client, "generator", "generator", r, [*g.opening(), *history])
        episode.turns.append(gen)
        review = _review(e, r, task, gen.text)
        history += [assistant(gen.text), user(review)]
        ev = await ask(client, "evaluator", "evaluator", r, [*e.opening(), *history])
        episode.turns.append(ev)
        history.append(assistant(ev.text))
        if _judged_correct(ev.text, episode):
            return
        history.append(user(asking(w, g.fill("revise", feedback=ev.text), instruction)))
