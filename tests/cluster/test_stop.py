"""cluster.stop: SIGTERM raises StopRequested in the main thread even while it waits inside Ray, once, and
the previous handler comes back when the run ends."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from cluster import stop
from cluster.group import Group, MemberOptions
from cluster.stop import StopRequested, sigterm_stops

HANG_S = 4.0  # how long the member's call takes; a lost stop would return its value after it
SIGNAL_AFTER_S = 0.5


class Sleeper:
    def hang(self, seconds: float) -> str:
        time.sleep(seconds)
        return "woke"


def _sigterm_soon() -> threading.Timer:
    timer = threading.Timer(SIGNAL_AFTER_S, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    return timer


def test_a_stop_during_a_ray_wait_is_raised_there_and_only_once(ray_cluster):
    """The main thread waits in ray.wait when SIGTERM comes: Ray's signal check prints the handler's
    exception as ignored, so without the kept stop the call returns "woke" after HANG_S."""
    group = Group(Sleeper, 1, "sleeper", options=MemberOptions(num_cpus=0.5))
    try:
        with sigterm_stops():
            timer = _sigterm_soon()
            t0 = time.monotonic()
            with pytest.raises(StopRequested, match="signal 15"):
                group.submit(Sleeper.hang, HANG_S).result(timeout=30)
            waited = time.monotonic() - t0
            timer.join()
            stop.acknowledge()
            # The cleanup after a caught stop waits on members again: nothing is raised twice.
            assert group.submit(Sleeper.hang, 0.1).result(timeout=30) == ["woke"]
        assert waited < SIGNAL_AFTER_S + 2 * stop.POLL_S + 1.0 < HANG_S
    finally:
        group.shutdown()


def test_a_stop_in_plain_code_propagates_at_once_and_the_old_handler_returns():
    def previous(signum, frame):  # noqa: ARG001 - signal handler signature
        raise AssertionError("the previous handler ran while the stop handler was installed")

    old = signal.signal(signal.SIGTERM, previous)
    try:
        with sigterm_stops():
            timer = _sigterm_soon()
            with pytest.raises(StopRequested):
                time.sleep(HANG_S)
            timer.join()
            stop.acknowledge()
            stop.raise_kept()  # acknowledged: nothing kept
            with pytest.raises(StopRequested):
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(HANG_S)
            with pytest.raises(StopRequested):
                stop.raise_kept()  # caught but not acknowledged: the next wait raises it again
        assert signal.getsignal(signal.SIGTERM) is previous
        stop.raise_kept()  # leaving the block forgets a kept stop
    finally:
        signal.signal(signal.SIGTERM, old)
