"""Prompt sets as data (the `marl.prompts` config key): the wording every workflow sends, read from a file.

A prompt set is a YAML file (the built-in ones beside this module: default.yaml, paper.yaml, fewshot.yaml;
default.yaml's header gives the layout) holding, per workflow, per task kind (math, code, or `any`) and per
role, the system message, the user templates (Python format strings over the placeholders the workflow names)
and optional worked examples, sent as prior user/assistant turns. `marl.prompts` takes a built-in name or a
path to a user's file; a `.json` file in the layout of the paper's released prompt files is imported on the
fly (marl/prompts/authors.py). The structure is checked here, the workflows and roles a set names in
marl.workflows.prompt_check.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from pathlib import Path

from marl.prompts.model import PromptSet, PromptSetError, RoleWording, WorkflowWording
from marl.prompts.parse import KINDS, parse_set, placeholders, read_file

BUILTIN_DIR = Path(__file__).parent
BUILTIN_SETS: tuple[str, ...] = ("default", "paper", "fewshot")


def set_path(spec: str) -> Path:
    """The file `marl.prompts` names: a built-in set's file, or the user's path."""
    return BUILTIN_DIR / f"{spec}.yaml" if spec in BUILTIN_SETS else Path(spec)


def load_prompt_set(spec: str) -> PromptSet:
    """The prompt set `spec` names (a built-in name or a file path), read and structurally checked once per
    version of the file. Raises PromptSetError naming the file, the workflow and role, and the problem."""
    path = set_path(spec)
    if spec not in BUILTIN_SETS and not path.is_file():
        raise PromptSetError(f"no such file, and not a built-in prompt set ({', '.join(BUILTIN_SETS)})")
    return _load(spec, path, path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=32)
def _load(spec: str, path: Path, mtime_ns: int) -> PromptSet:
    workflows = parse_set(read_file(path), str(path))
    return PromptSet(name=spec, path=str(path), workflows=workflows, digest=digest(workflows))


def digest(workflows: dict[str, dict[str, WorkflowWording]]) -> str:
    """16 hex digits of the SHA-256 of the resolved wording (canonical JSON): equal for equal wording,
    whatever the file's layout, comments or anchors."""
    resolved = {w: {k: {**dataclasses.asdict(v), "key": None} for k, v in kinds.items()}
                for w, kinds in workflows.items()}
    return hashlib.sha256(json.dumps(resolved, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]


__all__ = ["BUILTIN_SETS", "KINDS", "PromptSet", "PromptSetError", "RoleWording", "WorkflowWording", "digest",
           "load_prompt_set", "placeholders", "set_path"]
