"""The code family: the answer is the last ```python block of a response, scored by running the task's
tests in the sandbox (marl.tasks.sandbox): 1.0 only if every test passes.

Task contract (kind 'code'; built by marl.tasks.code_data):
- prompt: the problem as the model sees it (stdin/stdout problems say how to read input);
- answer: a reference solution when the source has one (HumanEval: prompt + canonical solution), else "".
  Scoring never reads it; tests use it to prove a task's tests can be passed;
- meta['style'] == 'functional': meta['test'] defines check(candidate), meta['entry_point'] names the
  function, optional meta['prefix'] runs before the answer (HumanEval's prompt, so its imports and helper
  functions exist even when the answer repeats only the target function);
- meta['style'] == 'stdio': meta['cases'] = [{'input': str, 'output': str}, ...]; outputs compare after
  stripping surrounding blank lines and trailing spaces per line.

Extraction rules (`code_blocks`, `last_python_block`):
- a block opens with a line of ``` plus an optional language tag (leading spaces allowed) and closes with a
  line of only backticks; its text is dedented. Unclosed blocks (truncated responses), one-line ```x```
  spans and blocks of only whitespace do not count;
- the answer is the last block tagged python / py / python3 (any case); when there is none, the last
  untagged block; blocks tagged with another language are ignored;
- no such block: None, scored 0 with reason 'no_code_block'.
"""

from __future__ import annotations

import asyncio
import re
import textwrap
import threading
from concurrent.futures import Future
from typing import Any

from marl.tasks.base import Scored
from marl.tasks.sandbox import Program, SandboxLimits, SandboxPool, SandboxResult
from marl.tasks.sandbox.limits import SandboxConfig, limits_of
from marl.types import Task

INSTRUCTION = "Write your solution as one complete Python program in a single ```python code block."
PYTHON_TAGS = ("python", "py", "python3")
NO_CODE_BLOCK = "no_code_block"
_OPEN = re.compile(r"\s*```\s*([A-Za-z0-9_+.#-]*)[^`]*")
_CLOSE = re.compile(r"\s*```+\s*")


def code_blocks(text: str) -> list[tuple[str, str]]:
    """Every closed fenced block as (lower-case tag, dedented code), in order."""
    blocks: list[tuple[str, str]] = []
    tag: str | None = None
    body: list[str] = []
    for line in text.splitlines():
        if tag is None:
            match = _OPEN.fullmatch(line)
            if match:
                tag, body = match.group(1).lower(), []
        elif _CLOSE.fullmatch(line):
            blocks.append((tag, textwrap.dedent("\n".join(body)).strip("\n") + "\n"))
            tag = None
        else:
            body.append(line)
    return [(t, code) for t, code in blocks if code.strip()]


def last_python_block(text: str) -> str | None:
    """The answer under the rules in the module docstring."""
    blocks = code_blocks(text)
    tagged = [code for tag, code in blocks if tag in PYTHON_TAGS]
    bare = [code for tag, code in blocks if not tag]
    found = tagged or bare
    return found[-1] if found else None


def program_for(task: Task, code: str) -> Program:
    """The sandbox Program testing `code` against `task`'s tests; ValueError when the task has none."""
    meta, style = task.meta, task.meta.get("style")
    if style == "functional":
        return Program(code=code, test=meta["test"], entry_point=meta["entry_point"],
                       prefix=meta.get("prefix", ""))
    if style == "stdio":
        cases = meta["cases"]
        return Program(code=code, style="stdio", inputs=tuple(c["input"] for c in cases),
                       outputs=tuple(c["output"] for c in cases))
    raise ValueError(
        f"code task {task.task_id!r} has no tests: meta['style'] must be 'functional' or 'stdio'"
    )


def _scored(result: SandboxResult) -> Scored:
    return Scored(1.0 if result.passed else 0.0, result.info())


class CodeFamily:
    """Scoring runs on a shared SandboxPool of `workers` concurrent executions; `score_async` awaits the
    pool without blocking the event loop, `score` blocks its caller. The first execution is a self-check
    that raises when the sandbox cannot work on this machine."""

    name = "code"
    prompt_kind = "code"

    def __init__(self, limits: SandboxLimits | None = None, workers: int = 0):
        self.pool = SandboxPool(limits, workers)
        self._checked = False
        self._check_lock = threading.Lock()

    @classmethod
    def from_config(cls, sandbox: SandboxConfig | None = None) -> CodeFamily:
        """From the `data.sandbox` config section (workers and the limits it sets); None: the defaults."""
        return cls(limits_of(sandbox), sandbox.workers) if sandbox is not None else cls()

    def instruction(self) -> str:
        return INSTRUCTION

    def extract_answer(self, text: str) -> str | None:
        return last_python_block(text)

    def score(self, task: Task, answer: str | None) -> float:
        return self.score_detail(task, answer).reward

    def score_detail(self, task: Task, answer: str | None) -> Scored:
        if answer is None:
            return Scored(0.0, {"reason": NO_CODE_BLOCK})
        return _scored(self._submit(task, answer).result())

    async def score_async(self, task: Task, answer: str | None) -> Scored:
        if answer is None:
            return Scored(0.0, {"reason": NO_CODE_BLOCK})
        return _scored(await asyncio.wrap_future(self._submit(task, answer)))

    def close(self) -> None:
        self.pool.close()

    def _submit(self, task: Task, answer: str) -> Future[SandboxResult]:
        program = program_for(task, answer)
        with self._check_lock:
            if not self._checked:
                self.pool.self_check()
                self._checked = True
        return self.pool.submit(program)

    def __getstate__(self) -> dict[str, object]:
        return {"pool": self.pool, "checked": self._checked}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.pool = state["pool"]
        self._checked = state["checked"]
        self._check_lock = threading.Lock()
