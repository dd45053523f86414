"""The TaskFamily protocol: how a kind of task asks for, extracts and scores an answer; the optional
AsyncScoring protocol for families whose scoring is slow (the code family runs programs); and
`TaskFamilySpec`, what a family declares to the `data.task` registry (marl/tasks/__init__.py): its scorer,
its loader and its eval split."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from marl.types import Task

if TYPE_CHECKING:
    from marl.tasks.sandbox.limits import SandboxConfig


class TaskFamily(Protocol):
    """A kind of task (math, digit, ...). Workflows call it to phrase prompts and read answers."""

    name: str
    # The wording a prompt set gives the workflows' prompts for this family: its `math` or its `code` section
    # (marl/prompts/default.yaml).
    prompt_kind: str

    def instruction(self) -> str:
        """The answer-format instruction appended where a workflow expects an answer ('' for none)."""
        ...

    def extract_answer(self, text: str) -> str | None:
        """The final answer written in a model response, or None when it wrote none."""
        ...

    def score(self, task: Task, answer: str | None) -> float:
        """1.0 when `answer` matches the task's reference, else 0.0 (None scores 0.0)."""
        ...


@dataclass(frozen=True)
class Scored:
    """A reward plus what the scorer found out (JSON-ready; recorded on the Episode as score_info)."""

    reward: float
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class AsyncScoring(Protocol):
    """Families that score off the event loop. run_episode awaits `score_async` when a family has it,
    so one slow score does not hold up the other episodes' engine calls."""

    async def score_async(self, task: Task, answer: str | None) -> Scored: ...


@dataclass(frozen=True)
class FamilySettings:
    """The `data` keys a family is built from; each family reads the ones it needs."""

    answer_fallback: str = "none"  # data.answer_fallback (math)
    sandbox: SandboxConfig | None = None  # data.sandbox (code); None: the sandbox's defaults


def listing(spec: str) -> bool:
    """A loader's sources that list their tasks (none generated from a seed)."""
    return False


@dataclass(frozen=True)
class TaskFamilySpec:
    """A task family as `data.task` names it: a built-in's in marl/tasks/__init__.py, or a user module's
    `TASK_FAMILY`. The data sources `data.train` and `data.eval` name are the loader's to read."""

    build: Callable[[FamilySettings], TaskFamily]  # the scorer (and its prompt kind), from the data settings
    # (data.train or data.eval, size, seed) -> the tasks: `size` of them (None: every row of a listing
    # source), chosen with `seed`; ValueError naming the source for one it cannot read
    load: Callable[[str, int | None, int], list[Task]]
    eval: str  # its held-out split: the source a run evaluates on when data.eval is unset ("")
    # Whether a source generates its tasks from the seed (then a train draw may drop eval prompts, and every
    # "row" of it is not a thing: data.eval_full refuses it)
    generated: Callable[[str], bool] = listing

    def eval_source(self, spec: str) -> str:
        """data.eval as the run reads it: `spec`, or the family's own eval split when unset."""
        return spec or self.eval
