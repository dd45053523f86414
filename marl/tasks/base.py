"""The TaskFamily protocol: how a kind of task asks for, extracts and scores an answer."""

from __future__ import annotations

from typing import Protocol

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
