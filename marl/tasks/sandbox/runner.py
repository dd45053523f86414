"""Parent side of one execution: spawn the confined child, talk to it, clean up after it, classify.

`run` never raises for anything the candidate does; a sandbox that cannot start reports reason 'error'.
Whatever happened, the process group and every process of the execution's uid are killed, the child is
reaped and its temp dir is deleted before `run` returns.
"""

from __future__ import annotations

import json
import marshal
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

from marl.tasks.sandbox.capture import Capture, communicate
from marl.tasks.sandbox.limits import MIB, REASONS, Program, SandboxLimits, SandboxResult
from marl.tasks.sandbox.prelude import prelude_source
from marl.tasks.sandbox.reaper import kill_group_and_uid, remove_files_of
from marl.types import JsonRecord

CHILD = Path(__file__).with_name("child.py")
# A fresh uid per execution, from a range no real account uses: executions cannot signal, trace or read
# each other, and "everything owned by this uid" is exactly what this execution left behind.
UID_BASE, UID_SPAN = 1_000_000_000, 1 << 29
# No inherited variable reaches the child (secrets in the parent's environment stay there).
BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


def run(program: Program, limits: SandboxLimits) -> SandboxResult:
    """Execute `program` once under `limits` (its time limit per test applied: SandboxLimits.for_program)."""
    start = time.monotonic()
    limits = limits.for_program(program)
    uid = UID_BASE + secrets.randbelow(UID_SPAN) if limits.drop_privileges and os.geteuid() == 0 else None
    try:
        workdir = tempfile.mkdtemp(prefix=f"marl-sandbox-{os.getpid()}-", dir=limits.work_root or None)
    except OSError as e:
        return SandboxResult(False, "error", f"could not create the sandbox dir: {e}")
    try:
        if uid is not None:
            os.chown(workdir, uid, uid)
        return _execute(program, limits, uid, workdir, start)
    except OSError as e:  # spawning failed (bad interpreter path, fd or process limits of the parent)
        return SandboxResult(
            False, "error", f"could not run the sandbox: {e}", wall_s=time.monotonic() - start
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if uid is not None:
            remove_files_of(uid)


def _execute(
    program: Program, limits: SandboxLimits, uid: int | None, workdir: str, start: float
) -> SandboxResult:
    nonce = secrets.token_hex(16)
    proc, result_fd = _spawn(limits, workdir)
    try:
        cap = communicate(proc, result_fd, _payload(program, limits, nonce, uid), start + limits.timeout_s,
                          limits.max_output_bytes, _result_cap(program, limits))
    finally:
        kill_group_and_uid(proc.pid, uid)
        returncode, cpu_s = _reap(proc)
        os.close(result_fd)
    records = _records(cap.result, nonce)
    passed, reason, detail = _classify(program, limits, cap, records.get("done"), returncode, cpu_s)
    setup = records.get("setup") or {}
    return SandboxResult(
        passed, reason, detail, wall_s=time.monotonic() - start, cpu_s=cpu_s,
        startup_s=cap.setup_at - start if cap.setup_at else 0.0,
        stdout=cap.stdout.decode("utf-8", "replace"), stderr=cap.stderr.decode("utf-8", "replace"),
        returncode=returncode, network_isolation=str(setup.get("network", "unknown")),
        user_isolation=str(setup.get("user", "unknown")),
    )


def _spawn(limits: SandboxLimits, workdir: str) -> tuple[subprocess.Popen[bytes], int]:
    """The child in a new session (its own process group), cwd = workdir, with a result pipe on an extra fd.

    Confinement happens inside the child before it reads the candidate (child.py), not in a preexec_fn,
    which is unsafe in a threaded parent such as SandboxPool."""
    read_fd, write_fd = os.pipe()
    flags = ["-I", "-B"] if limits.site_packages else ["-I", "-B", "-S"]
    try:
        proc = subprocess.Popen(
            [limits.python or sys.executable or "python3", *flags, str(CHILD), str(write_fd)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(write_fd,),
            cwd=workdir, env={**BASE_ENV, "HOME": workdir, "TMPDIR": workdir}, start_new_session=True,
        )
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)  # the child's copy is the only writer left: its exit means EOF
    return proc, read_fd


def _payload(program: Program, limits: SandboxLimits, nonce: str, uid: int | None) -> bytes:
    """The child's input, marshalled: loading it needs no import (json would pull in re and enum)."""
    body = {
        "nonce": nonce, "uid": uid, "rlimits": limits.rlimits(), "style": program.style, "code": program.code,
        "prefix": program.prefix, "test": program.test, "entry_point": program.entry_point,
        "inputs": list(program.inputs), "max_output_bytes": limits.max_output_bytes,
        "per_test_s": limits.timeout_per_test_s, "prelude": prelude_source() if limits.prelude else "",
    }
    return marshal.dumps(body)


def _result_cap(program: Program, limits: SandboxLimits) -> int:
    # The verdict carries each stdio case's output (JSON escaping can grow text up to 6x).
    return 6 * limits.max_output_bytes * max(1, len(program.inputs)) + MIB


def _reap(proc: subprocess.Popen[bytes]) -> tuple[int, float]:
    """Wait for the (killed) child; its exit code and CPU seconds. Sets proc.returncode so Popen agrees."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
    return proc.returncode, usage.ru_utime + usage.ru_stime


def _records(data: bytearray, nonce: str) -> JsonRecord:
    """The first record of each kind that carries the nonce; lines without it
    (the candidate's) are ignored."""
    records: JsonRecord = {}
    token = nonce.encode()
    for line in bytes(data).split(b"\n"):
        head, _, rest = line.partition(b" ")
        if head != token:
            continue
        kind, _, body = rest.partition(b" ")
        try:
            records.setdefault(kind.decode(), json.loads(body))
        except ValueError:
            continue
    return records


def _classify(program: Program, limits: SandboxLimits, cap: Capture, done: Any, returncode: int,
              cpu_s: float) -> tuple[bool, str, str]:
    if cap.stopped == "output_limit":
        return False, "output_limit", f"more than {limits.max_output_bytes} bytes of output"
    if isinstance(done, dict):
        return _verdict(program, done, limits.output_match)
    if cap.stopped == "timeout":
        return False, "timeout", f"still running after {limits.timeout_s:g} s"
    if returncode < 0:
        sig = -returncode
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu_s >= limits.rlimits()["cpu_s"][0]):
            return False, "timeout", "CPU time limit"
        if sig == signal.SIGKILL:
            return False, "oom", "killed by the kernel (SIGKILL), most likely out of memory"
        return False, "crash", f"killed by {signal.Signals(sig).name}"
    return False, "crash", f"exited with code {returncode} before the tests finished"


def _verdict(program: Program, done: dict[str, Any], match: str) -> tuple[bool, str, str]:
    status, detail = done.get("status"), str(done.get("detail", ""))
    if status == "ran" and program.style == "stdio":
        return compare_outputs(done.get("outputs"), program.outputs, match)
    if status == "ok" and program.style == "functional":
        return True, "ok", ""
    if status in REASONS and status != "ok":
        return False, status, detail
    return False, "error", f"unexpected verdict {status!r}"


def normalize_output(text: str) -> list[str]:
    """Outputs compare as lines with trailing whitespace and leading/trailing blank lines removed."""
    return [line.rstrip() for line in text.strip().splitlines()]


def decimal_tokens(line: str) -> list[Decimal] | None:
    """The line's whitespace-separated tokens as Decimals, or None when one is not a number."""
    try:
        return [Decimal(token) for token in line.split()]
    except ArithmeticError:  # decimal.InvalidOperation
        return None


def lines_decimal_equal(got: str, want: str) -> bool:
    """LiveCodeBench's rule: both texts stripped and cut at newlines, each line stripped; as many lines, and
    each pair equal as text or as Decimal tokens (a line that is not all numbers must be equal as text)."""
    got_lines = [line.strip() for line in got.strip().split("\n")]
    want_lines = [line.strip() for line in want.strip().split("\n")]
    if len(got_lines) != len(want_lines):
        return False
    return all(a == b or _numbers_equal(a, b) for a, b in zip(got_lines, want_lines, strict=True))


def _numbers_equal(a: str, b: str) -> bool:
    x, y = decimal_tokens(a), decimal_tokens(b)
    try:
        return x is not None and y is not None and x == y
    except ArithmeticError:  # a signalling NaN refuses to compare
        return False


def outputs_equal(got: str, want: str, match: str = "lines") -> bool:
    """One case's output against the expected one under `match` (limits.OUTPUT_MATCHES)."""
    if match == "lines_decimal":
        return lines_decimal_equal(got, want)
    return normalize_output(got) == normalize_output(want)


def compare_outputs(outputs: Any, expected: tuple[str, ...], match: str = "lines") -> tuple[bool, str, str]:
    if not isinstance(outputs, list) or len(outputs) != len(expected):
        return False, "error", "the harness returned no output for some cases"
    for number, (got, want) in enumerate(zip(outputs, expected, strict=True), start=1):
        if not isinstance(got, str) or not outputs_equal(got, want, match):
            return False, "failed", f"case {number}: wrong output"
    return True, "ok", ""
