"""Process groups among the members of a Group (data-parallel learner ranks).

Members satisfy `CollectiveMember` (delegating to `rendezvous_address` and `join` here); the driver calls
`init_collective` once after the group starts. The backend is gloo on CPU and nccl on GPU; the caller picks.
"""

from __future__ import annotations

import datetime
import socket
from typing import TYPE_CHECKING, Protocol

import torch.distributed as dist

from cluster.member import Call

if TYPE_CHECKING:  # members import this module; only the driver needs Ray
    from torch import Tensor

    from cluster.group import Group


class CollectiveMember(Protocol):
    """What a member of a group with a process group among its members implements."""

    def rendezvous_address(self) -> tuple[str, int]:
        """A reachable address and free port on this member's node (asked of member 0)."""
        ...

    def join(
        self, backend: str, host: str, port: int, rank: int, world_size: int, timeout_s: float, /
    ) -> None:
        """Join the process group as `rank` of `world_size`."""
        ...


def node_address() -> str:
    """This process's node as the other nodes reach it: the IP Ray registered the node under (inside a Ray
    worker, or a driver connected to Ray), loopback in a process without Ray (in-process members only meet
    members of the same process). Not gethostbyname(gethostname()): on Debian-style hosts /etc/hosts maps
    the hostname to 127.0.1.1, which no other node reaches."""
    import ray

    return ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"


def rendezvous_address() -> tuple[str, int]:
    """A reachable address and free port on this member's node (called on rank 0)."""
    host = node_address()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return host, s.getsockname()[1]


def join(backend: str, host: str, port: int, rank: int, world_size: int, timeout_s: float) -> None:
    dist.init_process_group(
        backend, init_method=f"tcp://{host}:{port}", rank=rank, world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def all_reduce_sum(tensor: Tensor) -> None:
    """Sum `tensor` over the members of this process's group, in place (one collective)."""
    # One rank has nothing to sum (and a process's NCCL group, if any, cannot reduce host tensors).
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)


def init_collective(group: Group[CollectiveMember], backend: str, timeout_s: float) -> None:
    """Every member joins one process group."""
    if group.size < 2:
        return
    host, port = group.submit_to([0], CollectiveMember.rendezvous_address).result(timeout_s)[0]
    world = group.size
    group.submit_each([Call(CollectiveMember.join, backend, host, port, rank, world, timeout_s)
                       for rank in range(world)]).result(timeout_s)
