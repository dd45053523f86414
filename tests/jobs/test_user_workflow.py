"""The user's own workflow module (examples/debate.py) through the whole driver: config load checks it, and it
trains 2 steps under shared and isolated policies on the tiny model."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from jobs.config import ConfigError, load_config
from jobs.models.resolve import resolve_model
from jobs.telemetry.tracking import read_metrics
from jobs.train import main, train
from marl.policy_map import PolicyMap
from tests.learning import (
    assert_accuracy_is_a_count,
    assert_rewards_match_episodes,
    assert_updates_follow_advantages,
)

TINY = "jobs/configs/tiny.yaml"
DEBATE = "examples/debate.py"


@pytest.mark.parametrize("sharing", ["shared", "isolated"])
def test_debate_trains_two_steps(ray_cluster, tmp_path, sharing):
    parity = [
        f"marl.reward_shaping.{role}=tests.learning.first_token_parity" for role in ("debater", "judge")
    ]
    cfg = load_config(TINY, [f"out_dir={tmp_path}", f"marl.workflow={DEBATE}", f"marl.sharing={sharing}",
                             "marl.max_rounds=1", "rollout.engines_per_role=0", "learner.ranks=0",
                             "rollout.prompts_per_step=2", "rollout.samples_per_prompt=2", "data.eval_size=2",
                             *parity])
    summary = train(cfg)
    run = tmp_path / "tiny"
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [0, 1, 2]
    for role in ("debater", "judge"):
        assert f"reward/mean/{role}" in rows[0] and rows[0][f"batch/rows/{role}"] > 0
    policies = ["shared"] if sharing == "shared" else ["debater", "judge"]
    policy_map = PolicyMap.build(sharing, ["debater", "judge"])
    assert_updates_follow_advantages(run, rows, policy_map, resolve_model(cfg.model.path))
    assert any(r.get(f"grad/mass/{role}", 0) > 0 for r in rows for role in ("debater", "judge"))
    for r in rows[:2]:
        assert_rewards_match_episodes(run, r)
    turns = pq.read_table(run / "rollouts" / "step_000001.parquet").to_pylist()
    # 2 prompts x 2 samples, each 2 debaters x 2 rounds + a judge.
    assert len(turns) == 4 * 5 and {t["workflow"] for t in turns} == {DEBATE}
    assert {t["policy_id"] for t in turns} == set(policies)
    assert_accuracy_is_a_count(summary, rows, cfg.data.eval_size)


def test_a_module_that_is_no_workflow_is_a_config_error(tmp_path, capsys):
    bad = tmp_path / "half.py"
    bad.write_text("ROLES = ('solver',)\n\ndef agents(opts):\n    return ['solver']\n")
    with pytest.raises(ConfigError, match=r"marl.workflow=.*half.py: .*half.py has no function run\(\)"):
        load_config(TINY, [f"marl.workflow={bad}"])
    assert main(["--config", TINY, f"marl.workflow={bad}"]) == 2
    assert "has no function run()" in capsys.readouterr().err


def test_debate_runs_its_episodes_with_three_debaters(ray_cluster, tmp_path):
    cfg = load_config(
        TINY,
        [
            f"out_dir={tmp_path}",
            f"marl.workflow={DEBATE}",
            "marl.options.debaters=3",
            "marl.max_rounds=1",
            "rollout.engines_per_role=0",
            "learner.ranks=0",
            "steps=1",
            "rollout.prompts_per_step=2",
            "rollout.samples_per_prompt=2",
            "data.eval_size=2",
        ],
    )
    assert cfg.marl.options == {"debaters": 3}
    train(cfg)
    turns = pq.read_table(tmp_path / "tiny" / "rollouts" / "step_000000.parquet").to_pylist()
    # 2 prompts x 2 samples, each 3 debaters x 2 rounds + a judge.
    assert len(turns) == 4 * 7
    assert {t["agent"] for t in turns} == {"debater0", "debater1", "debater2", "judge"}


@pytest.mark.parametrize(
    ("override", "problem"),
    [
        ("marl.options.debaters=1", "config: marl.options.debaters must be >= 2; got 1"),
        ("marl.options.debaters=many", "config: marl.options.debaters must be an int; got 'many'"),
        (
            "marl.options.judges=2",
            f"config: marl.options.judges: {DEBATE} has no option 'judges'; its options: debaters",
        ),
    ],
)
def test_a_bad_workflow_option_is_a_config_error_naming_its_key(tmp_path, capsys, override, problem):
    with pytest.raises(ConfigError) as e:
        load_config(TINY, [f"marl.workflow={DEBATE}", override])
    assert str(e.value) == problem
    assert main(["--config", TINY, f"marl.workflow={DEBATE}", override]) == 2
    assert problem in capsys.readouterr().err


def test_options_of_a_builtin_workflow_are_a_config_error():
    with pytest.raises(ConfigError, match="marl.options.debaters: voting declares no options of its own"):
        load_config(TINY, ["marl.workflow=voting", "marl.options.debaters=3"])
