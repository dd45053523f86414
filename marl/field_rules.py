"""The rules of config fields, declared where each section is (marl, rollout, learners and the run-level
sections of jobs/config/schema.py): a field's bounds as its metadata (`positive`, `non_negative`, `at_least`,
`interval`, `count_or`, `auto_bool`), read back as a `FieldRule` per key, and a section's own rules that read
more than one of its fields as a declared list of `Rule`s (its class's `RULES`). Config load checks both,
and the config reference lists both, from these declarations. The lowest layer, so every section can use
it; pure Python.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from marl.registry import Registry

T = TypeVar("T")
S = TypeVar("S")


def positive(default: T) -> T:
    """A field whose value must be > 0."""
    return field(default=default, metadata={"above": 0})


def non_negative(default: T) -> T:
    """A field whose value must be >= 0."""
    return field(default=default, metadata={"min": 0})


def at_least(default: T, low: float) -> T:
    """A field whose value must be >= `low`."""
    return field(default=default, metadata={"min": low})


def interval(default: T, low: float, high: float, *, open_low: bool = False, open_high: bool = False) -> T:
    """A field whose value lies in [low, high] (an open end excludes its bound: (0, 1] is open_low)."""
    return field(default=default, metadata={"above" if open_low else "min": low,
                                            "below" if open_high else "max": high})


def auto_bool() -> bool | None:
    """A tri-state field: true, false, or null (the default), written `auto` too: decided where the run is
    laid out (jobs/plan/layout.py) or by the part that reads it, never written back into the config."""
    return field(default=None, metadata={"auto": True})


def count_or(default: str, words: Collection[str]) -> str:
    """A str field holding a whole number >= 0 or one of `words` (e.g. a row count or `all`)."""
    return field(default=default, metadata={"count_or": tuple(words)})


@dataclass(frozen=True)
class FieldRule:
    """One leaf key's rule, read from its field: choices and bounds."""

    key: str  # dotted path from the top of the config
    words: tuple[str, ...] = ()  # `choices` metadata; () = any value of the field's type
    above: float | None = None  # the value must be > this
    min: float | None = None  # the value must be >= this
    below: float | None = None  # the value must be < this
    max: float | None = None  # the value must be <= this
    count_or: tuple[str, ...] = ()  # the value must be a whole number >= 0 or one of these words (`count_or`)
    enum: type[Enum] | None = None  # an Enum field's type: its members are the choices
    auto: bool = False  # a tri-state bool (auto_bool): true, false, or null (YAML may write `auto`)
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
        if self.low_bound() or self.high_bound():
            low_ok = self.above is None or value > self.above
            high_ok = (self.below is None or value < self.below) and (self.max is None or value <= self.max)
            if not (low_ok and (self.min is None or value >= self.min) and high_ok):
                return f"{self.key} must be {self.bounds_label()}; got {value!r}"
        return None

    def low_bound(self) -> bool:
        return self.above is not None or self.min is not None

    def high_bound(self) -> bool:
        return self.below is not None or self.max is not None

    def bounds_label(self) -> str:
        """`> 0`, `>= 0`, or an interval `in (0, 1]`."""
        if not self.high_bound():
            return f"> {self.above:g}" if self.above is not None else f">= {self.min:g}"
        low = f"({self.above:g}" if self.above is not None else f"[{self.min:g}"
        high = f"{self.below:g})" if self.below is not None else f"{self.max:g}]"
        return f"in {low}, {high}"

    def labels(self) -> list[str]:
        """The rule as the config reference lists it."""
        found = ["one of " + ", ".join(f"`{c}`" for c in self.choices)] if self.choices else []
        declares = self.registry.declares if self.registry is not None else None
        found += [f"or a module path (its module declares `{declares}`)"] if declares else []
        found += ["`true`, `false` or `auto` (null)"] if self.auto else []
        words = ", ".join(f"`{c}`" for c in self.count_or)
        found += [f"a whole number >= 0 or {words}"] if self.count_or else []
        return found + ([self.bounds_label()] if self.low_bound() or self.high_bound() else [])


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else value


def enum_type(hint: Any) -> type[Enum] | None:
    """The Enum a field's resolved type hint names, if any."""
    return hint if isinstance(hint, type) and issubclass(hint, Enum) else None


def field_rules(cls: type, prefix: str = "") -> Iterator[FieldRule]:
    """Every leaf key under the dataclass `cls` that carries a rule, in declaration order (nested sections
    where they are declared)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(f.default_factory):
            yield from field_rules(f.default_factory, f"{prefix}{f.name}.")
            continue
        rule = _rule(f"{prefix}{f.name}", enum_type(hints[f.name]), f.metadata)
        if rule is not None:
            yield rule


_BOUNDS = ("above", "min", "below", "max")


def _rule(key: str, enum: type[Enum] | None, meta: Mapping[str, Any]) -> FieldRule | None:
    words = tuple(meta.get("choices", ()))
    if not (enum or words or {*_BOUNDS, "count_or", "auto", "registry"} & set(meta)):
        return None
    return FieldRule(key, words, above=meta.get("above"), min=meta.get("min"), below=meta.get("below"),
                     max=meta.get("max"), count_or=tuple(meta.get("count_or", ())), enum=enum,
                     auto=bool(meta.get("auto")), registry=meta.get("registry"))


def bounds_problem(options: object, prefix: str) -> str | None:
    """The first rule a field of the dataclass instance `options` breaks (a message naming the key)."""
    for rule in field_rules(type(options), prefix):
        problem = rule.problem(getattr(options, rule.key.removeprefix(prefix)))
        if problem:
            return problem
    return None


@dataclass(frozen=True)
class Rule(Generic[S]):
    """A section's own rule over more than one of its fields (or a bound a field's metadata cannot state).
    `text` is the rule as the error message and the config reference state it, the section's keys written
    `{p}key` (`{p}` is where the section sits: `algo.`); `holds` is the check, `got` what the message reports
    of a config that breaks it (none: the text alone), `message` a message of its own in place of both (for
    a rule whose text names what only the config at hand knows, such as the registered backends)."""

    keys: tuple[str, ...]  # the section's keys it constrains (each lists it in the reference)
    text: str
    holds: Callable[[S], bool]
    got: Callable[[S], str] | None = None
    message: Callable[[S, str], str] | None = None

    def problem(self, section: S, prefix: str) -> str | None:
        """The message naming the keys (under `prefix`) when `section` breaks the rule, else None."""
        if self.holds(section):
            return None
        if self.message is not None:
            return self.message(section, prefix)
        text = self.stated(prefix)
        return f"{text}; got {self.got(section)}" if self.got else text

    def stated(self, prefix: str) -> str:
        return self.text.format(p=prefix)


def section_rules(cls: type) -> tuple[Rule[Any], ...]:
    """The section class's declared rules (`RULES`), none when it declares none."""
    return tuple(getattr(cls, "RULES", ()))


def sections(cls: type, prefix: str = "") -> Iterator[tuple[str, type]]:
    """(prefix, section class) of `cls` and every section nested in it, outermost first."""
    yield prefix, cls
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(f.default_factory):
            yield from sections(f.default_factory, f"{prefix}{f.name}.")
