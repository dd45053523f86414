"""Hostile programs in the code sandbox: each is contained with reward 0 and its reason recorded, and leaves
no process (zombies included), file or temp dir behind (the autouse fixture). Every attempt to fake a pass
runs next to a benign control that passes the same tests, so a broken harness cannot hide. Every test runs
twice: under the sandbox's defaults, and under the paper's grader settings (paper_base.yaml's per-test limit,
prelude, output comparison and site-packages) on top of the limits the test sets."""

from __future__ import annotations

import os
import secrets
import socket
import stat
import tempfile
from pathlib import Path

import pytest
from sandbox_leftovers import functional, machine_unharmed  # noqa: F401 - machine_unharmed is autouse

from marl.tasks.sandbox import Program, SandboxLimits, run

GRADER_KEYS = ("timeout_per_test_s", "prelude", "output_match", "site_packages")


def paper_section() -> dict:
    """paper_base.yaml's data.sandbox section."""
    import yaml

    return yaml.safe_load(Path("jobs/configs/sweeps/paper_base.yaml").read_text())["data"]["sandbox"]


@pytest.fixture(params=["defaults", "paper"])
def limits(request):
    """SandboxLimits(**kw), under the paper's grader settings where the test does not set them itself."""
    grader = (
        {k: v for k, v in paper_section().items() if k in GRADER_KEYS} if request.param == "paper" else {}
    )
    return lambda **kw: SandboxLimits(**{**grader, **kw})


@pytest.mark.parametrize("code", ["while True:\n    pass\n", "def f():\n    while True:\n        pass\n",
                                  "import time\ndef f():\n    time.sleep(60)\n"])
def test_infinite_loops_time_out(code, limits):
    result = run(functional(code), limits(timeout_s=1.0))
    assert result.reason == "timeout" and not result.passed
    assert result.wall_s < 5


@pytest.mark.parametrize(
    "create",
    [
        "os.fork()",
        "os.system('sleep 60')",
        "subprocess.Popen(['sleep', '60'])",
        "os.execv('/bin/sleep', ['60'])",
        "multiprocessing.Process(target=time.sleep, args=(60,)).start()",
        "pty.fork()",
    ],
)
def test_process_creation_is_refused(create, limits):
    code = f"import multiprocessing, os, pty, subprocess, time\ndef f():\n    {create}\n    return 1\n"
    result = run(functional(code), limits(timeout_s=3.0))
    assert result.reason == "failed" and "process creation is disabled" in result.detail


BYPASSING_FORK_BOMB = (
    "import importlib, sys\n"
    "sys.modules.pop('posix')\n"
    "fork = importlib.import_module('posix').fork\n"  # a fresh module: the harness never patched it
    "def f():\n"
    "    children = 0\n"
    "    for _ in range(50):\n"  # bounded, so a broken limit cannot take the machine down
    "        try:\n"
    "            pid = fork()\n"
    "        except OSError as e:\n"
    "            {then}\n"
    "        if pid == 0:\n"
    "            while True:\n"
    "                pass\n"
    "        children += 1\n"
    "    return 1\n"
)


def test_fork_bomb_is_bounded_by_the_kernel_when_the_harness_is_bypassed(limits):
    # RLIMIT_NPROC on the sandbox's own uid stops it after max_processes - 1 children.
    code = BYPASSING_FORK_BOMB.format(then="raise AssertionError(f'forked {children}, then errno {e.errno}')")
    result = run(functional(code), limits(timeout_s=3.0, max_processes=4))
    assert result.reason == "failed" and "forked 3, then errno 11" in result.detail  # EAGAIN


def test_forked_children_of_a_hanging_program_are_killed_and_reaped(limits):
    code = BYPASSING_FORK_BOMB.format(then="while True:\n                pass")
    result = run(functional(code), limits(timeout_s=1.0, max_processes=4))
    assert result.reason == "timeout"  # and the fixture finds no process (zombies included) left


@pytest.mark.parametrize(
    "code",
    [
        "x = bytearray(50 * 2**30)\n",
        "def f():\n    hog = []\n    while True:\n        hog.append(bytearray(2**24))\n",
    ],
)
def test_memory_bombs_hit_the_address_space_limit(code, limits):
    result = run(functional(code), limits(timeout_s=5.0, memory_mb=512))
    assert result.reason == "oom" and not result.passed


def test_a_10_gb_file_stops_at_the_file_size_limit(limits):
    code = ("def f():\n    with open('big', 'wb') as out:\n        for _ in range(10 * 1024):\n"
            "            out.write(bytes(2**20))\n    return 1\n")
    result = run(functional(code), limits(timeout_s=5.0, file_size_mb=8))
    assert result.reason == "failed" and "File too large" in result.detail


def test_files_outside_the_sandbox_cannot_be_deleted_and_stray_files_are_removed(tmp_path, limits):
    private = tmp_path / "canary.txt"  # under pytest's 0700 dir
    private.write_text("keep")
    with tempfile.TemporaryDirectory(dir="/tmp") as shared:  # world-traversable, root-owned
        os.chmod(shared, 0o755)
        public = Path(shared) / "canary.txt"
        public.write_text("keep")
        stray = f"/tmp/marl-escape-{secrets.token_hex(4)}"
        code = (
            "import os, shutil\n"
            f"open({stray!r}, 'w').write('left behind')\n"
            "def f():\n"
            "    errors = []\n"
            f"    for action in (lambda: os.remove({str(private)!r}), lambda: os.remove({str(public)!r}),\n"
            f"                   lambda: os.chmod({str(public)!r}, 0o777), lambda: "
            f"shutil.rmtree({shared!r})):\n"
            "        try:\n"
            "            action()\n"
            "        except OSError as e:\n"
            "            errors.append(e.errno)\n"
            "    assert False, errors\n"
        )
        result = run(functional(code), limits(timeout_s=3.0))
        assert public.read_text() == "keep" and stat.S_IMODE(public.stat().st_mode) == 0o644
    assert private.read_text() == "keep"
    assert result.reason == "failed" and "[13, 13, 1, 13]" in result.detail  # EACCES, EACCES, EPERM, EACCES
    assert not os.path.exists(stray)


@pytest.mark.parametrize(
    "program",
    [
        functional("def f():\n    for _ in range(10**4):\n        print('x' * 10**5)\n    return 1\n"),
        functional("import sys\nwhile True:\n    sys.stderr.write('y' * 10**5)\n"),
        Program(
            code="for _ in range(10**4):\n    print('x' * 10**5)\n",
            style="stdio",
            inputs=("",),
            outputs=("",),
        ),
    ],
)
def test_printing_a_gigabyte_hits_the_output_cap(program, limits):
    result = run(program, limits(timeout_s=5.0, max_output_bytes=2**20))
    assert result.reason == "output_limit" and not result.passed
    assert len(result.stdout) + len(result.stderr) <= 2 * 64 * 1024  # only the head is kept


@pytest.mark.parametrize(("code", "reason"), [
    ("import sys\nprint('PASS')\nsys.exit(0)\n", "failed"),
    ("def f():\n    raise SystemExit(0)\n", "failed"),
    ("import os\nprint('PASS')\nos._exit(0)\n", "crash"),
    ("import os\ndef f():\n    os._exit(0)\n", "crash"),
    # indistinguishable from the OOM killer
    ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", "oom"),
])
def test_exiting_early_cannot_fake_a_pass(code, reason, limits):
    result = run(functional(code), limits(timeout_s=3.0))
    assert result.reason == reason and not result.passed


@pytest.mark.parametrize(
    "code",
    [
        # An object equal to everything.
        "class Always:\n    def __eq__(self, other):\n        return True\ndef f():\n    return Always()\n",
        # A subclass of int whose __eq__ lies: compared as the plain int 0.
        "class Liar(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n"
        "def f():\n    return Liar(0)\n",
        # Patched builtins the test uses, and the harness's own exec.
        "import builtins\nbuiltins.abs = lambda x: 0\nbuiltins.exec = lambda *a: None\n"
        "def f():\n    return 5\n",
        # Its own check() (the task's replaces it), a trace hook, a fake verdict on every fd, the
        # harness module.
        "def check(candidate):\n    pass\ndef f():\n    return 5\n",
        "import sys\nsys.settrace(lambda *a: None)\ndef f():\n    return 1\n",
        "import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'x' * 32 + b' done {\"status\": "
        "\"ok\"}\\n')\n"
        "    except OSError:\n        pass\nos._exit(0)\n",
        "import __main__\n__main__.run_functional = lambda *a: {'status': 'ok'}\ndef f():\n    return 5\n",
        # Builtins patched while the tests run, to rewrite the failing verdict as it is serialised.
        "import builtins\ndef f():\n    builtins.type = lambda x: int\n"
        "    builtins.repr = lambda x: '{\"status\": \"ok\"}'\n    return 5\n",
    ],
)
def test_tampering_cannot_fake_a_pass(code, limits):
    test = "def check(candidate):\n    assert abs(candidate() - 1) < 1e-9\n    assert candidate() == 1\n"
    assert run(functional("def f():\n    return 1\n", test), limits(timeout_s=3.0)).passed  # the control
    result = run(functional(code, test), limits(timeout_s=3.0))
    assert not result.passed and result.reason in ("failed", "crash"), result


def test_plain_values_are_compared_as_their_base_types(limits):
    code = ("import collections\nPoint = collections.namedtuple('Point', 'x y')\n"
            "def f():\n    return [collections.Counter('aab'), Point(1, 2), collections.OrderedDict(a=1)]\n")
    test = "def check(candidate):\n    assert candidate() == [{'a': 2, 'b': 1}, (1, 2), {'a': 1}]\n"
    assert run(functional(code, test), limits(timeout_s=3.0)).passed


def test_network_is_unreachable_even_when_the_socket_block_is_bypassed(limits):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    port = listener.getsockname()[1]
    code = (
        "import importlib, sys\n"
        "def connect(module, host, port):\n"
        "    try:\n"
        "        module.create_connection((host, port), timeout=2).sendall(b'escaped')\n"
        "        return 'connected'\n"
        "    except OSError as e:\n"
        "        return f'{type(e).__name__}:{e.errno}'\n"
        "def f():\n"
        "    import socket\n"
        f"    plain = [connect(socket, h, p) for h, p in (('127.0.0.1', {port}), ('8.8.8.8', 53))]\n"
        "    for name in ('socket', '_socket'):\n"
        "        sys.modules.pop(name)\n"
        "    fresh = importlib.import_module('socket')\n"
        f"    bypass = [connect(fresh, h, p) for h, p in (('127.0.0.1', {port}), ('8.8.8.8', 53))]\n"
        "    assert False, (plain, bypass)\n"
    )
    try:
        result = run(functional(code), limits(timeout_s=5.0))
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody connected
    finally:
        listener.close()
    assert result.network_isolation == "namespace"
    # The harness refuses sockets (errno None); past it, the empty namespace has no route (ENETUNREACH).
    expected = "(['PermissionError:None', 'PermissionError:None'], ['OSError:101', 'OSError:101'])"
    assert result.reason == "failed" and expected in result.detail


def test_the_parents_secrets_are_out_of_reach(monkeypatch, limits):
    token = secrets.token_hex(8)
    monkeypatch.setenv("MARL_TEST_SECRET", token)
    code = (
        "import os\n"
        "print(dict(os.environ))\n"
        "def f():\n"
        "    found = repr(dict(os.environ))\n"
        "    try:\n"
        "        found += open(f'/proc/{os.getppid()}/environ', 'rb').read().decode('latin-1')\n"
        "    except OSError as e:\n"
        "        found += f'errno {e.errno}'\n"
        "    return found\n"
    )
    test = f"def check(candidate):\n    assert {token!r} in candidate(), candidate()\n"
    result = run(functional(code, test), limits(timeout_s=3.0))
    assert not result.passed and token not in result.stdout + result.detail
    assert "errno 13" in result.detail and "'PATH'" in result.stdout  # the scrubbed environment is all it saw


def test_environment_holds_only_the_scrubbed_variables(limits):
    code = "import os\ndef f():\n    return sorted(os.environ)\n"
    test = "def check(candidate):\n    assert candidate() == ['HOME', 'LANG', 'LC_ALL', 'PATH', 'TMPDIR']\n"
    assert run(functional(code, test), limits(timeout_s=3.0)).passed


def paper_limits() -> SandboxLimits:
    """The sandbox limits of the paper matrix's code cells (paper_base.yaml; the rest are the defaults)."""
    return SandboxLimits(**{k: v for k, v in paper_section().items() if k != "workers"})


def test_the_paper_s_longer_limits_still_contain_bombs():
    limits = paper_limits()
    assert (limits.timeout_s, limits.timeout_per_test_s, limits.memory_mb) == (120.0, 3.0, 4096)
    assert (limits.prelude, limits.output_match, limits.site_packages) == (True, "lines_decimal", True)
    assert run(functional("x = bytearray(50 * 2**30)\n"), limits).reason == "oom"
    code = BYPASSING_FORK_BOMB.format(then="raise AssertionError(f'forked {children}, then errno {e.errno}')")
    result = run(functional(code), limits)
    assert result.reason == "failed" and "forked 3, then errno 11" in result.detail
    result = run(functional("while True:\n    pass\n"), limits)  # 3 s per test, not the 9 s wall
    assert result.reason == "timeout" and "3 s per-test limit" in result.detail and result.wall_s < 6
