"""The one registry of named variants a config key picks: advantage estimators, loss aggregations, KL
estimators, schedules, dtypes, learner and engine backends, task families. Each is a `Registry` declared
beside the code it names, and config load checks a key's value against it.

Two kinds:
- closed: the key's choices are the members of a str Enum (the config schema's type for the key, which
  OmegaConf validates), declared beside the registry; the registry refuses to be built unless it holds exactly
  those members, and nothing registers into it afterwards;
- open: the key is a plain str. Beside the built-ins, `register(name, obj)` adds a variant in this process (a
  registry call: no Enum is touched), and, when the registry names the attribute a plugin module `declares`,
  a module path (`my_pkg.backend`, `plugins/backend.py`) is a value too: the module is imported on first use
  and its attribute is the variant. A module path works in every process, a Ray actor included, because
  each process imports the module itself when it reads the key; `register` holds only where it ran.

A built-in given as "module:attr" is imported on first use, so that a backend's heavy dependencies (deepspeed,
vllm, torch) load only where it is chosen.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Iterator, Mapping
from enum import StrEnum
from typing import Generic, TypeVar

from marl.plugins import PluginError, is_file_spec, load_module

T = TypeVar("T")


class Registry(Generic[T]):
    """name -> a variant (a class, a function, a declaration); `key` is the config key that picks one."""

    def __init__(self, key: str, builtins: Mapping[str, T | str], *, names: type[StrEnum] | None = None,
                 declares: str | None = None, declared: type | None = None):
        if names is not None and [str(m) for m in names] != list(builtins):
            raise ValueError(f"{key}: a variant for every member of {names.__name__}, in order, none else")
        if names is not None and declares is not None:
            raise ValueError(f"{key}: a closed registry ({names.__name__}) takes no plugin modules")
        # `declared`: the type a plugin module's variant must be an instance of (None: not checked here)
        self.key, self.enum, self.declares, self.declared = key, names, declares, declared
        self._builtins: dict[str, T | str] = dict(builtins)
        self._registered: dict[str, T] = {}
        self._loaded: dict[str, T] = {}  # plugin modules' variants, by the module path that named them

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def names(self) -> tuple[str, ...]:
        """The names a value may take: the built-ins', then the registered ones' (a module path besides)."""
        return (*self._builtins, *self._registered)

    def __getitem__(self, name: str) -> T:
        """The variant `name` names: a built-in (imported now on its first use), a registered one, or a plugin
        module's. ValueError naming the key and the choices when there is none."""
        if name in self._registered:
            return self._registered[name]
        if name in self._builtins:
            found = self._builtins[name]
            if isinstance(found, str):
                module, _, attr = found.partition(":")
                found = self._builtins[name] = getattr(importlib.import_module(module), attr)
            return found
        if self.declares is not None and _is_module_spec(name):
            if name not in self._loaded:
                self._loaded[name] = self._load(name, self.declares)
            return self._loaded[name]
        raise ValueError(f"{self.key} must be {self.label()}; got {name!r}")

    def problem(self, value: object) -> str | None:
        """What keeps `value` from being a variant (a message naming the key), or None."""
        try:
            self[str(value)]
        except ValueError as e:
            return str(e)
        return None

    def label(self) -> str:
        """The choices in words, for messages and the config reference."""
        choices = "one of " + ", ".join(self.names())
        return choices + (f", or a module path (a module declaring {self.declares})" if self.declares else "")

    def field(self, default: str) -> str:
        """An open registry's config field: a str whose value config load checks against this registry, and
        whose choices the config reference lists (jobs/config/field_rules.py reads the metadata)."""
        return dataclasses.field(default=default, metadata={"registry": self})

    def register(self, name: str, variant: T) -> str:
        """Add `variant` as `name` (never a taken name) in this process; returns `name`."""
        if self.enum is not None:
            raise ValueError(f"{self.key} is closed: its choices are the members of {self.enum.__name__}")
        if name in self._builtins or name in self._registered:
            raise ValueError(f"{self.key}: {name!r} is registered already")
        self._registered[name] = variant
        return name

    def unregister(self, name: str) -> None:
        """Remove what `register` added: `name` is no longer a value of the key."""
        if name in self._builtins:
            raise ValueError(f"{self.key}: {name!r} is built in")
        if name not in self._registered:
            raise ValueError(f"{self.key}: {name!r} is not registered")
        del self._registered[name]

    def _load(self, spec: str, attr: str) -> T:
        try:
            module = load_module(spec)
        except PluginError as e:
            raise ValueError(f"{self.key} must be {self.label()}; got {spec!r}: {e}") from None
        if not hasattr(module, attr):
            where = module.__file__ if is_file_spec(spec) else module.__name__
            raise ValueError(f"{self.key}={spec}: {where} declares no {attr}")
        variant: T = getattr(module, attr)
        if self.declared is not None and not isinstance(variant, self.declared):
            raise ValueError(f"{self.key}={spec}: {attr} must be a {self.declared.__name__}; got {variant!r}")
        return variant


def _is_module_spec(name: str) -> bool:
    """A dotted module path or a file path, never a bare name (a typo of a built-in's is refused as such)."""
    return is_file_spec(name) or "." in name
