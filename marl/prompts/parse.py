"""Reading a prompt-set file into its types, checking its structure (the workflows' own checks are in
marl.workflows.prompt_check): every error names the file, the workflow.kind.role and the problem."""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

import yaml

from marl.prompts.model import PromptSetError, RoleWording, WorkflowWording
from marl.types import JsonRecord

KINDS: tuple[str, ...] = ("math", "code")
_KIND_KEYS = (*KINDS, "any")


def read_file(path: Path) -> JsonRecord:
    """The file's mapping: YAML, or a `.json` prompt file in the layout of the paper's released ones
    (imported)."""
    try:
        text = path.read_text()
    except OSError as e:
        raise PromptSetError(f"{path}: cannot be read: {e.strerror}") from None
    try:
        raw = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:
        kind = "JSON" if path.suffix == ".json" else "YAML"
        raise PromptSetError(f"{path}: is not valid {kind}: {e}") from None
    if path.suffix == ".json" and isinstance(raw, dict) and "workflows" not in raw:
        from marl.prompts.authors import import_authors_prompts

        raw = import_authors_prompts(raw, str(path))
    if not isinstance(raw, dict):
        raise PromptSetError(f"{path}: must be a mapping with a `workflows` key")
    return raw


def parse_set(raw: dict[str, Any], where: str) -> dict[str, dict[str, WorkflowWording]]:
    """workflow -> kind (math, code) -> its wording, `any` filling a kind the file leaves out."""
    unknown = set(raw) - {"workflows", "append_instruction"}
    if unknown or not isinstance(raw.get("workflows"), dict) or not raw["workflows"]:
        raise PromptSetError(f"{where}: must hold a non-empty `workflows` mapping (and optionally "
                             f"append_instruction){f'; unknown keys {sorted(unknown)}' if unknown else ''}")
    append = raw.get("append_instruction", True)
    if not isinstance(append, bool):
        raise PromptSetError(f"{where}: append_instruction must be true or false, got {append!r}")
    return {name: _workflow(body, f"{where}: {name}", append) for name, body in raw["workflows"].items()}


def _workflow(body: Any, where: str, append: bool) -> dict[str, WorkflowWording]:
    if not isinstance(body, dict):
        raise PromptSetError(f"{where}: must map task kinds (math, code, any) to roles")
    unknown = set(body) - {*_KIND_KEYS, "settings"}
    if unknown:
        raise PromptSetError(f"{where}: unknown keys {sorted(unknown)} (task kinds are math, code, any; "
                             f"`settings` holds the workflow's options)")
    settings = body.get("settings", {})
    if not isinstance(settings, dict) or not all(isinstance(v, str) for v in settings.values()):
        raise PromptSetError(f"{where}.settings: must map option names to strings")
    kinds: dict[str, WorkflowWording] = {}
    for kind in KINDS:
        key = kind if kind in body else "any"
        if key not in body:
            raise PromptSetError(f"{where}: has no wording for {kind} tasks (give `{kind}` or `any`)")
        roles = body[key]
        if not isinstance(roles, dict) or not roles:
            raise PromptSetError(f"{where}.{key}: must map role names to their wording")
        kinds[kind] = WorkflowWording(roles={r: _role(e, f"{where}.{key}.{r}") for r, e in roles.items()},
                                      settings=dict(settings), append_instruction=append, key=key)
    return kinds


def _role(entry: Any, where: str) -> RoleWording:
    if not isinstance(entry, dict):
        raise PromptSetError(f"{where}: must map `system`, templates and `examples` to text")
    system = entry.get("system")
    if not isinstance(system, str):
        raise PromptSetError(f"{where}: needs a `system` message (text; '' sends none)")
    templates = {k: v for k, v in entry.items() if k not in ("system", "examples")}
    for name, text in templates.items():
        if not isinstance(text, str):
            raise PromptSetError(f"{where}.{name}: a template must be text, got {type(text).__name__}")
        placeholders(text, f"{where}.{name}")
    examples = _examples(entry.get("examples", []), where)
    return RoleWording(system=system, templates=templates, examples=examples)


def _examples(items: Any, where: str) -> tuple[tuple[str, str], ...]:
    ok = isinstance(items, list) and all(
        isinstance(i, dict) and set(i) == {"user", "assistant"}
        and all(isinstance(v, str) for v in i.values()) for i in items)
    if not ok:
        raise PromptSetError(f"{where}.examples: must be a list of {{user: text, assistant: text}} turns")
    return tuple((i["user"], i["assistant"]) for i in items)


def placeholders(template: str, where: str) -> set[str]:
    """The names a template's placeholders use; a template that does not parse, or uses a positional or
    indexed placeholder, is an error."""
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as e:
        hint = "write a literal brace doubled: {{ }}"
        raise PromptSetError(f"{where}: does not format ({e}; {hint})") from None
    bad = [f for f in fields if not f.isidentifier()]
    if bad:
        raise PromptSetError(f"{where}: placeholders must be plain names, got {{{bad[0]}}}")
    return set(fields)
