"""The rules the config's sections declare, over the whole schema (jobs/config/schema.py): each leaf key's
choices and bounds (its field's metadata, marl/field_rules.py) and each section's own rules (its class's
`RULES`), keyed by their place in the config, for config load to check and the config reference to list."""

from __future__ import annotations

import functools
from typing import Any

from omegaconf import OmegaConf

from jobs.config.schema import TrainConfig, as_node
from marl.field_rules import FieldRule, Rule, enum_type, field_rules, section_rules, sections

__all__ = ["FieldRule", "auto_rules", "check_fields", "check_sections", "choice_problem", "enum_type",
           "schema_rules", "section_rule_texts"]


@functools.cache
def schema_rules() -> dict[str, FieldRule]:
    """key -> its rule, for every key of the schema that carries one (schema order)."""
    return {rule.key: rule for rule in field_rules(TrainConfig)}


@functools.cache
def _section_rules() -> tuple[tuple[str, Rule[Any]], ...]:
    """(the section's place, `algo.`; one of its rules), every section's, in schema order."""
    return tuple((prefix, rule) for prefix, cls in sections(TrainConfig) for rule in section_rules(cls))


def section_rule_texts() -> dict[str, list[str]]:
    """key -> the section rules that constrain it, as stated (for the config reference)."""
    out: dict[str, list[str]] = {}
    for prefix, rule in _section_rules():
        for key in rule.keys:
            out.setdefault(f"{prefix}{key}", []).append(rule.stated(prefix))
    return out


def auto_rules() -> list[FieldRule]:
    """The tri-state keys' rules (marl.field_rules.auto_bool)."""
    return [rule for rule in schema_rules().values() if rule.auto]


def choice_problem(key: str, value: Any) -> str | None:
    """For a value OmegaConf refused at `key` (an Enum field's): the choice rule's message, else None."""
    rule = schema_rules().get(key)
    return rule.problem(value) if rule is not None and rule.choices else None


def check_fields(cfg: TrainConfig) -> str | None:
    """The first field rule `cfg` breaks (its message naming the key), or None."""
    for rule in schema_rules().values():
        problem = rule.problem(OmegaConf.select(as_node(cfg), rule.key))
        if problem:
            return problem
    return None


def check_sections(cfg: TrainConfig) -> str | None:
    """The first section rule `cfg` breaks (its message naming the keys), or None."""
    for prefix, rule in _section_rules():
        section = OmegaConf.select(as_node(cfg), prefix.rstrip(".")) if prefix else cfg
        problem = rule.problem(section, prefix)
        if problem:
            return problem
    return None
