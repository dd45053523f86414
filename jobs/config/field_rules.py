"""The per-field rules of the config schema (jobs/config/schema.py): each leaf key's choices (an Enum field's
values, an open registry's names and module paths, or `one_of`'s) and bounds (`positive`, `non_negative`),
read from the dataclass fields, for config load to check and the config reference to list. A rule lives on the
field it constrains, nowhere else."""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Iterator, Mapping
from enum import Enum
from typing import Any

from omegaconf import OmegaConf

from jobs.config.schema import TrainConfig, as_node
from marl.registry import Registry


@dataclasses.dataclass(frozen=True)
class FieldRule:
    key: str  # dotted path from the top of the config
    words: tuple[str, ...] = ()  # `one_of`'s choices; () = any value of the field's type
    above: float | None = None  # the value must be > this
    min: float | None = None  # the value must be >= this
    count_or: tuple[str, ...] = ()  # the value must be a whole number >= 0 or one of these words (`count_or`)
    enum: type[Enum] | None = None  # an Enum field's type: its members are the choices
    auto: bool = False  # a tri-state bool (schema.auto_bool): true, false, or null (YAML may write `auto`)
    registry: Registry[object] | None = None  # an open registry's field (Registry.field): names, module paths

    @property
    def choices(self) -> tuple[str, ...]:
        """The values the key takes: the Enum's members as of now (a registry may have added one:
        marl/registry.py), or the metadata's."""
        if self.registry is not None:
            return self.registry.names()
        return tuple(str(m.value) for m in self.enum) if self.enum else self.words

    def problem(self, value: Any) -> str | None:
        """What is wrong with `value` for this key (a message naming the key), or None."""
        if self.registry is not None:
            return self.registry.problem(value)
        if self.count_or and not (str(value) in self.count_or or str(value).isdigit()):
            words = ", ".join(self.count_or)
            return f"{self.key} must be a whole number >= 0 or one of {words}; got {_plain(value)!r}"
        # A `true`/`false` override of a str key arrives as "True"/"False" (OmegaConf parses it as a bool).
        if self.choices and value not in self.choices and not (
                isinstance(value, str) and value.lower() in self.choices):
            return f"{self.key} must be one of {', '.join(self.choices)}; got {_plain(value)!r}"
        if value is None:  # an unset optional number (`null`): decided where it is read
            return None
        if self.above is not None and not value > self.above:
            return f"{self.key} must be > {self.above:g}; got {value!r}"
        if self.min is not None and value < self.min:
            return f"{self.key} must be >= {self.min:g}; got {value!r}"
        return None

    def labels(self) -> list[str]:
        """The rule as the config reference lists it."""
        found = ["one of " + ", ".join(f"`{c}`" for c in self.choices)] if self.choices else []
        declares = self.registry.declares if self.registry is not None else None
        found += [f"or a module path (its module declares `{declares}`)"] if declares else []
        found += ["`true`, `false` or `auto` (null)"] if self.auto else []
        words = ", ".join(f"`{c}`" for c in self.count_or)
        found += [f"a whole number >= 0 or {words}"] if self.count_or else []
        found += [f"> {self.above:g}"] if self.above is not None else []
        return found + ([f">= {self.min:g}"] if self.min is not None else [])


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else value


def enum_type(hint: Any) -> type[Enum] | None:
    """The Enum a field's resolved type hint names, if any."""
    return hint if isinstance(hint, type) and issubclass(hint, Enum) else None


def field_rules(cls: type = TrainConfig, prefix: str = "") -> Iterator[FieldRule]:
    """Every leaf key under `cls` that carries a rule, in schema order."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(f.default_factory):
            yield from field_rules(f.default_factory, f"{prefix}{f.name}.")  # type: ignore[arg-type]
            continue
        rule = _rule(f"{prefix}{f.name}", enum_type(hints[f.name]), f.metadata)
        if rule is not None:
            yield rule


def _rule(key: str, enum: type[Enum] | None, meta: Mapping[str, Any]) -> FieldRule | None:
    words = tuple(meta.get("choices", ()))
    if not (enum or words or {"above", "min", "count_or", "auto", "registry"} & set(meta)):
        return None
    return FieldRule(key, words, meta.get("above"), meta.get("min"), tuple(meta.get("count_or", ())), enum,
                     bool(meta.get("auto")), meta.get("registry"))


@functools.cache
def schema_rules() -> dict[str, FieldRule]:
    """key -> its rule, for every key of the schema that carries one (schema order)."""
    return {rule.key: rule for rule in field_rules()}


def auto_rules() -> list[FieldRule]:
    """The tri-state keys' rules (schema.auto_bool)."""
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
