"""voting: K `generator`s answer the identical prompt in parallel; an `aggregator` picks one.

The aggregator sees the problem and the K responses numbered 1..K and must answer \\boxed{i}.
Fallbacks, each recorded as one parse failure of 'aggregator': the first standalone number in
1..K in its text, else response 1. The final answer is extracted from the chosen response.
The wording comes from `marl.prompts` (WORDINGS): under `paper` the responses are "--- Solution i ---" blocks,
and on code tasks the generators are competitive programmers and the aggregator picks the solution most likely
to pass all tests.
"""

from __future__ import annotations

from dataclasses import dataclass

from marl.tasks.base import TaskFamily
from marl.types import Episode, PolicyClient, Task
from marl.workflows.common import (
    WorkflowOptions,
    ask,
    ask_all,
    first_number_in_range,
    parse_choice,
    prompt_kind,
    set_final_answer,
    system,
    user,
    with_instruction,
)

NAME = "voting"
ROLES: tuple[str, ...] = ("generator", "aggregator")
# generator0..K-1 each answer in their own slot: separate GRPO groups under the paper's grouping.
SLOT_ROLES: tuple[str, ...] = ("generator",)


@dataclass(frozen=True)
class Wording:
    """One wording of voting: the two system prompts, how a response is headed, and the aggregator's question."""

    generator: str
    aggregator: str
    heading: str  # formatted with the response's 1-based index
    question: str  # formatted with k, the number of responses


DEFAULT = Wording(
    generator="You are a careful problem solver. Reason step by step, then give the final answer.",
    aggregator="You compare candidate solutions to a problem and pick the one most likely to be correct.",
    heading="Response {i}:",
    question="Which response is correct? Answer with its number as \\boxed{{i}}, i from 1 to {k}.",
)
PAPER_MATH = Wording(
    generator=DEFAULT.generator,
    aggregator=DEFAULT.aggregator,
    heading="--- Solution {i} ---",
    question="Which solution is correct? Answer with its number as \\boxed{{i}}, i from 1 to {k}.",
)
PAPER_CODE = Wording(
    generator=("You are an expert competitive programmer. Read the problem carefully and write a complete, "
               "correct solution."),
    aggregator=("You compare candidate programs for a programming problem and pick the one most likely to pass "
                "all tests."),
    heading="--- Solution {i} ---",
    question=("Which solution is most likely to pass all tests? Answer with its number as \\boxed{{i}}, i from 1 "
              "to {k}."),
)
# (marl.prompts, task kind) -> wording; the default set has one wording for every task.
WORDINGS: dict[tuple[str, str], Wording] = {
    ("default", "math"): DEFAULT, ("default", "code"): DEFAULT,
    ("paper", "math"): PAPER_MATH, ("paper", "code"): PAPER_CODE,
}


def agents(opts: WorkflowOptions) -> list[str]:
    return [f"generator{i}" for i in range(opts.num_generators)] + ["aggregator"]


def _aggregate_prompt(task: Task, responses: list[str], w: Wording) -> str:
    numbered = "\n\n".join(f"{w.heading.format(i=i)}\n{text}" for i, text in enumerate(responses, start=1))
    return f"Problem:\n{task.prompt}\n\n{numbered}\n\n{w.question.format(k=len(responses))}"


def choose(text: str, k: int, episode: Episode) -> int:
    """The aggregator's 1-based choice, falling back (and noting a parse failure) when unparsable."""
    choice = parse_choice(text, k)
    if choice is not None:
        return choice
    episode.note_parse_failure("aggregator")
    return first_number_in_range(text, k) or 1


async def run(
    task: Task, client: PolicyClient, family: TaskFamily, opts: WorkflowOptions, sample_index: int
) -> Episode:
    episode = Episode(task=task, sample_index=sample_index, workflow=NAME)
    names = agents(opts)[:-1]
    w = WORDINGS[(opts.prompts, prompt_kind(family))]
    prompt = [system(w.generator), user(with_instruction(task.prompt, family.instruction()))]
    generators = await ask_all(client, "generator", names, [prompt] * len(names))
    episode.turns.extend(generators)
    responses = [t.text for t in generators]
    agg_msgs = [system(w.aggregator), user(_aggregate_prompt(task, responses, w))]
    aggregator = await ask(client, "aggregator", "aggregator", 0, agg_msgs)
    episode.turns.append(aggregator)
    chosen = choose(aggregator.text, len(responses), episode)
    set_final_answer(episode, family, generators[chosen - 1])
    return episode
