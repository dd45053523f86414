"""The names of a run's actor groups, shared by whoever builds, places or looks up a group (the engine map,
the learner groups, placement), so that one function spells them."""

from __future__ import annotations


def group_name(run_name: str, kind: str, key: str) -> str:
    """`<run>:<kind>:<key>` (kind: engine | learner): a group's name; its Ray actors are `<name>:<i>` and its
    placement bundles are reserved under it."""
    return f"{run_name}:{kind}:{key}"
