"""The GPUs a run can use, as facts of the cluster's nodes, not of the process that asks: on the usual cluster
the driver runs on a CPU head node and the GPUs sit on worker nodes, so `torch.cuda.is_available()` in the
driver says nothing about them. Ray knows: every node reports its `GPU` count and, for NVIDIA GPUs, an
`accelerator_type:<type>` resource (H100, H200, ...; ray.util.accelerators).

`cluster_gpus()` reads the connected cluster's alive nodes (`ray.nodes()`), or, with no Ray connection, this
machine's own devices (torch). The memory per GPU comes from the device (locally) or from the accelerator type
(`MEMORY_BY_TYPE`, nominal sizes: a lower bound of what the device reports); a type not listed leaves it
unknown (0), and a planner then needs it declared.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

ACCELERATOR_PREFIX = "accelerator_type:"
# Nominal memory per GPU by Ray's accelerator type, in bytes (datasheets' GB, decimal: below the 79-140 GiB
# the devices report, so a plan made with it errs on the safe side). A100 is left out: Ray names the 40 GB and
# the 80 GB card alike.
MEMORY_BY_TYPE = {"H100": 80e9, "H200": 141e9, "H20": 96e9, "B200": 180e9, "L40S": 48e9, "L4": 24e9,
                  "A10G": 24e9, "T4": 16e9}


@dataclass(frozen=True)
class NodeGpus:
    """One node's GPUs: how many, of which accelerator type ("" unknown), bytes each (0 unknown)."""

    node: str  # Ray's node IP, or "local"
    gpus: float
    accelerator: str = ""
    memory: float = 0.0


@dataclass(frozen=True)
class ClusterGpus:
    """The GPUs of every node that has some."""

    nodes: tuple[NodeGpus, ...] = ()

    @property
    def total(self) -> float:
        return sum(n.gpus for n in self.nodes)

    @property
    def accelerators(self) -> tuple[str, ...]:
        """The accelerator types of the GPU nodes, each once, in node order."""
        return tuple(dict.fromkeys(n.accelerator for n in self.nodes if n.accelerator))

    def memory_per_gpu(self) -> float:
        """The smallest GPU's bytes (a plan must fit wherever Ray places a member), 0 when no GPU node's
        memory is known."""
        known = [n.memory for n in self.nodes if n.memory > 0]
        return min(known) if known and len(known) == len(self.nodes) else 0.0


def from_ray_nodes(nodes: Iterable[Mapping[str, Any]]) -> ClusterGpus:
    """The GPUs of `ray.nodes()`' alive entries (a node with no `GPU` resource has none)."""
    out = []
    for node in nodes:
        resources = node.get("Resources", {})
        if not node.get("Alive", True) or resources.get("GPU", 0) <= 0:
            continue
        types = [k[len(ACCELERATOR_PREFIX):] for k in resources if k.startswith(ACCELERATOR_PREFIX)]
        kind = types[0] if types else ""
        out.append(NodeGpus(node.get("NodeManagerAddress", ""), float(resources["GPU"]), kind,
                            MEMORY_BY_TYPE.get(kind, 0.0)))
    return ClusterGpus(tuple(out))


def local_gpus() -> ClusterGpus:
    """This machine's CUDA devices, as torch sees them."""
    import torch

    if not torch.cuda.is_available():
        return ClusterGpus()
    props = torch.cuda.get_device_properties(0)
    return ClusterGpus((NodeGpus("local", float(torch.cuda.device_count()), props.name,
                                 float(props.total_memory)),))


def cluster_gpus() -> ClusterGpus:
    """The connected Ray cluster's GPUs, or this machine's when no Ray connection is open."""
    import ray

    return from_ray_nodes(ray.nodes()) if ray.is_initialized() else local_gpus()
