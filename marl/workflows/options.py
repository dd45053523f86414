"""Workflow options, declared once: the built-in workflows' settings (`WorkflowSettings`, the `marl.*` keys
of the same names; the config schema's `marl` section extends this class) and a user workflow's own options
(a dataclass its module names as `OPTIONS`, set under `marl.options.*`), each field with its bounds in its
metadata.

The bounds are marl/field_rules.py's field metadata, as every config section's are, so config load checks
these fields as it checks any key, and the config reference lists them.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from marl.field_rules import bounds_problem, positive
from marl.prompts import PromptSetError, load_prompt_set

T = TypeVar("T")


@dataclass
class WorkflowSettings:
    """The built-in workflows' settings: the `marl.*` keys of the same names."""

    num_generators: int = positive(3)  # voting: K parallel generators
    # voting: show the aggregator the K responses in an order drawn per episode (seeded by task and sample)
    # instead of the generators' order, so a preference for a position is not a preference for a generator
    shuffle_candidates: bool = False
    max_rounds: int = positive(3)  # eval_opt: at most R generator turns
    max_strategies: int = positive(3)  # orch_workers: more strategies than this ends the episode
    # Wording of the workflows' prompts: a built-in prompt set, default (this project's) | paper (as in arXiv
    # 2605.24202: an eval_opt evaluator that never reveals the answer, revisions by a different method, code
    # personas for data.task=code) | fewshot (paper's, with two worked examples of the output format for each
    # coordinating role), or the path to a prompt-set file (YAML as marl/prompts/default.yaml, or the paper's
    # released prompt.json), checked at config load against the workflows and roles it names
    # (docs/workflows.md).
    prompts: str = "default"


@dataclass
class WorkflowOptions(WorkflowSettings):
    """What a workflow's `agents` and `run` read: the built-in settings, and `options`, the run's workflow's
    own options (an instance of its module's `OPTIONS` class, built from `marl.options`; None: its
    defaults)."""

    options: object = None

    def __post_init__(self) -> None:
        problem = bounds_problem(self, "marl.")
        if problem:
            raise ValueError(problem)
        try:
            load_prompt_set(self.prompts)
        except PromptSetError as e:
            raise ValueError(f"marl.prompts={self.prompts}: {e}") from None

    def own(self, cls: type[T]) -> T:
        """The workflow's own options as its `OPTIONS` class `cls`: the ones the run set, else defaults."""
        if self.options is None:
            return cls()
        if not isinstance(self.options, cls):
            raise TypeError(f"marl.options holds {type(self.options).__name__}, not {cls.__name__}")
        return self.options


def own_options(cls: type | None, values: Mapping[str, Any], workflow: str) -> object:
    """The workflow's own options: its `OPTIONS` class `cls` built from `values` (the `marl.options`
    mapping), or None for a workflow that declares none. Raises ValueError naming `marl.options.<key>` for an
    unknown key, a value of the wrong type or out of its bounds."""
    if cls is None:
        if values:
            raise ValueError(f"marl.options.{next(iter(values))}: {workflow} declares no options of its own "
                             "(its module has no OPTIONS)")
        return None
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key, value in values.items():
        if key not in names:
            raise ValueError(f"marl.options.{key}: {workflow} has no option {key!r}; "
                             f"its options: {', '.join(names)}")
        problem = _type_problem(hints[key], value)
        if problem:
            raise ValueError(f"marl.options.{key} must be {problem}; got {value!r}")
    options = cls(**values)
    problem = bounds_problem(options, "marl.options.")
    if problem:
        raise ValueError(problem)
    return options


def _type_problem(hint: Any, value: Any) -> str | None:
    """What `value` must be for a field of type `hint` (`an int`), or None when it is that (or the type is
    not a plain scalar, which the class checks itself)."""
    kinds = {bool: (bool,), int: (int,), float: (int, float), str: (str,)}
    if hint not in kinds:
        return None
    ok = isinstance(value, kinds[hint]) and (hint is bool or not isinstance(value, bool))
    return None if ok else f"{'an' if hint is int else 'a'} {hint.__name__}"
