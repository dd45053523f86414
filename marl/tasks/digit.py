"""The digit family: a trivially learnable synthetic task for tests and smoke runs.

Prompts look like 'Write the digit 7.' and the reference is '7'. Tiny models see short prompts,
so the family adds no answer-format instruction.
"""

from __future__ import annotations

from marl.types import Task


class DigitFamily:
    """Answer rule: the first ASCII digit anywhere in the response (None if there is none).

    Taking the first digit anywhere (rather than only a leading one) gives a random-init model a few
    percent chance of reward per sample, so the task is learnable from scratch in a bounded number of steps.
    """

    name = "digit"
    prompt_kind = "math"  # the math wording, with no instruction

    def instruction(self) -> str:
        return ""

    def extract_answer(self, text: str) -> str | None:
        # isdecimal() alone would accept other scripts' digits; the reference is ASCII.
        return next((c for c in text if c in "0123456789"), None)

    def score(self, task: Task, answer: str | None) -> float:
        return 1.0 if answer is not None and answer == task.answer.strip() else 0.0
