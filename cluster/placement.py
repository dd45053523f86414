"""Placement groups: the bundles a set of member groups needs, one placement group holding them all, and
the bundle each member is scheduled into.

Plain resource dicts in (Ray resource name -> amount per member), nothing about what the members are. A run
either creates its own placement group (and releases it at shutdown) or, when it already runs inside one
(a Ray Tune trial, whose placement group was requested with the same layout behind a head bundle of its
own), schedules its members into that one's bundles.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import ray
from ray.util.placement_group import (
    PlacementGroup,
    get_current_placement_group,
    placement_group,
    placement_group_table,
    remove_placement_group,
)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from cluster.bundles import STRATEGIES, Demand, Layout, layout
from cluster.stop import wait_refs


class PlacementError(RuntimeError):
    """The cluster cannot hold the placement group (or the current one does not match the layout)."""


@dataclass(frozen=True)
class GroupPlacement:
    """Where the members of one group go: member i into bundle `indices[i]` of `pg`, holding `bundles[i]`."""

    pg: PlacementGroup
    indices: list[int]
    bundles: list[dict[str, float]]

    def node_gone(self, member: int) -> str | None:
        """Why member `member`'s bundle has no live node (None when it has one): a member lost with its node
        cannot be replaced in its bundle until the placement group finds another node for it."""
        node = placement_group_table(self.pg)["bundles_to_node_id"].get(self.indices[member])
        if not node:  # Ray unassigns the bundles of a dead node while it looks for another
            return "its bundle lost its node"
        return None if node in alive_nodes() else f"node {node} of its bundle is gone"

    def strategy(self, member: int) -> PlacementGroupSchedulingStrategy:
        # Children of a member (e.g. its own helper tasks) are not captured: they are not part of the layout.
        return PlacementGroupSchedulingStrategy(placement_group=self.pg,
                                                placement_group_bundle_index=self.indices[member],
                                                placement_group_capture_child_tasks=False)


def alive_nodes() -> dict[str, str]:
    """Node id -> address of every node the cluster counts as alive."""
    return {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}


class RunPlacement:
    """The placement group of one run and each group's bundles in it; `nodes` are the bundles' nodes when the
    group became ready (bundle index -> node id), to name what a lost node took along."""

    def __init__(self, pg: PlacementGroup, plan: Layout, owned: bool):
        self.pg, self.layout, self.owned = pg, plan, owned
        self.nodes: dict[int, str] = dict(placement_group_table(pg)["bundles_to_node_id"])

    def lost_members(self) -> list[str]:
        """`<group>:<i> on node <id>` for every member placed on a node that is no longer alive."""
        alive = alive_nodes()
        return [f"{name}:{i} on node {self.nodes[b]}" for name, idx in self.layout.indices.items()
                for i, b in enumerate(idx) if self.nodes.get(b) is not None and self.nodes[b] not in alive]

    def group(self, name: str) -> GroupPlacement | None:
        """`name`'s bundles, or None for a group without members in the layout (in-process groups)."""
        if name not in self.layout.indices:
            # A group built outside the layout would escape the placement group (and a trial's accounting).
            raise PlacementError(f"placement: no bundles were laid out for group {name!r}; "
                                 f"laid out: {sorted(self.layout.indices)}")
        idx = self.layout.indices[name]
        if not idx:
            return None
        # what each member asks for: its own share of a bundle it may share with other groups' members
        return GroupPlacement(self.pg, idx, self.layout.requests[name])

    def release(self) -> None:
        """Remove the placement group if this run created it (a Tune trial's belongs to Tune)."""
        if self.owned:
            remove_placement_group(self.pg)
            self.owned = False


def place(demands: Sequence[Demand], strategy: str = "PACK", timeout_s: float = 60.0,
          name: str = "") -> RunPlacement | None:
    """One placement group for all members of `demands`, ready before any member starts.

    Inside a placement group already (a Tune trial) its bundles after the head bundle are used instead.
    None when no group has members (everything in-process). Raises PlacementError naming the shortfall
    when the cluster cannot hold the placement group within `timeout_s`.
    """
    if not any(d.n for d in demands):
        return None
    current = get_current_placement_group()
    if current is not None:
        return _adopt(current, demands)
    if strategy not in STRATEGIES:
        raise PlacementError(f"placement: strategy must be one of {', '.join(STRATEGIES)}; got {strategy!r}")
    plan = layout(demands)
    pg = placement_group(plan.bundles, strategy=strategy, name=name)
    try:
        if wait_refs([pg.ready()], timeout_s):
            raise PlacementError(shortfall(demands, plan, strategy, timeout_s, name))
    except BaseException:  # too late, or a stop while waiting: the group is not left reserved
        remove_placement_group(pg)
        raise
    return RunPlacement(pg, plan, owned=True)


def _adopt(current: PlacementGroup, demands: Sequence[Demand]) -> RunPlacement:
    """Use the enclosing placement group: its bundle 0 hosts the caller, the rest must be this layout."""
    specs = current.bundle_specs
    plan = layout(demands, head=specs[0])
    mismatch = [i for i, b in enumerate(plan.bundles) if i >= len(specs) or not _holds(specs[i], b)]
    if mismatch or len(specs) != len(plan.bundles):
        raise PlacementError(
            f"placement: the current placement group has bundles {specs[1:]} but the groups "
            f"{[d.name for d in demands if d.n]} need {plan.bundles[1:]} (request it with the same layout)")
    return RunPlacement(current, plan, owned=False)


def _holds(have: Mapping[str, float], need: Mapping[str, float]) -> bool:
    return all(have.get(k, 0.0) >= v for k, v in need.items())


def shortfall(demands: Sequence[Demand], plan: Layout, strategy: str, timeout_s: float, name: str) -> str:
    """Why a placement group could not be placed: each resource asked for vs the cluster's total."""
    total: dict[str, float] = {}
    for b in plan.bundles:
        for k, v in b.items():
            total[k] = total.get(k, 0.0) + v
    cluster, free = ray.cluster_resources(), ray.available_resources()
    short = [k for k, v in total.items() if v > cluster.get(k, 0.0) + 1e-9]
    lines = [f"placement: the cluster cannot hold placement group {name!r} ({len(plan.bundles)} bundles, "
             f"strategy {strategy}) within {timeout_s:g}s."]
    for k in short or sorted(total):
        askers = [
            f"{d.name} ({d.n} x {d.resources.get(k, 0.0):g})" for d in demands if d.resources.get(k, 0.0) > 0
        ]
        lines.append(f"  {k}: needs {total[k]:g}, cluster has {cluster.get(k, 0.0):g} "
                     f"({free.get(k, 0.0):g} free); asked by {', '.join(askers) or 'token shares'}")
    if not short:
        lines.append("  every total fits: the resources are in use, or no node mix satisfies the strategy "
                     f"(nodes alive: {len(alive_nodes())})")
    return "\n".join(lines)
