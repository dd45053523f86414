"""A stop asked for by SIGTERM (`ray job stop`), raised in the driver's main thread wherever it waits.

Python runs a signal handler in the main thread between bytecodes, and an exception it raises propagates from
there: out of plain code, out of an asyncio loop. Inside Ray's blocking calls (`ray.wait`, `ray.get`) the
handler runs from Ray's own signal check instead, which passes on KeyboardInterrupt and SystemExit only.
Measured with ray 2.60: the call goes on to its end (a 4 s `ray.wait` returned after 4.0 s, the signal having
come at 0.5 s) and then raises SystemError ("returned a result with an exception set") from the stop; Ray's
own comment says such an exception is printed and dropped. Either way the stop is not a StopRequested, and a
driver that treats the SystemError as a failure restarts the run instead of stopping it.

So the handler also keeps the stop; `ray_call` turns a mangled stop back into the stop and raises a dropped
one; and `wait_refs` (which every remote Group call waits in) waits in slices of POLL_S, so a stop lands
within half a second however long the call. The code that catches the stop acknowledges it (`acknowledge`),
so the waits of its cleanup (a checkpoint on stop) do not raise it a second time.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import ray

POLL_S = 0.5  # the longest a kept stop waits inside one Ray wait


class StopRequested(BaseException):
    """SIGTERM (e.g. `ray job stop`): unwind through the cleanup that releases actors.

    A BaseException, like KeyboardInterrupt, so that `except Exception` handlers on the way (which turn a
    member's failure into an attributable GroupError) cannot re-label a stop as a training failure."""


_kept: list[StopRequested] = []  # the stop raised by the handler and not yet acknowledged (at most one)


def _raise_stop(signum: int, frame: Any) -> None:  # noqa: ARG001 - signal handler signature
    stop = StopRequested(f"signal {signum}")
    _kept[:] = [stop]
    raise stop


@contextmanager
def sigterm_stops() -> Iterator[None]:
    """While open, SIGTERM raises StopRequested in the main thread; the previous handler comes back after.
    Only the main thread may set signal handlers: elsewhere (a Tune trainable runs the driver in a thread of
    its own) this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        _kept.clear()


def raise_kept() -> None:
    """Raises the stop the handler raised, if it was lost inside a Ray wait and nobody acknowledged it."""
    if _kept:
        raise _kept[0]


def acknowledge() -> None:
    """The stop was caught: its cleanup's waits go on without raising it again."""
    _kept.clear()


@contextmanager
def ray_call() -> Iterator[None]:
    """Around a blocking Ray call of the driver: a stop that came during it is raised as StopRequested."""
    try:
        yield
    except SystemError as e:
        if isinstance(e.__cause__, StopRequested):
            raise e.__cause__ from None
        raise
    raise_kept()


def wait_refs(refs: Sequence[Any], timeout: float) -> list[Any]:
    """`ray.wait` for all of `refs` up to `timeout` seconds, in slices of at most POLL_S with a kept stop
    raised between them; returns the refs not ready by then."""
    deadline = time.monotonic() + timeout
    pending = list(refs)
    raise_kept()
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        with ray_call():
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=min(left, POLL_S))
    return pending
