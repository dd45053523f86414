"""orch_workers: an `orchestrator` plans, one `worker` per strategy solves, a `synthesizer` answers.

The orchestrator is asked for 'STRATEGY k: ...' lines; a plan without them is read as a numbered list,
else one strategy per non-empty line (common.parse_plan), each fallback recorded as one parse failure of
'orchestrator'. More than `max_strategies` ends the episode with failure 'too_many_strategies'; a blank
plan ends it with 'unparsable_plan' (also a parse failure); either way no worker runs and the reward is 0.
Otherwise workers run in parallel, each solving the whole problem with its strategy, and the final answer
is extracted from the synthesizer's text.
"""

from __future__ import annotations

from marl.tasks.base import TaskFamily
from marl.types import Episode, PolicyClient, Task
from marl.workflows.common import (
    WorkflowOptions,
    ask,
    ask_all,
    parse_plan,
    set_final_answer,
    system,
    user,
    with_instruction,
)

NAME = "orch_workers"
ROLES: tuple[str, ...] = ("orchestrator", "worker", "synthesizer")

ORCHESTRATOR_SYSTEM = "You plan how to solve problems. You propose strategies; you do not solve."
WORKER_SYSTEM = "You are a careful problem solver. Follow the given strategy step by step."
SYNTHESIZER_SYSTEM = "You combine several candidate solutions into one correct final solution."


def agents(opts: WorkflowOptions) -> list[str]:
    """Every agent that may speak; fewer workers run when fewer strategies are proposed."""
    return ["orchestrator"] + [f"worker{i}" for i in range(opts.max_strategies)] + ["synthesizer"]


def _plan_prompt(task: Task, max_strategies: int) -> str:
    return (
        f"Problem:\n{task.prompt}\n\n"
        f"Propose 1 to {max_strategies} distinct strategies for solving this problem. "
        "Write each on its own line as 'STRATEGY 1: ...', 'STRATEGY 2: ...'. Do not solve the problem."
    )


def _worker_prompt(task: Task, strategy: str, instruction: str) -> str:
    return with_instruction(
        f"Problem:\n{task.prompt}\n\nSolve the whole problem using this strategy:\n{strategy}", instruction
    )


def _synthesis_prompt(task: Task, strategies: list[str], solutions: list[str], instruction: str) -> str:
    parts = [
        f"Solution {i} (strategy: {s}):\n{text}"
        for i, (s, text) in enumerate(zip(strategies, solutions, strict=True), start=1)
    ]
    body = "\n\n".join(parts)
    return with_instruction(
        f"Problem:\n{task.prompt}\n\n{body}\n\n"
        "Check these solutions against each other and write the final solution.",
        instruction,
    )


async def run(
    task: Task, client: PolicyClient, family: TaskFamily, opts: WorkflowOptions, sample_index: int
) -> Episode:
    episode = Episode(task=task, sample_index=sample_index, workflow=NAME)
    plan_msgs = [system(ORCHESTRATOR_SYSTEM), user(_plan_prompt(task, opts.max_strategies))]
    plan = await ask(client, "orchestrator", "orchestrator", 0, plan_msgs)
    episode.turns.append(plan)
    strategies, read_as = parse_plan(plan.text)
    if read_as != "strategy":
        episode.note_parse_failure("orchestrator")
    if not strategies:
        episode.failure = "unparsable_plan"
        return episode
    if len(strategies) > opts.max_strategies:
        episode.failure = "too_many_strategies"
        return episode
    instruction = family.instruction()
    names = [f"worker{i}" for i in range(len(strategies))]
    prompts = [[system(WORKER_SYSTEM), user(_worker_prompt(task, s, instruction))] for s in strategies]
    workers = await ask_all(client, "worker", names, prompts)
    episode.turns.extend(workers)
    solutions = [t.text for t in workers]
    synthesis = _synthesis_prompt(task, strategies, solutions, instruction)
    synth_msgs = [system(SYNTHESIZER_SYSTEM), user(synthesis)]
    synth = await ask(client, "synthesizer", "synthesizer", 0, synth_msgs)
    episode.turns.append(synth)
    set_final_answer(episode, family, synth)
    return episode
