"""A prompt set checked against the workflows it names: each kind's roles are the workflow's, each role has
the templates the workflow fills, each template uses only the placeholders the workflow gives it, and formats.

A workflow's needs are its module's PROMPT_SPEC: role -> template -> the placeholders it may use.
"""

from __future__ import annotations

from collections.abc import Mapping

from marl.prompts import PromptSet, PromptSetError, WorkflowWording, placeholders

PromptSpec = Mapping[str, Mapping[str, tuple[str, ...]]]
SETTINGS: dict[str, dict[str, tuple[str, ...]]] = {"eval_opt": {"history": ("separate", "shared")}}


def check_set(prompt_set: PromptSet, specs: Mapping[str, PromptSpec]) -> None:
    """Every workflow of `prompt_set` that `specs` knows, checked; raises PromptSetError naming the file,
    workflow.kind.role[.template] and the problem."""
    for workflow, kinds in prompt_set.workflows.items():
        if workflow in specs:
            for kind, wording in kinds.items():
                where = f"{prompt_set.path}: {workflow}.{wording.key or kind}"
                check_wording(wording, specs[workflow], where)
            _check_settings(workflow, next(iter(kinds.values())), prompt_set.path)


def check_wording(wording: WorkflowWording, spec: PromptSpec, where: str) -> None:
    """One kind's wording against the workflow's PROMPT_SPEC: roles, then each role's templates."""
    for role in wording.roles:
        if role not in spec:
            raise PromptSetError(f"{where}.{role}: the workflow has no role {role!r} (its roles: "
                                 f"{', '.join(spec)})")
    missing = [r for r in spec if r not in wording.roles]
    if missing:
        raise PromptSetError(f"{where}: missing role {missing[0]!r} (the workflow's roles: "
                             f"{', '.join(spec)})")
    for role, entry in wording.roles.items():
        names = ", ".join(spec[role])
        extra = sorted(set(entry.templates) - set(spec[role]))
        if extra:
            raise PromptSetError(f"{where}.{role}: unknown template {extra[0]!r} (the role's templates: "
                                 f"{names}; besides them only `system` and `examples`)")
        for name, allowed in spec[role].items():
            if name not in entry.templates:
                raise PromptSetError(f"{where}.{role}: missing template {name!r} (the role's templates: "
                                     f"{names})")
            _check_template(entry.templates[name], allowed, f"{where}.{role}.{name}")


def _check_template(template: str, allowed: tuple[str, ...], where: str) -> None:
    unknown = sorted(placeholders(template, where) - set(allowed))
    if unknown:
        may = ", ".join("{" + a + "}" for a in allowed) or "none"
        raise PromptSetError(f"{where}: unknown placeholder {{{unknown[0]}}} (this template may use {may}; "
                             "write a literal brace doubled)")
    try:
        template.format(**{a: "x" for a in allowed})
    except (ValueError, TypeError, KeyError, IndexError) as e:
        raise PromptSetError(f"{where}: does not format: {type(e).__name__}: {e}") from None


def _check_settings(workflow: str, wording: WorkflowWording, path: str) -> None:
    known = SETTINGS.get(workflow, {})
    for key, value in wording.settings.items():
        if key not in known:
            raise PromptSetError(f"{path}: {workflow}.settings.{key}: no such setting "
                                 f"({', '.join(known) or f'{workflow} has none'})")
        if value not in known[key]:
            raise PromptSetError(f"{path}: {workflow}.settings.{key} must be one of {', '.join(known[key])}, "
                                 f"got {value!r}")
