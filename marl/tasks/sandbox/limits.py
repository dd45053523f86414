"""The sandbox's data contract: what to run (Program), within what (SandboxLimits), and what came of it
(SandboxResult, with one `reason` from REASONS)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from enum import StrEnum

from marl.field_rules import non_negative, positive
from marl.types import JsonRecord

# ok: every test ran and passed. failed: a test failed, the program raised or exited early, or an output
# differed. syntax_error: the candidate does not compile. timeout: wall clock or CPU limit. oom: address-space
# limit (MemoryError) or killed by the kernel. output_limit: stdout/stderr (or a case's output) over the cap.
# crash: the child ended without a verdict (os._exit, a signal, a broken harness). error: the sandbox itself
# failed (could not start the child, bad task).
REASONS = ("ok", "failed", "syntax_error", "timeout", "oom", "output_limit", "crash", "error")
STYLES = ("functional", "stdio")
# lines: outputs equal as lines, each right-stripped, blank lines at either end ignored. lines_decimal:
# LiveCodeBench's rule: lines stripped at both ends, and a line that differs still equal when its
# whitespace-separated tokens all parse as equal Decimals ("0.50" = "0.5", "1e3" = "1000").
OUTPUT_MATCHES = ("lines", "lines_decimal")


class OutputMatch(StrEnum):
    """`data.sandbox.output_match`: the names of OUTPUT_MATCHES (the config schema's type for the key)."""

    lines = "lines"
    lines_decimal = "lines_decimal"
MIB = 1 << 20


@dataclass(frozen=True)
class Program:
    """A candidate plus its tests.

    functional: `prefix` (e.g. the HumanEval prompt: imports and helpers) then `code` run as module
    'solution'; `test` defines check(candidate), called with the function `entry_point`.
    stdio: `code` runs as __main__ once per input; the outputs are compared in the parent with `outputs`,
    which never reach the child."""

    code: str
    style: str = "functional"
    test: str = ""
    entry_point: str = ""
    prefix: str = ""
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.style not in STYLES:
            raise ValueError(f"Program.style must be one of {STYLES}, got {self.style!r}")
        if self.style == "functional" and not (self.test and self.entry_point):
            raise ValueError("a functional Program needs `test` and `entry_point`")
        if self.style == "stdio" and (not self.inputs or len(self.inputs) != len(self.outputs)):
            raise ValueError("a stdio Program needs one expected output per input, and at least one input")

    @property
    def test_count(self) -> int:
        """The tests a time limit per test multiplies: one per stdin case; a functional check() is one."""
        return len(self.inputs) if self.style == "stdio" else 1


@dataclass(frozen=True)
class SandboxLimits:
    """Per-execution limits (the `data.sandbox` config section maps onto these).

    `timeout_s` is wall clock for the whole execution (startup and every test), enforced by the parent;
    the CPU rlimit is one second above it. With `timeout_per_test_s` = t > 0 the wall clock of a program of n
    tests is min((t + 1) · n + 5, timeout_s), the paper's rule: `timeout_s` is then the cap (`for_program`),
    and each test (a stdin case, or a functional program's module and its check()) is stopped inside the child
    once it runs past t seconds of wall time (reason 'timeout'), as the paper's per-test alarm.
    `max_processes` caps the sandbox uid's tasks, threads included (1 = the harness alone; the default leaves
    room for a few threads). It binds only when the child runs
    under its own uid or the parent is not root: the kernel does not apply RLIMIT_NPROC to root."""

    timeout_s: float = 10.0
    timeout_per_test_s: float = 0.0  # 0 = timeout_s for every program, whatever its number of tests
    memory_mb: int = 1024
    max_output_bytes: int = MIB
    file_size_mb: int = 64
    open_files: int = 64
    max_processes: int = 4
    drop_privileges: bool = True  # when root, run the candidate under a fresh unprivileged uid
    # False: the stdlib only (`python -S`), which halves interpreter start-up and keeps the project's own
    # packages (and torch) out of reach; True: the interpreter's site-packages too (numpy, ...).
    site_packages: bool = False
    # The LiveCodeBench harness's prelude before the candidate (marl.tasks.sandbox.prelude): star-imports of
    # the standard modules competitive code relies on, and sys.setrecursionlimit(50000).
    prelude: bool = False
    # How a stdio case's output is compared with the expected one (OUTPUT_MATCHES, compare_outputs).
    output_match: str = "lines"
    python: str = ""  # interpreter for the child; '' = the running one
    work_root: str = ""  # parent of the per-execution temp dirs; '' = the system temp dir

    def __post_init__(self) -> None:
        for name in (
            "timeout_s",
            "memory_mb",
            "max_output_bytes",
            "file_size_mb",
            "open_files",
            "max_processes",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"sandbox {name} must be > 0, got {getattr(self, name)!r}")
        if not self.timeout_per_test_s >= 0:
            raise ValueError(f"sandbox timeout_per_test_s must be >= 0, got {self.timeout_per_test_s!r}")
        if self.output_match not in OUTPUT_MATCHES:
            raise ValueError(
                f"sandbox output_match must be one of {OUTPUT_MATCHES}, got {self.output_match!r}"
            )

    def for_program(self, program: Program) -> SandboxLimits:
        """The limits of one execution of `program`: timeout_s from the per-test rule when it is on (the CPU
        rlimit follows it), else these limits unchanged. The per-test limit itself stays: the child stops each
        test past it (child_runs.py). Applying it twice changes nothing."""
        if not self.timeout_per_test_s:
            return self
        wall = min((self.timeout_per_test_s + 1) * program.test_count + 5, self.timeout_s)
        return replace(self, timeout_s=wall)

    def rlimits(self) -> dict[str, tuple[int, int]]:
        """(soft, hard) per limit, as the child applies them."""
        cpu = math.ceil(self.timeout_s) + 1
        return {
            "cpu_s": (cpu, cpu + 1),  # soft: SIGXCPU; hard: SIGKILL
            "memory_bytes": (self.memory_mb * MIB,) * 2,
            "file_bytes": (self.file_size_mb * MIB,) * 2,
            "open_files": (self.open_files,) * 2,
            "processes": (self.max_processes,) * 2,
            "core_bytes": (0, 0),
        }


@dataclass
class SandboxConfig:
    """The `data.sandbox` config section, declared beside the code family that reads it: the limits a run
    may set (limits_of), and `workers`; the config schema composes it."""

    # code only: limits of one sandboxed execution of an answer's tests (marl.tasks.sandbox.SandboxLimits)
    timeout_s: float = positive(10.0)  # wall clock for all of one answer's tests, start-up included
    # The paper's per-test rule: with t > 0, an answer with n tests gets min((t + 1)·n + 5,
    # timeout_s) seconds (timeout_s is then the cap), so long test suites are not cut short by a
    # limit sized for short ones. 0 = off.
    timeout_per_test_s: float = non_negative(0.0)
    memory_mb: int = positive(1024)  # address space (RLIMIT_AS)
    max_output_bytes: int = positive(1048576)  # stdout + stderr (and each stdin/stdout case's output)
    file_size_mb: int = positive(64)  # largest file the program may write (RLIMIT_FSIZE)
    max_processes: int = positive(4)  # tasks (processes + threads) of the sandbox's own uid (RLIMIT_NPROC)
    site_packages: bool = False  # let answers import third-party packages (numpy); off: stdlib only
    # The LiveCodeBench harness's prelude before each answer (marl/tasks/sandbox/prelude.py): star-imports of
    # string, re, datetime, collections, heapq, bisect, copy, math, random, statistics, itertools, functools,
    # operator, io, sys, json (and builtins, typing), the modules by name, and sys.setrecursionlimit(50000).
    prelude: bool = False
    # How a stdin/stdout case's output is compared: lines = as right-stripped lines; lines_decimal =
    # LiveCodeBench's, lines stripped at both ends and a differing line still equal when its tokens are equal
    # as Decimals ("0.50" = "0.5").
    output_match: OutputMatch = OutputMatch.lines
    # Executions at once (each a thread driving one child process); 0 = one per CPU
    # the scoring process may use.
    workers: int = non_negative(0)


def limits_of(section: SandboxConfig) -> SandboxLimits:
    """The SandboxLimits a config section sets; the rest (open files, privileges, interpreter) keep their
    defaults. Raises ValueError naming a limit out of bounds."""
    return SandboxLimits(timeout_s=section.timeout_s, timeout_per_test_s=section.timeout_per_test_s,
                         memory_mb=section.memory_mb, max_output_bytes=section.max_output_bytes,
                         file_size_mb=section.file_size_mb, max_processes=section.max_processes,
                         site_packages=section.site_packages, prelude=section.prelude,
                         output_match=str(section.output_match))


def auto_workers() -> int:
    """Concurrent executions when none are configured: one per CPU this process may run on, as the paper's
    stack sizes its test pool to the CPU count."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@dataclass(frozen=True)
class SandboxResult:
    """The outcome of one execution. `passed` is True only with reason 'ok'."""

    passed: bool
    reason: str
    detail: str = ""  # the first failure, the harness's message, or how the child ended
    wall_s: float = 0.0  # spawn to reap
    cpu_s: float = 0.0  # user + system CPU of the child
    startup_s: float = 0.0  # spawn until the child had confined itself (0 if it never reported)
    stdout: str = ""  # the first KEEP_BYTES of each stream
    stderr: str = ""
    returncode: int | None = None
    network_isolation: str = "unknown"  # namespace | harness | unknown (the child never reported)
    user_isolation: str = "unknown"  # uid | none | unknown

    def info(self) -> JsonRecord:
        """A compact, JSON-ready summary (what an Episode records)."""
        return {
            "reason": self.reason, "detail": self.detail[:200], "wall_s": round(self.wall_s, 4),
            "cpu_s": round(self.cpu_s, 4), "network_isolation": self.network_isolation,
            "user_isolation": self.user_isolation,
        }
