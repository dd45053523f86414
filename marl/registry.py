"""Registries of classes keyed by the members of a str Enum: the Enum is the config schema's type for the key
that picks one (`learner.backend`, `rollout.backend`), so the choices are spelled once, as the Enum's members,
and the registry holds exactly those.

Built-in classes are named as "module:Class" and imported on first use, so that a backend's heavy dependencies
(deepspeed, vllm) load only where it is chosen. A class from elsewhere (a user's backend, a test's) joins with
`Registry.register(name, cls)`: the Enum is closed by design, so registering adds `name` to it as a member,
the way Enum builds its own members; from then on the config accepts `name` like any built-in value and its
checks list it among the choices. Registration is per process: a Ray actor that should build such a class must
import the module that registers it (an in-process group, N = 0, shares the driver's). `unregister` undoes it.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from enum import StrEnum
from typing import Generic, TypeVar

T = TypeVar("T")
E = TypeVar("E", bound=StrEnum)


class Registry(Generic[E, T]):
    """`names` member -> a class; `key` is the config key that picks one (for error messages)."""

    def __init__(self, names: type[E], key: str, builtins: Mapping[E, str]):
        if set(builtins) != set(names):
            raise ValueError(f"{key}: a class for every member of {names.__name__}, none for another")
        self.names, self.key = names, key
        self._paths: dict[E, str] = dict(builtins)
        self._classes: dict[E, type[T]] = {}

    def __iter__(self) -> Iterator[E]:
        return iter(self.names)

    def __getitem__(self, name: str) -> type[T]:
        """The class registered as `name` (imported now if it is a built-in's first use)."""
        member = self.member(name)
        if member not in self._classes:
            module, _, attr = self._paths[member].partition(":")
            self._classes[member] = getattr(importlib.import_module(module), attr)
        return self._classes[member]

    def member(self, name: str) -> E:
        """`name` as the Enum's member; ValueError naming the key and the choices for a name none has."""
        try:
            return self.names(name)
        except ValueError:
            choices = ", ".join(m.value for m in self.names)
            raise ValueError(f"{self.key} must be one of {choices}; got {name!r}") from None

    def register(self, name: str, cls: type[T]) -> E:
        """Add `cls` as `name`, a new member of the Enum (never a built-in's name); returns the member."""
        if name in self.names.__members__:
            raise ValueError(f"{self.key}: {name!r} is registered already")
        member = _add_member(self.names, name)
        self._classes[member] = cls
        return member

    def unregister(self, name: str) -> None:
        """Remove what `register` added: `name` is no longer a value of the Enum nor of the config key."""
        member = self.member(name)
        if member in self._paths:
            raise ValueError(f"{self.key}: {name!r} is built in")
        del self._classes[member]
        _remove_member(self.names, member)


def _add_member(enum: type[E], value: str) -> E:
    # What EnumType does for each member it builds: the member is the value's str with its name and value set,
    # and the class's three tables (by name, by value, in order) list it; lookups, iteration, pickling and
    # OmegaConf's Enum validation all read those tables.
    member = str.__new__(enum, value)
    member._name_, member._value_ = value, value
    enum._member_map_[value] = member
    enum._value2member_map_[value] = member
    enum._member_names_.append(value)
    return member


def _remove_member(enum: type[E], member: E) -> None:
    del enum._member_map_[member.name]
    del enum._value2member_map_[member.value]
    enum._member_names_.remove(member.name)
