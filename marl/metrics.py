"""Per-role rollout metrics from scored episodes, as flat dicts with stable keys."""

from __future__ import annotations

from collections import defaultdict

from marl.types import Episode


def episode_metrics(episodes: list[Episode], roles: list[str]) -> dict[str, float]:
    """reward/mean, reward/mean/<role>, response_len/mean/<role>, rollout/parse_failures/<role>,
    rollout/truncated/<role> (fraction of turns cut by max tokens), rollout/failures (episodes)."""
    out: dict[str, float] = {
        "reward/mean": sum(e.reward for e in episodes) / max(len(episodes), 1),
        "rollout/episodes": float(len(episodes)),
        "rollout/failures": float(sum(e.failure is not None for e in episodes)),
    }
    rewards, lengths, truncated = defaultdict(list), defaultdict(list), defaultdict(list)
    for ep in episodes:
        for t in ep.turns:
            rewards[t.role].append(t.reward)
            lengths[t.role].append(len(t.completion.response_ids))
            truncated[t.role].append(float(t.completion.finish_reason == "length"))
    for role in roles:
        n = max(len(rewards[role]), 1)
        out[f"reward/mean/{role}"] = sum(rewards[role]) / n
        out[f"response_len/mean/{role}"] = sum(lengths[role]) / n
        out[f"rollout/truncated/{role}"] = sum(truncated[role]) / n
        out[f"rollout/parse_failures/{role}"] = float(sum(e.parse_failures.get(role, 0) for e in episodes))
    return out
