"""The data contract between workflows, rollout and learners: Task, Completion, Turn, Episode.

A workflow produces an Episode from a Task by calling a PolicyClient once per turn. The client
returns a Completion (text plus the exact token ids and per-token logprobs the engine sampled);
the workflow wraps it into a Turn that records which role and which agent instance spoke.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

Message = dict[str, str]  # {"role": "system"|"user"|"assistant", "content": str}
# A JSON-like record: string keys, values JSON (or YAML) can hold; what files, summaries and library settings
# (tokenizer, vLLM, DeepSpeed, Grafana) are read or written as. Typed no further: its keys vary by producer.
JsonRecord = dict[str, Any]


@dataclass(frozen=True)
class Task:
    """One problem: the text shown to the workflow and the reference the task scores against."""

    task_id: str
    prompt: str
    answer: str
    kind: str = "math"
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Completion:
    """What an engine returns for one request. len(response_ids) == len(logprobs)."""

    text: str
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    finish_reason: str = "stop"  # "stop" | "length"
    version: int = 0  # weight version of the engine that produced it
    policy_id: str = ""


@dataclass
class Turn:
    """One call of one agent: `role` routes to a policy, `agent` names the instance (generator0)."""

    role: str
    agent: str
    round: int
    messages: list[Message]
    completion: Completion
    reward: float = 0.0  # filled by marl.rewards.assign

    @property
    def text(self) -> str:
        return self.completion.text


@dataclass
class Episode:
    """One run of a workflow on one task sample."""

    task: Task
    sample_index: int
    workflow: str
    turns: list[Turn] = field(default_factory=list)
    final_answer: str | None = None
    reward: float = 0.0
    # Why the episode ended without a scorable answer ("too_many_strategies", ...), or None.
    failure: str | None = None
    # Per-role counts of outputs the workflow could not parse and had to fall back on.
    parse_failures: dict[str, int] = field(default_factory=dict)
    # How the final answer was produced and scored (JSON-ready): 'answer_role' (the role whose turn it was
    # extracted from, set by the workflow) and what the family's scorer reported (code: 'reason', times).
    score_info: dict[str, Any] = field(default_factory=dict)

    def note_parse_failure(self, role: str) -> None:
        self.parse_failures[role] = self.parse_failures.get(role, 0) + 1


class PolicyClient(Protocol):
    """What a workflow talks to: one chat completion for one agent of one role."""

    async def complete(self, role: str, agent: str, messages: list[Message]) -> Completion: ...
