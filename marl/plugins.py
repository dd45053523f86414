"""Loading the user's own code that a config names: a module by dotted path (`my_pkg.debate`) or file path
(`workflows/debate.py`), and a function in one (`my_pkg.shaping.penalty`, `my_pkg.shaping:penalty`,
`hooks/shaping.py:penalty`). Errors are PluginError messages that say what was looked for and where.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any


class PluginError(ValueError):
    """A module or function named in the config cannot be loaded."""


def is_file_spec(spec: str) -> bool:
    return spec.endswith(".py") or "/" in spec


def load_module(spec: str) -> ModuleType:
    """The module `spec` names: a dotted path is imported; a file path is read relative to
    the working directory, else to the first sys.path entry that holds it (a Ray job's
    working_dir is one on every node)."""
    if not is_file_spec(spec):
        try:
            return importlib.import_module(spec)
        except ImportError as e:
            raise PluginError(f"module {spec!r} cannot be imported: {e}") from None
    path = _find_file(spec)
    # One module per file: the name is derived from the absolute path, so two files called debate.py coexist.
    name = f"marl_user_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
    if name in sys.modules:
        return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise PluginError(f"{spec!r} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # before executing it: dataclasses and pickling look the module up by name
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise PluginError(f"{spec!r} raised while being imported: {type(e).__name__}: {e}") from None
    return module


def _find_file(spec: str) -> Path:
    candidates = [Path(spec)] if Path(spec).is_absolute() else [Path.cwd() / spec, *(
        Path(entry or ".") / spec for entry in sys.path)]
    for path in candidates:
        if path.is_file():
            return path.resolve()
    raise PluginError(
        f"file {spec!r} not found (looked in the working directory {Path.cwd()} and on sys.path)"
    )


def load_function(spec: str) -> Any:
    """The callable `spec` names: `module.function`, `module:function` or `path/file.py:function`."""
    module_spec, sep, attr = spec.rpartition(":") if ":" in spec else spec.rpartition(".")
    if not sep or not module_spec or not attr:
        raise PluginError(
            f"{spec!r} is not a function path (`pkg.module.function` or `path/file.py:function`)"
        )
    module = load_module(module_spec)
    if not hasattr(module, attr):
        raise PluginError(f"module {module_spec!r} has no attribute {attr!r}")
    obj = getattr(module, attr)
    if not callable(obj):
        raise PluginError(f"{spec!r} is a {type(obj).__name__}, not a function")
    return obj
