"""SandboxPool: a bounded number of concurrent executions, shared by everything that scores code."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from marl.tasks.sandbox.limits import Program, SandboxLimits, SandboxResult, auto_workers
from marl.tasks.sandbox.runner import run

SELF_CHECK = Program(code="def f(x):\n    return x + 1\n", test="def check(c):\n    assert c(1) == 2\n",
                     entry_point="f")


class SandboxPool:
    """Runs Programs on at most `workers` threads, each driving one child process at a time, so scoring
    never takes more than `workers` cores from the engines whatever the number of episodes in flight.

    The executor starts on first use; a pickled pool arrives without one and starts its own. workers=0 is one
    per CPU the process holding the pool may use (auto_workers)."""

    def __init__(self, limits: SandboxLimits | None = None, workers: int = 0):
        if workers < 0:
            raise ValueError(f"sandbox workers must be >= 0 (0 = auto), got {workers}")
        self.limits = limits or SandboxLimits()
        self.workers = workers or auto_workers()
        self._setting = workers  # what travels when pickled: auto is counted again where the pool lands
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def submit(self, program: Program) -> Future[SandboxResult]:
        return self._start().submit(run, program, self.limits)

    def run_all(self, programs: Iterable[Program]) -> list[SandboxResult]:
        """Results in the order of `programs`."""
        futures = [self.submit(p) for p in programs]
        return [f.result() for f in futures]

    def self_check(self) -> None:
        """Raise if a trivially correct program does not pass (wrong interpreter, no /proc, ...), so a
        misconfigured sandbox fails loudly instead of scoring every answer 0."""
        result = self.submit(SELF_CHECK).result()
        if not result.passed:
            raise RuntimeError(f"the code sandbox does not work here: {result.reason}: {result.detail} "
                               f"{result.stderr[-500:]}")

    def close(self) -> None:
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, object]:
        return {"limits": self.limits, "workers": self._setting}

    def __setstate__(self, state: dict[str, Any]) -> None:
        SandboxPool.__init__(self, state["limits"], state["workers"])

    def _start(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.workers, thread_name_prefix="sandbox")
            return self._executor
