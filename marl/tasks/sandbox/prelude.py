"""The LiveCodeBench harness's prelude (`SandboxLimits.prelude`), the project's own rendering of it: every
name of the standard modules competitive code relies on, star-imported into the candidate's namespace before
it runs, the modules themselves, and a recursion limit of 50,000 frames. Code that forgets an import or
recurses past 1,000 frames then runs as it did under the paper's grader."""

from __future__ import annotations

# Star-imported, in this order (a later module's name wins), then imported by name; builtins and typing are
# star-imported only.
STAR_MODULES = ("string", "re", "datetime", "collections", "heapq", "bisect", "copy", "math", "random",
                "statistics", "itertools", "functools", "operator", "io", "sys", "json", "builtins", "typing")
NAMED_MODULES = tuple(m for m in STAR_MODULES if m not in ("builtins", "typing"))
RECURSION_LIMIT = 50_000


def prelude_source() -> str:
    """The prelude as Python source, run in the candidate's module namespace before its code."""
    lines = [f"from {m} import *" for m in STAR_MODULES] + [f"import {m}" for m in NAMED_MODULES]
    return "\n".join([*lines, f"sys.setrecursionlimit({RECURSION_LIMIT})", ""])
