"""parity: is a number even or odd (0 or 1)? A task family written outside the project, against `marl` alone.

Train on a file of numbers, one per line (this family's own data format):
    python -m jobs.train --config jobs/configs/tiny.yaml data.task=examples/parity.py data.train=numbers.txt \
        data.eval=random
A task family module declares `TASK_FAMILY`, a `TaskFamilySpec` (marl/tasks/base.py) of four parts:
- its scorer, `build(settings)`: a TaskFamily, which phrases the answer format (`instruction`), reads the
  answer from a response (`extract_answer`) and scores it (`score`, 1.0 or 0.0), and whose `prompt_kind` says
  which wording of the prompt set the workflows ask in (math here: the problem is short text with one answer);
- its loader, `load(spec, size, seed)`: the tasks `data.train` or `data.eval` names, here a numbers file or
  `random`, numbers drawn from the seed;
- its eval split, `eval`: what the run evaluates on when `data.eval` is unset, here `random` (the eval draw
  uses its own seed range, so it is held out from a `random` train set);
- `generated(spec)`: which of its sources generate tasks from a seed rather than list them.
`data.task` takes the module's file path or dotted path; config load imports it and checks `TASK_FAMILY`.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

from marl.tasks.base import FamilySettings, TaskFamilySpec
from marl.tasks.rows import seeded_cut
from marl.types import Task

RANDOM = "random"  # the generated source: numbers drawn from the seed
_DIGIT = re.compile(r"[0-9]")


class ParityFamily:
    """The answer is the first ASCII digit of a response (as the digit family reads it, so that even a tiny
    model's random text sometimes scores); it scores 1.0 when it is the number's remainder mod 2."""

    name = "parity"
    prompt_kind = "math"

    def instruction(self) -> str:
        return "Answer 0 if it is even, 1 if it is odd."

    def extract_answer(self, text: str) -> str | None:
        found = _DIGIT.search(text)
        return found.group(0) if found else None

    def score(self, task: Task, answer: str | None) -> float:
        return 1.0 if answer == task.answer else 0.0


def task(number: int, source: str, index: int) -> Task:
    return Task(task_id=f"parity:{source}:{index}", prompt=f"Is {number} even or odd?",
                answer=str(number % 2), kind="parity")


def load(spec: str, size: int | None, seed: int) -> list[Task]:
    """`random`: `size` numbers below a million drawn from `seed`. Else a file of numbers, one per line: every
    line, or `size` of them chosen by a `seed`-shuffle. ValueError naming the file and line for a bad one."""
    if spec == RANDOM:
        if not size:
            raise ValueError(f"data source {RANDOM} generates tasks and needs a size > 0")
        rng = random.Random(seed)
        return [task(rng.randrange(1_000_000), f"{RANDOM}:{seed}", i) for i in range(size)]
    path = Path(spec)
    if not path.is_file():
        raise ValueError(f"data source {spec!r} is neither {RANDOM!r} nor a file of numbers")
    tasks = []
    for i, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip().isdigit():
            raise ValueError(f"{spec}:{i}: {line!r} is not a whole number")
        tasks.append(task(int(line), path.stem, i))
    return seeded_cut(tasks, size, seed)


def build(settings: FamilySettings) -> ParityFamily:
    return ParityFamily()  # reads no `data` setting


TASK_FAMILY = TaskFamilySpec(build=build, load=load, eval=RANDOM, generated=lambda spec: spec == RANDOM)
