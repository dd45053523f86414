"""What a run asks the cluster for, before any of it is placed: each group's members and their resources
(`Demand`), and the bundles of one placement group in order (`Layout`). Pure data and arithmetic, no Ray, so
the planner and the run layout read it on a machine without Ray; cluster/placement.py places it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
# Ray refuses a bundle whose amounts are all zero, yet a member that asks for nothing still needs a bundle
# of its own to be scheduled into: it gets this token CPU share.
TOKEN_CPU = 0.01


@dataclass(frozen=True)
class Demand:
    """`n` members of the group `name`, each needing `resources`."""

    name: str
    n: int
    resources: Mapping[str, float]
    # Groups with the same non-empty `share` put member i into one bundle i that holds all their members'
    # resources (a colocated layout: engine i and learner rank i on one GPU); "" = bundles of its own.
    share: str = ""


@dataclass(frozen=True)
class Layout:
    """Bundles in placement-group order; `indices[name]` is the bundle index of each member of `name`."""

    bundles: list[dict[str, float]]
    indices: dict[str, list[int]]
    # each member's own resources (what its actor asks for inside its bundle); a shared bundle holds several
    requests: dict[str, list[dict[str, float]]]


def bundle(resources: Mapping[str, float]) -> dict[str, float]:
    """One member's bundle: zero amounts dropped (Ray rejects them), a token CPU share if nothing is left."""
    out = {k: float(v) for k, v in resources.items() if v > 0}
    return out or {"CPU": TOKEN_CPU}


def layout(demands: Sequence[Demand], head: Mapping[str, float] | None = None) -> Layout:
    """Bundles for every member of every demand, in order, after an optional `head` bundle (bundle 0); groups
    of one `share` key fill the same bundles, one per member index (ValueError if their sizes differ)."""
    bundles = [bundle(head)] if head is not None else []
    indices: dict[str, list[int]] = {}
    requests: dict[str, list[dict[str, float]]] = {}
    shared: dict[str, tuple[int, list[int]]] = {}  # share key -> (members, their bundles)
    for d in demands:
        if d.name in indices:
            raise ValueError(f"placement: two groups named {d.name!r}")
        requests[d.name] = [bundle(d.resources) for _ in range(d.n)]
        if d.share and d.share in shared:
            n, idx = shared[d.share]
            if n != d.n:
                raise ValueError(f"placement: group {d.name!r} has {d.n} members but shares the bundles of "
                                 f"{d.share!r}, which hold {n}")
            for i in idx:
                bundles[i] = _summed(bundles[i], d.resources)
            indices[d.name] = idx
            continue
        indices[d.name] = list(range(len(bundles), len(bundles) + d.n))
        bundles += [bundle(d.resources) for _ in range(d.n)]
        if d.share:
            shared[d.share] = (d.n, indices[d.name])
    return Layout(bundles, indices, requests)


def _summed(a: Mapping[str, float], b: Mapping[str, float]) -> dict[str, float]:
    return bundle({k: a.get(k, 0.0) + b.get(k, 0.0) for k in {*a, *b}})
