"""The workflows by name (the `marl.workflow` config key).

A workflow is a module with `ROLES`, `agents(opts)` and an async `run(task, client, family, opts,
sample_index) -> Episode`, and optionally `SLOT_ROLES` (see `slot_roles`). To add one, write such a module
and list it in WORKFLOWS.
"""

from __future__ import annotations

from typing import Protocol

from marl.tasks.base import TaskFamily
from marl.types import Episode, PolicyClient, Task
from marl.workflows import eval_opt, orch_workers, single_agent, voting
from marl.workflows.common import PROMPT_SETS, WorkflowOptions


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


def slot_roles(name: str) -> tuple[str, ...]:
    """Roles of workflow `name` whose numbered instances are separate slots rather than one pool: each instance
    answers in its own position (voting's generator0..K-1), so the paper's GRPO grouping gives each instance
    its own group. Listed in the module's optional `SLOT_ROLES`; none by default."""
    return tuple(getattr(get_workflow(name), "SLOT_ROLES", ()))


__all__ = ["PROMPT_SETS", "WORKFLOWS", "Workflow", "WorkflowOptions", "get_workflow", "roles_of", "slot_roles"]
