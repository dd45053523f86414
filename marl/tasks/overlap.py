"""Held-out checks on task lists: the normalised prompt text two lists are compared by, the eval tasks a
training set also holds, and a training set with given prompts removed.

Prompts are compared after lowercasing, collapsing every whitespace run to one space and stripping, so a
problem copied with other line breaks or capitals still counts as the same problem.
"""

from __future__ import annotations

from collections.abc import Iterable

from marl.types import Task


def normalise_prompt(text: str) -> str:
    """'What  is\\n1+1? ' → 'what is 1+1?' (lowercase, whitespace runs → one space, stripped)."""
    return " ".join(text.lower().split())


def prompt_set(tasks: Iterable[Task]) -> set[str]:
    """The normalised prompts of `tasks` (duplicates collapse)."""
    return {normalise_prompt(t.prompt) for t in tasks}


def shared_tasks(train: Iterable[Task], eval_tasks: Iterable[Task]) -> list[Task]:
    """The eval tasks whose normalised prompt is also a train prompt, in eval order."""
    seen = prompt_set(train)
    return [t for t in eval_tasks if normalise_prompt(t.prompt) in seen]


def without_prompts(tasks: Iterable[Task], prompts: set[str]) -> list[Task]:
    """`tasks` minus those whose normalised prompt is in `prompts` (normalised), order kept."""
    return [t for t in tasks if normalise_prompt(t.prompt) not in prompts]
