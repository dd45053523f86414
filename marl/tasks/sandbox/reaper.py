"""Leaving nothing behind: kill what a child left running and delete what it left on disk.

A child that ran under its own uid is found by that uid: every process still owned by it is killed (even
one that left the process group), and every entry it created at the top of the shared world-writable
directories is deleted. Without a dedicated uid only the process group is killed and only the temp dir
is removed.
"""

from __future__ import annotations

import os
import shutil
import signal
import time

# Where an unprivileged uid can create files outside its own temp dir on a typical Linux box.
SHARED_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm")
SWEEP_DEADLINE_S = 2.0  # bound on chasing processes that keep forking (RLIMIT_NPROC bounds them anyway)
SWEEP_PAUSE_S = 0.001


def processes_of(uid: int) -> list[int]:
    """Processes whose real uid is `uid` (zombies included), read from /proc."""
    found = []
    token = str(uid).encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                status = f.read(4096)
        except OSError:  # exited meanwhile
            continue
        for line in status.splitlines():
            if line.startswith(b"Uid:"):
                if line.split()[1:2] == [token]:
                    found.append(int(name))
                break
    return found


def kill_group_and_uid(leader: int, uid: int | None) -> None:
    """SIGKILL the child `leader` (a process group leader, not yet reaped), its group, and every process of
    `uid`, and return once none of them runs.

    Escaped descendants (only possible for code that bypassed the harness) are frozen, then killed while
    the frozen leader is still alive: it ignores SIGCHLD, so the kernel reaps them at once instead of
    leaving zombies for a PID 1 that may never reap them (some VM and container inits do not)."""
    # The usual case costs one /proc scan: the leader has exited and nothing else ran under the uid, so
    # nothing is left that could still fork.
    alone = uid is None or (set(processes_of(uid)) <= {leader} and _is_zombie(leader))
    if uid is not None and not alone:
        _signal_until_stable(uid, signal.SIGSTOP, spare=None)  # nothing can fork while we kill
        _signal_until_stable(uid, signal.SIGKILL, spare=leader)
    try:
        os.killpg(leader, signal.SIGKILL)  # the group id stays reserved until the leader is reaped
    except (ProcessLookupError, PermissionError):
        pass
    if uid is not None and not alone:
        _signal_until_stable(uid, signal.SIGKILL, spare=None)


def _signal_until_stable(uid: int, sig: int, spare: int | None) -> None:
    """Send `sig` to every process of `uid` but `spare` until a scan finds no new one (for SIGKILL: none
    left alive), or the deadline passes."""
    signalled: set[int] = set()
    deadline = time.monotonic() + SWEEP_DEADLINE_S
    while time.monotonic() < deadline:
        pids = [p for p in processes_of(uid) if p != spare and not (sig == signal.SIGKILL and _is_zombie(p))]
        fresh = [p for p in pids if p not in signalled or sig == signal.SIGKILL]
        if not fresh:
            return
        for pid in fresh:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        signalled.update(fresh)
        time.sleep(SWEEP_PAUSE_S)  # SIGKILL is delivered asynchronously; look again shortly


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return True  # gone


def remove_files_of(uid: int) -> int:
    """Delete entries owned by `uid` at the top of SHARED_WRITABLE; returns how many were removed."""
    removed = 0
    for root in SHARED_WRITABLE:
        try:
            entries = list(os.scandir(root))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)
                removed += 1
            except OSError:
                continue
    return removed
