"""The workflows by name (the `marl.workflow` config key).

A workflow is a module with `ROLES`, `agents(opts)` and an async `run(task, client, family, opts,
sample_index) -> Episode`. To add one, write such a module and list it in WORKFLOWS.
"""

from __future__ import annotations

from typing import Protocol

from marl.tasks.base import TaskFamily
from marl.types import Episode, PolicyClient, Task
from marl.workflows import eval_opt, orch_workers, single_agent, voting
from marl.workflows.common import WorkflowOptions


class Workflow(Protocol):
    """What a workflow module provides (modules satisfy this structurally)."""

    ROLES: tuple[str, ...]

    def agents(self, opts: WorkflowOptions) -> list[str]: ...

    async def run(
        self, task: Task, client: PolicyClient, family: TaskFamily, opts: WorkflowOptions, sample_index: int
    ) -> Episode: ...


WORKFLOWS: dict[str, Workflow] = {
    "single_agent": single_agent,
    "eval_opt": eval_opt,
    "voting": voting,
    "orch_workers": orch_workers,
}


def get_workflow(name: str) -> Workflow:
    if name not in WORKFLOWS:
        raise ValueError(f"marl.workflow must be one of {sorted(WORKFLOWS)}, got {name!r}")
    return WORKFLOWS[name]


def roles_of(name: str) -> tuple[str, ...]:
    """The role names of workflow `name`, in the order its PolicyMap lists them."""
    return tuple(get_workflow(name).ROLES)


__all__ = ["WORKFLOWS", "Workflow", "WorkflowOptions", "get_workflow", "roles_of"]
