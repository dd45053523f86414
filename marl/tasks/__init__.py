"""Task families by name (the `data.task` config key, an open registry: marl/registry.py) and the data
sources that produce Tasks.

A family is a `TaskFamilySpec` (marl/tasks/base.py): its scorer, its loader, its eval split. The built-ins
are below; a user's family is one module declaring its spec as `TASK_FAMILY`, named by its path in
`data.task` (`data.task=examples/parity.py`), as a workflow is (examples/parity.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from marl.registry import Registry
from marl.tasks.base import AsyncScoring, FamilySettings, Scored, TaskFamily, TaskFamilySpec
from marl.tasks.code import CodeFamily
from marl.tasks.data import is_generated, load_tasks
from marl.tasks.digit import DigitFamily
from marl.tasks.math import MathFamily
from marl.tasks.sandbox.limits import SandboxConfig


def _builtin(build: Callable[[FamilySettings], TaskFamily], kind: str, eval_split: str) -> TaskFamilySpec:
    """A built-in family: its scorer, and marl.tasks.data's sources, files read as rows of `kind`."""
    return TaskFamilySpec(build, functools.partial(load_tasks, kind=kind), eval_split, is_generated)


TASKS: Registry[TaskFamilySpec] = Registry("data.task", {
    "math": _builtin(lambda s: MathFamily(s.answer_fallback), "math", "gsm8k"),
    "digit": _builtin(lambda s: DigitFamily(), "digit", "digit"),
    "code": _builtin(lambda s: CodeFamily.from_config(s.sandbox), "code", "humaneval"),
}, declares="TASK_FAMILY", declared=TaskFamilySpec)


def get_family(name: str, answer_fallback: str = "none", sandbox: SandboxConfig | None = None) -> TaskFamily:
    """A fresh TaskFamily for `name` (a built-in's name or a module path); an unknown one raises ValueError
    listing the choices. `answer_fallback` applies to the math family only, `sandbox` (the `data.sandbox`
    section: workers and limits) to the code family only."""
    return TASKS[name].build(FamilySettings(answer_fallback, sandbox))


__all__ = ["TASKS", "AsyncScoring", "CodeFamily", "DigitFamily", "FamilySettings", "MathFamily", "Scored",
           "TaskFamily", "TaskFamilySpec", "get_family"]
