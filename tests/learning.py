"""The learning checks shared by the end-to-end tests: a trivially learnable task ("write the digit 7") and
what counts as having learned it; what a run's logged updates, rewards and accuracy must agree with."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file


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
    """A reward-shaping hook (marl.reward_shaping.<role>=tests.learning.first_token_parity) that gives a
    random model's turns differing rewards, so every policy gets a nonzero gradient from its first step."""
    ids = turn.completion.response_ids
    return float(ids[0] % 2) if ids else 0.0


def assert_updates_follow_advantages(
    run_dir: Path, rows: list[dict], policy_map: Any, base_model: str
) -> None:
    """Per policy and training step: a step whose rows carry advantage (grad/mass/<role> > 0 for one of
    its roles) has a finite, non-zero gradient norm and a finite loss; a step without has both exactly 0
    (its rows never reach the learner). The exported weights differ from the base model's iff some step
    carried advantage at a non-zero lr (AdamW without weight decay does not move on zero gradients, nor at
    lr 0: the cosine's last step).
    Returns nothing; fails naming the policy and step."""
    base = load_file(str(Path(base_model) / "model.safetensors"))
    for pid in policy_map.policies:
        pushed = False
        for r in (r for r in rows if f"grad/norm/{pid}" in r):
            mass = sum(r.get(f"grad/mass/{role}", 0.0) for role in policy_map.roles_of(pid))
            norm, loss = r[f"grad/norm/{pid}"], r[f"loss/{pid}"]
            if mass > 0:
                assert math.isfinite(loss) and 0 < norm < math.inf, (pid, r["step"], mass, norm, loss)
            else:
                assert norm == 0.0 and loss == 0.0, (pid, r["step"], norm, loss)
            pushed |= mass > 0 and r[f"lr/{pid}"] > 0
        exported = load_file(str(run_dir / "export" / pid / "model.safetensors"))
        shared = [k for k in base if k in exported]
        assert shared, f"{pid}: the export shares no weight name with the base model"
        assert any(not torch.equal(exported[k], base[k]) for k in shared) == pushed, pid


def assert_rewards_match_episodes(run_dir: Path, row: dict) -> None:
    """The logged reward/mean and reward/mean/<role> of `row`'s step, recomputed from the episodes the run
    wrote for that step (rollouts/step_<step>.parquet: one row per turn)."""
    turns = pq.read_table(run_dir / "rollouts" / f"step_{row['step']:06d}.parquet").to_pylist()
    episodes = {t["episode"]: t["episode_reward"] for t in turns}
    assert row["rollout/episodes"] == len(episodes)
    assert row["reward/mean"] == pytest.approx(sum(episodes.values()) / len(episodes))
    for role in {t["role"] for t in turns}:
        rewards = [t["reward"] for t in turns if t["role"] == role]
        assert row[f"reward/mean/{role}"] == pytest.approx(sum(rewards) / len(rewards)), role


def assert_accuracy_is_a_count(summary: dict[str, float], rows: list[dict], eval_size: int) -> None:
    """The held-out accuracy after training is the last logged evaluation, a
    whole number of the eval tasks."""
    acc = summary["eval/accuracy_after"]
    assert acc == rows[-1]["eval/accuracy"]
    assert (
        acc * eval_size == pytest.approx(round(acc * eval_size)) and 0 <= round(acc * eval_size) <= eval_size
    )
