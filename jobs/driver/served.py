"""Which weights served each turn, checked against what the policy map says should have: every turn's
completion records the policy (LoRA adapter) and the weight version of the engine that generated it
(rollout.engine.served_by), and a step whose turns were served by another adapter or another version than
their role's policy had when the rollout began stops with a ServedError before anything trains on them.

The case this exists for: an engine asked for an adapter it does not hold serves the base model without an
error (vLLM does; the paper's stack did whenever an adapter id was missing), and training on those turns
would silently train each role on another policy's samples.
"""

from __future__ import annotations

from collections.abc import Mapping

from marl.policy_map import PolicyMap
from marl.types import Episode
from rollout.engine import BASE_MODEL


class ServedError(RuntimeError):
    """Turns served by other weights than their role's policy at the expected version."""


def served_problems(episodes: list[Episode], policy_map: PolicyMap,
                    versions: Mapping[str, int]) -> list[str]:
    """One line per (role, expected, actual) that differs, with its count of turns. `versions`: policy ->
    the version its engines served when the rollout began. At version 0 the engines serve the model folder;
    a LoRA policy's untrained adapter (B = 0) adds nothing to it, so the base model also counts as the policy
    there."""
    seen: dict[tuple[str, str, int, str, int], int] = {}
    for episode in episodes:
        for turn in episode.turns:
            policy = policy_map[turn.role]
            want = versions.get(policy)
            if want is None:  # a policy the caller does not track
                continue
            got = (turn.completion.policy_id, turn.completion.version)
            if got == (policy, want) or (want == 0 and got == (BASE_MODEL, 0)):
                continue
            key = (turn.role, policy, want, *got)
            seen[key] = seen.get(key, 0) + 1
    return [f"role {role!r}: expected policy {policy!r} at version {want}, served by {got!r} at version "
            f"{got_v} ({n} turns)" for (role, policy, want, got, got_v), n in sorted(seen.items())]


def check_served(episodes: list[Episode], policy_map: PolicyMap, versions: Mapping[str, int],
                 step: int) -> None:
    problems = served_problems(episodes, policy_map, versions)
    if problems:
        raise ServedError(f"step {step}: turns were served by other weights than their policy's: "
                          + "; ".join(problems))
