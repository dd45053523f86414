"""A real Ray head on loopback, started by `ray start` in its own session with free ports, for tests that need
a cluster that outlives the driver (`ray job submit`, a driver joining by address, a SIGKILLed driver)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HeadExited(RuntimeError):
    """`ray start` ended before its head answered."""


class Head:
    """A Ray head this test started (its own session, so every process of it can be ended by group id).

    Its files live in `tmp`, which is also where `ray start` writes its marker file
    (`tmp/ray_current_cluster`): a driver with RAY_TMPDIR=<tmp's parent> finds it there,
    and /tmp/ray is left alone."""

    def __init__(self, tmp: Path, num_cpus: int = 2):
        tmp.mkdir(parents=True, exist_ok=True)
        self.tmp = tmp
        self.log = tmp.parent / f"{tmp.name}.log"  # outside the temp dir: Ray may clear that one
        self.port, self.dash = free_port(), free_port()
        self.address, self.dashboard = f"127.0.0.1:{self.port}", f"http://127.0.0.1:{self.dash}"
        # Token auth is on whenever ~/.ray/auth_token exists (any earlier ray.init writes it): this cluster
        # and every client of it run without. The job's `python` is the first on this PATH: the project's.
        self.env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PATH": f"{BIN}:{os.environ['PATH']}",
                    "MARL_CACHE": os.environ.get("MARL_CACHE", str(ROOT / ".cache" / "marl"))}
        self.env.pop("RAY_ADDRESS", None)
        # Every fixed default port gets a free one: other Ray clusters on this machine may hold the defaults.
        ports = [f"--{flag}={free_port()}" for flag in (
            "dashboard-agent-listen-port", "dashboard-agent-grpc-port", "metrics-export-port",
            "runtime-env-agent-port", "ray-client-server-port", "node-manager-port", "object-manager-port")]
        with self.log.open("wb") as out:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(
                [
                    str(BIN / "ray"),
                    "start",
                    "--head",
                    "--block",
                    f"--port={self.port}",
                    f"--num-cpus={num_cpus}",
                    "--include-dashboard=true",
                    "--dashboard-host=127.0.0.1",
                    f"--dashboard-port={self.dash}",
                    *ports,
                    f"--temp-dir={tmp}",
                    "--disable-usage-stats",
                ],
                env=self.env,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def marker(self) -> Path:
        return self.tmp / "ray_current_cluster"

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def ray(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(BIN / "ray"), *args], env=self.env, cwd=ROOT, capture_output=True, text=True, timeout=timeout
        )

    def wait_up(self, deadline_s: float = 120) -> None:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise HeadExited(f"ray start exited with {self.proc.returncode}:\n{self.log_tail()}")
            if self.ray("job", "list", "--address", self.dashboard, timeout=30).returncode == 0:
                return
            time.sleep(1)
        raise TimeoutError("the Ray head did not come up")

    def stop(self) -> None:
        """End every process of the head's session (never `ray stop`: it ends every Ray on the machine)."""
        for sig, wait_s in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                continue
        try:  # the head's children share its process group: take any straggler too
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def close(self) -> None:
        """Stop the head and remove its files."""
        self.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.log.unlink(missing_ok=True)


def start_head(attempts: int = 3, tmp: Path | None = None, num_cpus: int = 2) -> Head:
    """A head that answers. Ports are picked free, then released before `ray start` binds them: another
    process may take one in between, and `ray start` then exits. Such a start is retried with fresh
    ports; the last failure is raised with its log. `tmp`: the head's temp dir (short: Ray's socket
    paths have a length limit)."""
    for attempt in range(1, attempts + 1):
        h = Head(tmp or Path("/tmp") / f"rayjob_{uuid.uuid4().hex[:6]}", num_cpus)
        try:
            h.wait_up()
            return h
        except BaseException as e:
            h.close()
            if not isinstance(e, HeadExited) or attempt == attempts:
                raise
            print(f"ray start failed (attempt {attempt}), retrying with fresh ports: {e}", file=sys.stderr)
    raise AssertionError("unreachable")
