"""Wall time of the calls a benchmark wraps, by name: to time the parts of one operation where they run."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def timed(times: dict[str, list[float]], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn`, appending each call's seconds to times[name] (raised calls included)."""
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            times.setdefault(name, []).append(time.perf_counter() - t0)

    return wrapper
