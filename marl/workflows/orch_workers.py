"""orch_workers: an `orchestrator` plans, one `worker` per strategy solves, a `synthesizer` answers.

The orchestrator is asked for 'STRATEGY k: ...' lines; a plan without them is read as a numbered list,
else one strategy per non-empty line (common.parse_plan), each fallback recorded as one parse failure of
'orchestrator'. More than `max_strategies` ends the episode with failure 'too_many_strategies'; a blank
plan ends it with 'unparsable_plan' (also a parse failure); either way no worker runs and the reward is 0.
Otherwise workers run in parallel, each solving the whole problem with its strategy, and the final answer
is extracted from the synthesizer's text. The wording comes from `marl.prompts` (WORDINGS): under `paper` the
synthesizer judges the solutions, agreement among them a sign of confidence, and on code tasks the workers are
competitive programmers answering in a code block and the synthesizer writes one complete runnable program.
"""

from __future__ import annotations

from dataclasses import dataclass

from marl.tasks.base import TaskFamily
from marl.types import Episode, PolicyClient, Task
from marl.workflows.common import (
    WorkflowOptions,
    ask,
    ask_all,
    parse_plan,
    prompt_kind,
    set_final_answer,
    system,
    user,
    with_instruction,
)

NAME = "orch_workers"
ROLES: tuple[str, ...] = ("orchestrator", "worker", "synthesizer")



@dataclass(frozen=True)
class Wording:
    """One wording of orch_workers: the three system prompts and the synthesizer's closing request."""

    orchestrator: str
    worker: str
    synthesizer: str
    synthesis: str  # ends the synthesizer's prompt, before the family's answer-format instruction


DEFAULT = Wording(
    orchestrator="You plan how to solve problems. You propose strategies; you do not solve.",
    worker="You are a careful problem solver. Follow the given strategy step by step.",
    synthesizer="You combine several candidate solutions into one correct final solution.",
    synthesis="Check these solutions against each other and write the final solution.",
)
PAPER_MATH = Wording(
    orchestrator=DEFAULT.orchestrator,
    worker=DEFAULT.worker,
    synthesizer="You are a judge of candidate solutions to a problem; you decide the final answer.",
    synthesis=("Compare these solutions: check each one's reasoning, and take agreement between solutions as a "
               "sign of confidence. Then write the final answer."),
)
PAPER_CODE = Wording(
    orchestrator="You plan how to solve programming problems. You propose strategies; you do not write code.",
    worker=("You are an expert competitive programmer. Follow the given strategy and write a complete, correct "
            "program."),
    synthesizer="You are a judge of candidate programs for a programming problem; you write the final program.",
    synthesis=("Compare these programs: check each one's logic and edge cases, and take agreement between them as a "
               "sign of confidence. Then write one complete, runnable Python program that solves the problem."),
)
# (marl.prompts, task kind) -> wording; the default set has one wording for every task.
WORDINGS: dict[tuple[str, str], Wording] = {
    ("default", "math"): DEFAULT, ("default", "code"): DEFAULT,
    ("paper", "math"): PAPER_MATH, ("paper", "code"): PAPER_CODE,
}


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


def _synthesis_prompt(
    task: Task, strategies: list[str], solutions: list[str], request: str, instruction: str
) -> str:
    parts = [
        f"Solution {i} (strategy: {s}):\n{text}"
        for i, (s, text) in enumerate(zip(strategies, solutions, strict=True), start=1)
    ]
    body = "\n\n".join(parts)
    return with_instruction(f"Problem:\n{task.prompt}\n\n{body}\n\n{request}", instruction)


async def run(
    task: Task, client: PolicyClient, family: TaskFamily, opts: WorkflowOptions, sample_index: int
) -> Episode:
    episode = Episode(task=task, sample_index=sample_index, workflow=NAME)
    w = WORDINGS[(opts.prompts, prompt_kind(family))]
    plan_msgs = [system(w.orchestrator), user(_plan_prompt(task, opts.max_strategies))]
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
    prompts = [[system(w.worker), user(_worker_prompt(task, s, instruction))] for s in strategies]
    workers = await ask_all(client, "worker", names, prompts)
    episode.turns.extend(workers)
    solutions = [t.text for t in workers]
    synthesis = _synthesis_prompt(task, strategies, solutions, w.synthesis, instruction)
    synth_msgs = [system(w.synthesizer), user(synthesis)]
    synth = await ask(client, "synthesizer", "synthesizer", 0, synth_msgs)
    episode.turns.append(synth)
    set_final_answer(episode, family, synth)
    return episode
