"""The prompt-set types: a role's wording, a workflow's wording for one task kind, a resolved set."""

from __future__ import annotations

from dataclasses import dataclass, field

from marl.types import Message


class PromptSetError(ValueError):
    """A prompt set that cannot be used: the message names the file, the workflow and role, and the
    problem."""


@dataclass(frozen=True)
class RoleWording:
    """One role's wording: its system message ('' = none), named templates and worked examples."""

    system: str
    templates: dict[str, str]
    examples: tuple[tuple[str, str], ...] = ()  # (user, assistant) turns

    def opening(self) -> list[Message]:
        """The messages before the role's first real turn: the system message, then each worked example."""
        head: list[Message] = [{"role": "system", "content": self.system}] if self.system else []
        for asked, answered in self.examples:
            head += [{"role": "user", "content": asked}, {"role": "assistant", "content": answered}]
        return head

    def fill(self, template: str, **values: object) -> str:
        """The named template with its placeholders filled."""
        return self.templates[template].format(**values)


@dataclass(frozen=True)
class WorkflowWording:
    """One workflow's wording for one task kind."""

    roles: dict[str, RoleWording]
    settings: dict[str, str] = field(default_factory=dict)
    append_instruction: bool = True  # append the family's answer-format instruction where an answer is asked
    key: str = field(default="", compare=False)  # the file's kind key it was read from (math, code, any)

    def role(self, name: str) -> RoleWording:
        return self.roles[name]


@dataclass(frozen=True)
class PromptSet:
    """A resolved prompt set: workflow -> kind (math, code) -> wording; `digest` identifies its resolved
    content."""

    name: str  # as `marl.prompts` gave it
    path: str  # the file read
    workflows: dict[str, dict[str, WorkflowWording]]
    digest: str

    def wording(self, workflow: str, kind: str) -> WorkflowWording:
        if workflow not in self.workflows:
            raise PromptSetError(f"{self.path}: has no wording for workflow {workflow!r} (it has "
                                 f"{', '.join(self.workflows) or 'none'})")
        return self.workflows[workflow][kind]
