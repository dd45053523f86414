"""A workflow's turn shape: how many turns each role takes in one episode at the workflow's caps, and how many
run one after another. The planner sizes a step's rollout and each policy's update from it
(jobs/plan/planner.py); a workflow declares it as `turn_shape(opts)`, a function of its options."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from marl.workflows.options import WorkflowOptions


@dataclass(frozen=True)
class TurnShape:
    """One episode's turns at the caps (every round run, every parallel agent speaking)."""

    per_role: Mapping[str, int]  # role -> its turns in one episode
    sequential: int  # turns that run one after another (a batch of parallel turns counts once)

    def __post_init__(self) -> None:
        if not self.per_role or any(n < 0 for n in self.per_role.values()) or self.sequential < 1:
            raise ValueError(f"a turn shape needs roles with turns >= 0 and sequential >= 1; got {self}")
        if self.sequential > sum(self.per_role.values()):
            raise ValueError(f"{self.sequential} turns one after another, but {sum(self.per_role.values())} "
                             "turns in all")


def agents_shape(agents: list[str], role_of: Callable[[str], str]) -> TurnShape:
    """The shape of a workflow that declares none: each of its agents speaks once, one after another (the
    longest an episode of those agents can take without rounds)."""
    return TurnShape(dict(Counter(role_of(a) for a in agents)), len(agents))


__all__ = ["TurnShape", "WorkflowOptions", "agents_shape"]
