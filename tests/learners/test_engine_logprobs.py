"""The engine's sampled log-probs, through `build_batches`, against the learner's on the same weights:
builtin:tiny, fp32, at a sampling temperature the learner must apply too. Compared through the learner's own
metric (`rollout/logprob_diff/<role>`: mean |learner − engine| over a role's response tokens), on rows that
train (non-zero advantages) and on rows skipped for a zero advantage (the metrics-only pass). The vLLM
engine's variant is in tests/rollout/test_vllm_engine.py, on that module's shared engine.

Tolerance: the learner runs right-padded rows where the engine ran left-padded ones, a difference of float
summation order only: measured 1.8e-7 (mean over 48 tokens, both roles, trained and skipped rows). A mean of
1e-5 leaves fifty times that and bounds every token's gap by 5e-4, while a learner that ignored the
temperature is off by 5-6e-2 (checked below, against 1e-2).
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from jobs.config import load_config
from jobs.models.resolve import resolve_model
from learners.batch import build_batches
from learners.group import LearnerGroup
from marl.policy_map import PolicyMap
from marl.types import Completion, Episode, Task, Turn
from rollout.engine import Sampling
from rollout.hf_engine import HFEngine
from tests.builders import learner_spec

TEMPERATURE = 0.7
DIFF_TOL = 1e-5
REQUESTS = [  # prompts of different lengths: the engine left-pads them in one batch
    [{"role": "user", "content": "Write the digit 7."}],
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 12 + 30? Answer now."}],
    [{"role": "user", "content": "Name a colour."}],
]
ROLES = ("generator", "evaluator")


def episodes_of(completions: list[Completion]) -> list[Episode]:
    """One single-turn episode per completion, roles alternating, so the batch holds rows of two roles."""
    return [Episode(task=Task(f"t{i}", "p", "a"), sample_index=0, workflow="test",
                    turns=[Turn(ROLES[i % 2], f"{ROLES[i % 2]}0", 0, REQUESTS[i], c)])
            for i, c in enumerate(completions)]


def learner_gap(model_path: str, completions: list[Completion], advantages: list[float],
                temperature: float = TEMPERATURE, guards: dict[str, str] | None = None) -> dict[str, float]:
    """role -> the learner's rollout/logprob_diff on the engine's rows (one in-process update, fp32), the
    batch carrying `guards` (role -> grammar text) when given."""
    pad = AutoTokenizer.from_pretrained(model_path).pad_token_id or 0
    batches, _ = build_batches(
        episodes_of(completions), PolicyMap.shared(ROLES, "p"), torch.tensor(advantages), {"p": pad},
        guards=guards
    )
    cfg = load_config(
        "jobs/configs/tiny.yaml",
        [
            "learner.ranks=0",
            "model.dtype=float32",
            "learner.optim.lr=1e-3",
            "model.lora.enabled=false",
            "algo.kl_coef=0.0",
        ],
    )
    group = LearnerGroup(
        learner_spec(cfg, model_path, temperature=temperature, total_steps=2),
        "logprobs",
    )
    try:
        metrics = group.update(batches["p"])
    finally:
        group.shutdown()
    return {role: metrics[f"rollout/logprob_diff/{role}"] for role in ROLES}


@pytest.fixture(scope="module")
def hf_run() -> tuple[str, list[Completion]]:
    tiny = resolve_model("builtin:tiny")
    completions = HFEngine(tiny, policy_id="p").generate(
        REQUESTS, Sampling(TEMPERATURE, max_new_tokens=12, seed=5)
    )
    assert all(c.response_ids for c in completions)
    return tiny, completions


@pytest.mark.parametrize("advantages", [[1.0, -1.0, 0.5, -0.5], [0.0] * 4], ids=["trained", "skipped"])
def test_hf_engine_logprobs_equal_the_learners(hf_run, advantages):
    tiny, completions = hf_run
    gaps = learner_gap(tiny, completions, advantages)
    assert all(gap < DIFF_TOL for gap in gaps.values()), gaps


def test_a_learner_ignoring_the_temperature_is_caught(hf_run):
    tiny, completions = hf_run
    gaps = learner_gap(tiny, completions, [1.0, -1.0, 0.5, -0.5], temperature=1.0)
    assert all(gap > 1e-2 for gap in gaps.values()), gaps
