"""Process groups among the members of a Group (data-parallel learner ranks).

Members delegate to `rendezvous_address` and `join`; the driver calls `init_collective` once after the
group starts. The backend is gloo on CPU and nccl on GPU; the caller picks.
"""

from __future__ import annotations

import datetime
import socket
from typing import TYPE_CHECKING

import torch.distributed as dist

if TYPE_CHECKING:  # members import this module; only the driver needs Ray
    from cluster.group import Group


def rendezvous_address() -> tuple[str, int]:
    """A reachable address and free port on this member's node (called on rank 0)."""
    host = socket.gethostbyname(socket.gethostname())
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return host, s.getsockname()[1]


def join(backend: str, host: str, port: int, rank: int, world_size: int, timeout_s: float) -> None:
    dist.init_process_group(
        backend, init_method=f"tcp://{host}:{port}", rank=rank, world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def init_collective(group: Group, backend: str, timeout_s: float) -> None:
    """Every member joins one process group; members implement `rendezvous_address()` and `join(...)`."""
    if group.size < 2:
        return
    host, port = group.call("rendezvous_address", indices=[0], timeout=timeout_s)[0]
    args = [(backend, host, port, rank, group.size, timeout_s) for rank in range(group.size)]
    group.submit_each("join", args).result(timeout_s)
