"""Connecting to Ray: an existing cluster when an address is given (or RAY_ADDRESS is set), else an
embedded local one. Only a cluster this process started is shut down on exit."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import ray


def init_kwargs(address: str, num_cpus: int, include_dashboard: bool) -> dict:
    """ray.init arguments. Resource counts only apply to a cluster we start ourselves."""
    address = address or os.environ.get("RAY_ADDRESS", "")
    if address:
        return {"address": address}
    kwargs: dict = {"include_dashboard": include_dashboard}
    if num_cpus:
        kwargs["num_cpus"] = num_cpus
    return kwargs


@contextlib.contextmanager
def connect(address: str = "", num_cpus: int = 0, include_dashboard: bool = False) -> Iterator[None]:
    """Connect (or start) Ray for the duration of the block."""
    if ray.is_initialized():
        yield
        return
    ray.init(log_to_driver=True, **init_kwargs(address, num_cpus, include_dashboard))
    try:
        yield
    finally:
        ray.shutdown()
