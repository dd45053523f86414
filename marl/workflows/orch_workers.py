"""orch_workers: an `orchestrator` plans, one `worker` per strategy solves, a `synthesizer` answers.

The orchestrator is asked for 'STRATEGY k: ...' lines; a plan without them is read as a numbered list, else
one strategy per non-empty line (common.parse_plan), each fallback recorded as one parse failure of
'orchestrator'. More than `max_strategies` ends the episode with failure 'too_many_strategies'; a blank plan
ends it with 'unparsable_plan' (also a parse failure); either way no worker runs and the reward is 0.
Otherwise workers run in parallel, each solving the whole problem with its strategy, and the final answer is
extracted from the synthesizer's text. The wording comes from the prompt set `marl.prompts` names
(marl/prompts/; PROMPT_SPEC below): under `paper` the synthesizer judges the solutions, agreement among them a
sign of confidence, and on code tasks the workers are competitive programmers answering in a code block and
the synthesizer writes one complete runnable program.
"""

from __future__ import annotations

from marl.guards import Guard
from marl.prompts import RoleWording
from marl.tasks.base import TaskFamily
from marl.types import Episode, PolicyClient, Task
from marl.workflows.common import (
    WorkflowOptions,
    ask,
    ask_all,
    asking,
    parse_plan,
    set_final_answer,
    user,
    wording,
)
from marl.workflows.turns import TurnShape

NAME = "orch_workers"
ROLES: tuple[str, ...] = ("orchestrator", "worker", "synthesizer")

# The wording each prompt set gives: role -> template -> the placeholders it may use (see voting.PROMPT_SPEC).
# solutions: the workers' solutions, each rendered by `solution` and separated by blank lines.
PROMPT_SPEC: dict[str, dict[str, tuple[str, ...]]] = {
    "orchestrator": {"user": ("problem", "max_strategies")},
    "worker": {"user": ("problem", "strategy")},
    "synthesizer": {"user": ("problem", "solutions"), "solution": ("i", "strategy", "text")},
}


def agents(opts: WorkflowOptions) -> list[str]:
    """Every agent that may speak; fewer workers run when fewer strategies are proposed."""
    return ["orchestrator"] + [f"worker{i}" for i in range(opts.max_strategies)] + ["synthesizer"]


def turn_shape(opts: WorkflowOptions) -> TurnShape:
    """The orchestrator, then a worker per strategy (at most max_strategies) at once, then the synthesizer."""
    return TurnShape({"orchestrator": 1, "worker": opts.max_strategies, "synthesizer": 1}, 3)


# A strategy line of the orchestrator's guard: at most this many characters, its first one neither a space nor
# the markdown emphasis the plan parser skips (so no line reads as a strategy with no text).
STRATEGY_CHARS = 64


def plan_grammar(max_strategies: int) -> str:
    """EBNF of a plan of 1..max_strategies lines 'STRATEGY k: <text>', what parse_plan reads as 'strategy'."""
    nested = ""
    for k in range(max_strategies, 1, -1):
        nested = f' ("\\nSTRATEGY {k}: " line{nested})?'
    return (f'root ::= "STRATEGY 1: " line{nested}\n'
            f'line ::= first [ -~]{{0,{STRATEGY_CHARS - 1}}}\n'
            'first ::= [!-)] | [+-^] | [`-~]')


def guards(opts: WorkflowOptions) -> dict[str, Guard]:
    """The built-in guards (marl.guards.orchestrator: builtin): the orchestrator writes its plan alone, 1 to
    max_strategies 'STRATEGY k:' lines of at most STRATEGY_CHARS characters each, so no plan is unparsable
    or too long."""
    longest = sum(len(f"STRATEGY {k}: ") + STRATEGY_CHARS + 1 for k in range(1, opts.max_strategies + 1))
    return {"orchestrator": Guard("ebnf", plan_grammar(opts.max_strategies), 0, format_chars=longest)}


def _synthesis_prompt(task: Task, strategies: list[str], solutions: list[str], w: RoleWording) -> str:
    parts = [w.fill("solution", i=i, strategy=s, text=text)
             for i, (s, text) in enumerate(zip(strategies, solutions, strict=True), start=1)]
    return w.fill("user", problem=task.prompt, solutions="\n\n".join(parts))


async def _strategies(episode: Episode, client: PolicyClient, orch: RoleWording,
                      opts: WorkflowOptions) -> list[str]:
    """The orchestrator's turn and the strategies it proposes, with how its plan was read, in `episode`;
    none when the episode ends there (its failure set: no plan read, or more strategies than allowed)."""
    ask_plan = orch.fill("user", problem=episode.task.prompt, max_strategies=opts.max_strategies)
    plan = await ask(client, "orchestrator", "orchestrator", 0, [*orch.opening(), user(ask_plan)])
    episode.turns.append(plan)
    strategies, read_as = parse_plan(plan.text)
    episode.score_info["plan_format"] = read_as  # strategy | numbered | lines | none: how the parser read it
    if read_as != "strategy":
        episode.note_parse_failure("orchestrator")
    if not strategies:
        episode.failure = "unparsable_plan"
    elif len(strategies) > opts.max_strategies:
        episode.failure = "too_many_strategies"
    return strategies if not episode.failure else []


async def run(
    task: Task, client: PolicyClient, family: TaskFamily, opts: WorkflowOptions, sample_index: int
) -> Episode:
    episode = Episode(task=task, sample_index=sample_index, workflow=NAME)
    w = wording(opts, NAME, family)
    orch, worker, synth = (w.role(r) for r in ROLES)
    strategies = await _strategies(episode, client, orch, opts)
    if not strategies:
        return episode
    instruction = family.instruction()
    names = [f"worker{i}" for i in range(len(strategies))]
    asks = (asking(w, worker.fill("user", problem=task.prompt, strategy=s), instruction) for s in strategies)
    prompts = [[*worker.opening(), user(text)] for text in asks]
    workers = await ask_all(client, "worker", names, prompts)
    episode.turns.extend(workers)
    solutions = [t.text for t in workers]
    synthesis = asking(w, _synthesis_prompt(task, strategies, solutions, synth), instruction)
    final = await ask(client, "synthesizer", "synthesizer", 0, [*synth.opening(), user(synthesis)])
    episode.turns.append(final)
    set_final_answer(episode, family, final)
    return episode
