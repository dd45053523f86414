"""The TaskFamily protocol: how a kind of task asks for, extracts and scores an answer; and the optional
AsyncScoring protocol for families whose scoring is slow (the code family runs programs)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from marl.types import Task


class TaskFamily(Protocol):
    """A kind of task (math, digit, ...). Workflows call it to phrase prompts and read answers."""

    name: str

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
