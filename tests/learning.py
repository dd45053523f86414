"""The learning check shared by the end-to-end tests: a trivially learnable task ("write the digit 7") and what
counts as having learned it."""

from __future__ import annotations

import json
from pathlib import Path


def write_seven_tasks(tmp_path: Path) -> str:
    """8 identical rows asking for the digit 7, as a JSONL data file; returns its path."""
    path = tmp_path / "seven.jsonl"
    path.write_text("".join(json.dumps({"id": f"s{i}", "prompt": "Write the digit 7.", "answer": "7"}) + "\n"
                            for i in range(8)))
    return str(path)


def assert_learned(rows: list[dict], summary: dict[str, float]) -> None:
    """Reward starts at chance, some 3-step window reaches >= 0.9, and held-out accuracy rises."""
    rewards = [r["reward/mean"] for r in rows if "reward/mean" in r]
    assert sum(rewards[:3]) / 3 < 0.3, rewards  # chance level at the start
    assert max(sum(rewards[i:i + 3]) / 3 for i in range(len(rewards) - 2)) >= 0.9, rewards
    assert summary["eval/accuracy_after"] > summary["eval/accuracy_before"]


def first_token_parity(episode, turn) -> float:
    """A reward-shaping hook (marl.reward_shaping.<role>=tests.learning.first_token_parity) that gives a random
    model's turns differing rewards, so every policy gets a nonzero gradient from its first step."""
    ids = turn.completion.response_ids
    return float(ids[0] % 2) if ids else 0.0
