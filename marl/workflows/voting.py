"""voting: K `generator`s answer the identical prompt in parallel; an `aggregator` picks one.

The aggregator sees the problem and the K responses numbered 1..K and must answer \\boxed{i}.
Fallbacks, each recorded as one parse failure of 'aggregator': the first standalone number in
1..K in its text, else response 1. The final answer is extracted from the chosen response.
"""

from __future__ import annotations

from marl.tasks.base import TaskFamily
from marl.types import Episode, PolicyClient, Task
from marl.workflows.common import (
    WorkflowOptions,
    ask,
    ask_all,
    first_number_in_range,
    parse_choice,
    set_final_answer,
    system,
    user,
    with_instruction,
)

NAME = "voting"
ROLES: tuple[str, ...] = ("generator", "aggregator")
# generator0..K-1 each answer in their own slot: separate GRPO groups under the paper's grouping.
SLOT_ROLES: tuple[str, ...] = ("generator",)

GENERATOR_SYSTEM = "You are a careful problem solver. Reason step by step, then give the final answer."
AGGREGATOR_SYSTEM = "You compare candidate solutions to a problem and pick the one most likely to be correct."


def agents(opts: WorkflowOptions) -> list[str]:
    return [f"generator{i}" for i in range(opts.num_generators)] + ["aggregator"]


def _aggregate_prompt(task: Task, responses: list[str]) -> str:
    numbered = "\n\n".join(f"Response {i}:\n{text}" for i, text in enumerate(responses, start=1))
    return (
        f"Problem:\n{task.prompt}\n\n{numbered}\n\n"
        f"Which response is correct? Answer with its number as \\boxed{{i}}, i from 1 to {len(responses)}."
    )


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
    prompt = [system(GENERATOR_SYSTEM), user(with_instruction(task.prompt, family.instruction()))]
    generators = await ask_all(client, "generator", names, [prompt] * len(names))
    episode.turns.extend(generators)
    responses = [t.text for t in generators]
    agg_msgs = [system(AGGREGATOR_SYSTEM), user(_aggregate_prompt(task, responses))]
    aggregator = await ask(client, "aggregator", "aggregator", 0, agg_msgs)
    episode.turns.append(aggregator)
    chosen = choose(aggregator.text, len(responses), episode)
    set_final_answer(episode, family, generators[chosen - 1])
    return episode
