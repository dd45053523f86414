"""marl.reward_shaping: per-role hooks named by function path, imported and checked at config load, applied to
every turn of their role in a real step (examples/format_penalty.py)."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from jobs.config import ConfigError, load_config
from jobs.driver.handles import build_handles
from jobs.driver.step import RolloutSource, train_step
from jobs.models.resolve import resolve_model
from jobs.plan.layout import run_layout
from marl.tasks import get_family
from marl.tasks.data import digit_tasks
from marl.tasks.math import last_boxed
from marl.tasks.sampler import PromptSampler

TINY = "jobs/configs/tiny.yaml"
PENALTY = "examples.format_penalty.boxed_or_penalty"


def test_hook_paths_load_as_dotted_or_file_paths():
    for path in (
        PENALTY,
        "examples.format_penalty:boxed_or_penalty",
        "examples/format_penalty.py:boxed_or_penalty",
    ):
        cfg = load_config(TINY, [f"marl.reward_shaping.generator={path}"])
        assert cfg.marl.reward_shaping == {"generator": path}


@pytest.mark.parametrize(("override", "message"), [
    (f"marl.reward_shaping.evaluator={PENALTY}", "marl.reward_shaping.evaluator: the workflow has no role"),
    ("marl.reward_shaping.generator=examples.format_penalty.nope", "has no attribute 'nope'"),
    ("marl.reward_shaping.generator=examples.no_such_module.f", "cannot be imported"),
    ("marl.reward_shaping.generator=examples.format_penalty.PENALTY", "is a float, not a function"),
    ("marl.reward_shaping.generator=examples.format_penalty.last_boxed", "must take (episode, turn)"),
    ("marl.reward_shaping.generator=nodots", "is not a function path"),
])
def test_bad_hooks_name_the_key_and_the_problem(override, message):
    with pytest.raises(ConfigError, match="marl.reward_shaping") as e:
        load_config(TINY, [override])
    assert message in str(e.value)


def test_format_penalty_shapes_its_role_in_a_step(tmp_path):
    """The generator's turns get the episode's reward less 0.1 when unboxed; the aggregator's the outcome."""
    cfg = load_config(TINY, [f"out_dir={tmp_path}", "marl.sharing=shared", "rollout.engines_per_role=0",
                             "learner.ranks=0", "rollout.prompts_per_step=2",
                             f"marl.reward_shaping.generator={PENALTY}"])
    handles = build_handles(run_layout(cfg), resolve_model(cfg.model.path), get_family("digit"))
    try:
        (tmp_path / "rollouts").mkdir()
        source = RolloutSource(handles, cfg, PromptSampler(digit_tasks(8, 0)[:2], 0))
        train_step(handles, cfg, source, 0, pad_ids=dict.fromkeys(handles.policy_map.policies, 0),
                   run_dir=tmp_path)
    finally:
        handles.shutdown()
    rows = pq.read_table(tmp_path / "rollouts" / "step_000000.parquet").to_pylist()
    generators = [r for r in rows if r["role"] == "generator"]
    assert len(generators) == 2 * 4 * 3 and any(last_boxed(r["response"]) is None for r in generators)
    for r in generators:
        assert r["reward"] == pytest.approx(
            r["episode_reward"] - (0.1 if last_boxed(r["response"]) is None else 0)
        )
    assert all(r["reward"] == r["episode_reward"] for r in rows if r["role"] == "aggregator")
