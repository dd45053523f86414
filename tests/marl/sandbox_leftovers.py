"""What a sandbox execution could leave behind, and a fixture asserting it left nothing: shared by the
sandbox test modules."""

from __future__ import annotations

import glob
import os
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


def leftovers() -> dict[str, list]:
    """What an execution could leave behind: our children, processes of sandbox uids (zombies too), our
    sandbox temp dirs, and entries owned by sandbox uids in the shared writable dirs."""
    strays = [p.pid for p in psutil.process_iter(["uids"]) if p.info["uids"] and _sandbox_uid(p.info["uids"].real)]
    files = []
    for root in SHARED_WRITABLE:
        for entry in os.scandir(root):
            try:
                if _sandbox_uid(entry.stat(follow_symlinks=False).st_uid):
                    files.append(entry.path)
            except FileNotFoundError:
                continue
    return {
        "children": [p.pid for p in psutil.Process().children(recursive=True)],
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


