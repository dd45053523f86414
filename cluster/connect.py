"""Connecting to Ray, with the choice of cluster explicit and a dead one failing within a deadline.

- No address (neither the configured one nor RAY_ADDRESS): an embedded cluster (`address="local"`) with the
  configured CPUs, even when `ray start` ran on this machine (plain `ray.init()` would join that one, and
  then refuse the CPU count).
- An address (`auto`, `host:port`, `ray://host:port`) from the config or RAY_ADDRESS: that cluster is joined
  without resource arguments; `auto` means the one `ray start` recorded in its marker file.
- A cluster to join must answer (its GCS completes a gRPC handshake) within `timeout_s`, checked before
  `ray.init`, which would otherwise retry a dead address for many minutes: ConnectError names the address,
  where it came from and how to fix it.

Only a cluster this process started (or joined) is shut down on exit.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

LOCAL = "local"
CONFIG, ENVIRONMENT, MARKER = (
    "config (ray.address)",
    "environment (RAY_ADDRESS)",
    "the `ray start` marker file",
)


class ConnectError(RuntimeError):
    """The cluster to join cannot be used; the message names the address, its source and a fix."""


@dataclass(frozen=True)
class Target:
    """Where the driver's Ray lives: `address` is LOCAL (an embedded cluster) or what ray.init joins."""

    address: str
    source: str  # CONFIG | ENVIRONMENT | MARKER <path> | "default" (embedded)

    @property
    def embedded(self) -> bool:
        return self.address == LOCAL


def marker_file() -> Path:
    """Where `ray start` records its cluster's address (honours RAY_TMPDIR / TMPDIR, as Ray does)."""
    try:
        from ray._common.utils import get_ray_address_file

        return Path(get_ray_address_file(None))
    except ImportError:  # Ray moved its helper: the documented default
        return Path("/tmp/ray/ray_current_cluster")


def read_marker(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def choose(address: str, env: Mapping[str, str], marker: Path) -> Target:
    """The cluster to use: a configured `host:port` first, then RAY_ADDRESS, then a configured `auto` (the
    marker file); nothing given (or `local`) means an embedded cluster. Raises ConnectError for `auto` without
    a marker file."""
    address, from_env = address.strip(), env.get("RAY_ADDRESS", "").strip()
    if address and address != "auto":
        return Target(address, CONFIG)
    if from_env and from_env != "auto":
        return Target(from_env, ENVIRONMENT)
    if not address and not from_env:
        return Target(LOCAL, "default")
    recorded = read_marker(marker)
    if not recorded:
        who = CONFIG if address else ENVIRONMENT
        raise ConnectError(f"ray: address 'auto' (from {who}) means the cluster `ray start` recorded in "
                           f"{marker}, and there is none; start one with `ray start --head`, give its "
                           "address (ray.address=host:port), or drop the address to run an embedded cluster")
    return Target(recorded, f"{MARKER} {marker}")


def host_port(address: str) -> tuple[str, int]:
    """`host:port` of an address (`ray://` client addresses included); ValueError when there is no port."""
    rest = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{address!r} is not host:port")
    return host, int(port)


def answers(address: str, timeout_s: float) -> bool:
    """True when a gRPC server (Ray's GCS, or its client server for ray://) at `address` completes a
    handshake within `timeout_s`. A dead port, an unreachable host or a socket that is not gRPC is False."""
    import grpc  # ray[default] ships it; imported here so that `import cluster` stays light

    host, port = host_port(address)
    channel = grpc.insecure_channel(f"{host}:{port}")
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout_s)
        return True
    except grpc.FutureTimeoutError:
        return False
    finally:
        channel.close()


def dead_message(target: Target, timeout_s: float) -> str:
    fixes = {
        CONFIG: "fix ray.address (or drop it to run an embedded cluster)",
        ENVIRONMENT: "fix or unset RAY_ADDRESS (unset, the run starts an embedded cluster)",
    }
    fix = fixes.get(
        target.source,
        "its head died without `ray stop`: run `ray stop` or delete the marker "
        "file, then start a head with `ray start --head`, or drop ray.address=auto "
        "to run an embedded cluster",
    )
    return (f"ray: no Ray cluster answers at {target.address} (from {target.source}) within {timeout_s:g}s "
            f"(ray.connect_timeout_s); {fix}")


def local_note(marker: Path, probe_s: float = 1.0) -> str:
    """What the embedded-cluster line says about a `ray start` cluster on this machine, if one is recorded."""
    recorded = read_marker(marker)
    if not recorded:
        return ""
    try:
        live = answers(recorded, probe_s)
    except ValueError:
        live = False
    if live:
        return f"; a `ray start` cluster runs at {recorded} ({marker}): ray.address=auto joins it"
    return f"; {marker} names {recorded}, which does not answer (a head gone without `ray stop`)"


def init_kwargs(target: Target, num_cpus: int, include_dashboard: bool) -> dict[str, Any]:
    """ray.init arguments: resources only for the cluster we start, never for one we join."""
    if not target.embedded:
        return {"address": target.address}
    kwargs: dict[str, Any] = {"address": LOCAL, "include_dashboard": include_dashboard}
    if num_cpus:
        kwargs["num_cpus"] = num_cpus
    return kwargs


def open_cluster(address: str = "", num_cpus: int = 0, include_dashboard: bool = False,
                 timeout_s: float = 30.0, quiet: bool = False) -> Target:
    """Start or join the cluster `choose` picks (printing one line saying which); ConnectError when a cluster
    to join does not answer within `timeout_s`. `quiet`: Ray's own driver-side logging at ERROR only."""
    marker = marker_file()
    target = choose(address, os.environ, marker)
    if target.embedded:
        cpus = f"{num_cpus} CPUs" if num_cpus else "all CPUs"
        why = (
            "no ray.address or RAY_ADDRESS" if target.source == "default" else f"'local' from {target.source}"
        )
        print(f"ray: starting an embedded cluster ({cpus}; {why}){local_note(marker)}", flush=True)
    else:
        print(f"ray: joining the cluster at {target.address} (from {target.source})", flush=True)
        try:
            live = answers(target.address, timeout_s)
        except ValueError as e:
            raise ConnectError(f"ray: address {e} (from {target.source})") from None
        if not live:
            raise ConnectError(dead_message(target, timeout_s))
    try:
        ray.init(log_to_driver=True, logging_level=logging.ERROR if quiet else logging.INFO,
                 **init_kwargs(target, num_cpus, include_dashboard))
    except ConnectionError as e:  # it answered the handshake, then refused the driver (auth, version)
        raise ConnectError(f"ray: the cluster at {target.address} (from {target.source}) answered but "
                           f"refused this driver: {e}") from e
    return target


@contextlib.contextmanager
def connect(address: str = "", num_cpus: int = 0, include_dashboard: bool = False,
            timeout_s: float = 30.0, quiet: bool = False) -> Iterator[None]:
    """Start or join Ray for the duration of the block (a process already connected, as a Tune trial is,
    keeps its connection)."""
    if ray.is_initialized():
        yield
        return
    open_cluster(address, num_cpus, include_dashboard, timeout_s, quiet)
    try:
        yield
    finally:
        ray.shutdown()
