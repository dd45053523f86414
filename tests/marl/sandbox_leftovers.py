"""What a sandbox execution could leave behind, and a fixture asserting it left nothing: shared by the
sandbox test modules."""

from __future__ import annotations

import glob
import os
import re
import tempfile

import psutil
import pytest

from marl.tasks.sandbox import Program
from marl.tasks.sandbox.reaper import SHARED_WRITABLE
from marl.tasks.sandbox.runner import UID_BASE, UID_SPAN

ONE_TEST = "def check(candidate):\n    assert candidate() == 1\n"


def functional(code: str, test: str = ONE_TEST) -> Program:
    return Program(code=code, test=test, entry_point="f")


def _sandbox_uid(uid: int) -> bool:
    return UID_BASE <= uid < UID_BASE + UID_SPAN


def _other_runs_workdir(name: str) -> bool:
    """A sandbox workdir of another process (a concurrent test run on the same machine): not ours to judge."""
    m = re.match(r"marl-sandbox-(\d+)-", name)
    return m is not None and int(m[1]) != os.getpid()


def _ray_process(proc: psutil.Process) -> bool:
    """A process of a Ray cluster an earlier test started in this process: its workers start (and exit) at
    Ray's pace, on any test's watch, so they are not an execution's leftovers."""
    try:
        return any("ray" in part for part in proc.cmdline()[:2]) or proc.name() in ("raylet", "gcs_server")
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def _our_descendants() -> list[int]:
    """Our descendants, less Ray's and everything under them."""
    out: list[int] = []
    todo = psutil.Process().children()
    while todo:
        proc = todo.pop()
        if _ray_process(proc):
            continue
        out.append(proc.pid)
        try:
            todo.extend(proc.children())
        except psutil.NoSuchProcess:
            continue
    return sorted(out)


def leftovers() -> dict[str, list]:
    """What an execution could leave behind: our children (Ray's aside), processes of sandbox uids (zombies
    too), our sandbox temp dirs, and entries owned by sandbox uids in the shared writable dirs (other runs'
    sandbox workdirs aside)."""
    strays = [
        p.pid for p in psutil.process_iter(["uids"]) if p.info["uids"] and _sandbox_uid(p.info["uids"].real)
    ]
    files = []
    for root in SHARED_WRITABLE:
        for entry in os.scandir(root):
            try:
                if _sandbox_uid(entry.stat(follow_symlinks=False).st_uid) and not _other_runs_workdir(
                    entry.name
                ):
                    files.append(entry.path)
            except FileNotFoundError:
                continue
    return {
        "children": _our_descendants(),
        "sandbox_processes": strays,
        "dirs": glob.glob(os.path.join(tempfile.gettempdir(), f"marl-sandbox-{os.getpid()}-*")),
        "files": files,
    }


@pytest.fixture(autouse=True)
def machine_unharmed():
    before = leftovers()
    yield
    after = leftovers()
    assert after == {k: [v for v in after[k] if v in before[k]] for k in after}, f"left behind: {after}"


