"""voting: K `generator`s answer the identical prompt in parallel; an `aggregator` picks one.

The aggregator sees the problem and the K responses numbered 1..K and must answer \\boxed{i}. Fallbacks, each
recorded as one parse failure of 'aggregator': the first standalone number in 1..K in its text, else response
1. The final answer is extracted from the chosen response; the position chosen is recorded (score_info
'choice'). The responses come in the generators' order, or with `marl.shuffle_candidates` in an order drawn
per episode (score_info 'shown': the generators' indices in the order shown), which separates a preference
for a position from one for a generator. The wording comes from the prompt set
`marl.prompts` names (marl/prompts/; PROMPT_SPEC below): under `paper` the responses are "--- Solution i ---"
blocks, and on code tasks the generators are competitive programmers and the aggregator picks the solution
most likely to pass all tests.
"""

from __future__ import annotations

import random

from marl.guards import Guard, boxed_choices
from marl.prompts import RoleWording
from marl.seeds import derive_seed
from marl.tasks.base import TaskFamily
from marl.types import Episode, PolicyClient, Task
from marl.workflows.common import (
    WorkflowOptions,
    ask,
    ask_all,
    asking,
    first_number_in_range,
    parse_choice,
    set_final_answer,
    user,
    wording,
)
from marl.workflows.turns import TurnShape

NAME = "voting"
ROLES: tuple[str, ...] = ("generator", "aggregator")
# generator0..K-1 each answer in their own slot: separate GRPO groups under the paper's grouping.
SLOT_ROLES: tuple[str, ...] = ("generator",)


# The wording each prompt set gives: role -> template -> the placeholders it may use
# (marl.workflows.prompt_check checks a set against it).
PROMPT_SPEC: dict[str, dict[str, tuple[str, ...]]] = {
    "generator": {"user": ("problem",)},
    # responses: the K responses, each rendered by `response` and separated by blank lines; choices:
    # "\boxed{1}, \boxed{2} or \boxed{3}" for K = 3
    "aggregator": {"user": ("problem", "responses", "k", "choices"), "response": ("i", "text")},
}


def agents(opts: WorkflowOptions) -> list[str]:
    return [f"generator{i}" for i in range(opts.num_generators)] + ["aggregator"]


def turn_shape(opts: WorkflowOptions) -> TurnShape:
    """K generators at once, then the aggregator."""
    return TurnShape({"generator": opts.num_generators, "aggregator": 1}, 2)


def guards(opts: WorkflowOptions) -> dict[str, Guard]:
    """The built-in guards (marl.guards.aggregator: builtin): the aggregator reasons within 200 characters,
    then answers \\boxed{k} with k in 1..K, what `choose` parses."""
    return {"aggregator": Guard("choice", boxed_choices([str(i) for i in range(1, opts.num_generators + 1)]),
                                budget=200)}


def _aggregate_prompt(task: Task, responses: list[str], w: RoleWording) -> str:
    numbered = "\n\n".join(w.fill("response", i=i, text=text) for i, text in enumerate(responses, start=1))
    k = len(responses)
    return w.fill("user", problem=task.prompt, responses=numbered, k=k, choices=choices(k))


def choices(k: int) -> str:
    """The K answers the aggregator may give, as a sentence lists them:
    '\\boxed{1}, \\boxed{2} or \\boxed{3}'."""
    boxed = [f"\\boxed{{{i}}}" for i in range(1, k + 1)]
    return f"{', '.join(boxed[:-1])} or {boxed[-1]}" if k > 1 else boxed[0]


def candidate_order(task: Task, sample_index: int, k: int, shuffle: bool) -> list[int]:
    """The generators' indices in the order the aggregator reads them: 0..k-1, or with `shuffle` a permutation
    drawn from the task id and sample index (the same on a rerun, different across a task's samples)."""
    order = list(range(k))
    if shuffle:
        random.Random(derive_seed(0, "candidate_order", task.task_id, sample_index)).shuffle(order)
    return order


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
    w = wording(opts, NAME, family)
    gen, agg = w.role("generator"), w.role("aggregator")
    prompt = [*gen.opening(), user(asking(w, gen.fill("user", problem=task.prompt), family.instruction()))]
    generators = await ask_all(client, "generator", names, [prompt] * len(names))
    episode.turns.extend(generators)
    order = candidate_order(task, sample_index, len(generators), opts.shuffle_candidates)
    responses = [generators[i].text for i in order]
    agg_msgs = [*agg.opening(), user(_aggregate_prompt(task, responses, agg))]
    aggregator = await ask(client, "aggregator", "aggregator", 0, agg_msgs)
    episode.turns.append(aggregator)
    chosen = choose(aggregator.text, len(responses), episode)
    episode.score_info["choice"] = chosen
    if opts.shuffle_candidates:
        episode.score_info["shown"] = order
    set_final_answer(episode, family, generators[order[chosen - 1]])
    return episode
