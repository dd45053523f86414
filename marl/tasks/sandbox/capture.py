"""Talking to a running child: feed it the payload, read stdout / stderr / the result channel with caps,
and notice when it exits or runs past its deadline. One selector loop, no threads, no sleeps."""

from __future__ import annotations

import os
import selectors
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

KEEP_BYTES = 64 * 1024  # how much of stdout / stderr is kept for the result
CHUNK = 64 * 1024


@dataclass
class Capture:
    """What the parent saw. `stopped` is why it had to stop the child ('timeout',
    'output_limit'), else None."""

    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    result: bytearray = field(default_factory=bytearray)
    output_bytes: int = 0  # stdout + stderr bytes seen, kept or not
    stopped: str | None = None
    exited: bool = False
    setup_at: float | None = None  # monotonic time the first result record arrived


def communicate(proc: subprocess.Popen[bytes], result_fd: int, payload: bytes, deadline: float,
                max_output: int, max_result: int) -> Capture:
    """Run the loop until the child exited and its pipes closed, or it must be stopped."""
    cap = Capture()
    with selectors.DefaultSelector() as sel:
        pidfd = _register(sel, proc, result_fd)
        try:
            _loop(sel, cap, payload, deadline, max_output, max_result)
        finally:
            if pidfd is not None:
                os.close(pidfd)
    return cap


def _loop(sel: selectors.BaseSelector, cap: Capture, payload: bytes, deadline: float, max_output: int,
          max_result: int) -> None:
    sent = 0
    while _waiting(sel):
        now = time.monotonic()
        if now >= deadline:
            cap.stopped = "timeout"
            return
        # Once the child has exited, everything it wrote is already in the pipes: drain without waiting,
        # since a pipe still open then is held only by an escaped descendant.
        events = sel.select(0 if cap.exited else deadline - now)
        if cap.exited and not events:
            return
        for key, _ in events:
            if key.data == "stdin":
                sent = _feed(sel, key.fileobj, payload, sent)
            elif key.data == "exit":
                sel.unregister(key.fileobj)
                cap.exited = True
            else:
                _read(sel, key, cap)
        if cap.output_bytes > max_output or len(cap.result) > max_result:
            cap.stopped = "output_limit"
            return


def _register(sel: selectors.BaseSelector, proc: subprocess.Popen[bytes], result_fd: int) -> int | None:
    """Register the child's pipes and, where the OS has one, a pidfd; returns the pidfd to close after."""
    stdin, stdout, stderr = proc.stdin, proc.stdout, proc.stderr
    assert stdin is not None and stdout is not None and stderr is not None  # runner._spawn pipes all three
    os.set_blocking(stdin.fileno(), False)  # a payload larger than the pipe must not block the loop
    sel.register(stdin, selectors.EVENT_WRITE, "stdin")
    sel.register(stdout, selectors.EVENT_READ, "stdout")
    sel.register(stderr, selectors.EVENT_READ, "stderr")
    sel.register(result_fd, selectors.EVENT_READ, "result")
    try:
        # A pidfd turns readable when the child exits, before a reap, so the pid stays reserved meanwhile.
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        # Linux < 5.3: EOF on the pipes ends the loop, so a child that closes them and keeps running is
        # stopped then (and reported as a crash, not a timeout).
        return None
    sel.register(pidfd, selectors.EVENT_READ, "exit")
    return pidfd


def _waiting(sel: selectors.BaseSelector) -> bool:
    """Something is still open that the child may write to or exit from."""
    return any(key.data != "stdin" for key in sel.get_map().values())


def _feed(sel: selectors.BaseSelector, stdin: Any, payload: bytes, sent: int) -> int:
    try:
        sent += os.write(stdin.fileno(), payload[sent : sent + CHUNK])
    except (BrokenPipeError, BlockingIOError) as e:
        if isinstance(e, BlockingIOError):
            return sent
        sent = len(payload)  # the child is gone or closed stdin; what it did instead shows in the result
    if sent >= len(payload):
        sel.unregister(stdin)
        stdin.close()  # EOF: the child reads the payload to the end
    return sent


def _read(sel: selectors.BaseSelector, key: selectors.SelectorKey, cap: Capture) -> None:
    fd = key.fileobj if isinstance(key.fileobj, int) else key.fileobj.fileno()
    chunk = os.read(fd, CHUNK)
    if not chunk:
        sel.unregister(key.fileobj)
        return
    if key.data == "result":
        cap.result += chunk
        if cap.setup_at is None:
            cap.setup_at = time.monotonic()
        return
    cap.output_bytes += len(chunk)
    kept = cap.stdout if key.data == "stdout" else cap.stderr
    kept += chunk[: max(0, KEEP_BYTES - len(kept))]
