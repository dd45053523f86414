"""The user's own task family (examples/parity.py) through the whole driver: config load checks the module,
and a run trains 2 steps on the tiny model with the family's loader (a numbers file the test writes), its
scorer, its prompt kind and its eval split (data.eval unset)."""

from __future__ import annotations

import random

import pyarrow.parquet as pq
import pytest

from jobs.config import ConfigError, load_config
from jobs.telemetry.tracking import read_metrics
from jobs.train import main, train
from marl.tasks import TASKS, get_family
from marl.types import Task
from tests.learning import assert_accuracy_is_a_count, assert_rewards_match_episodes

TINY = "jobs/configs/tiny.yaml"
PARITY = "examples/parity.py"


def write_numbers(tmp_path, count: int = 24) -> tuple[str, list[int]]:
    numbers = random.Random(0).sample(range(1000), count)
    path = tmp_path / "numbers.txt"
    path.write_text("".join(f"{n}\n" for n in numbers))
    return str(path), numbers


def test_the_family_is_its_module_and_data_eval_defaults_to_its_split(tmp_path):
    train_file, numbers = write_numbers(tmp_path)
    cfg = load_config(TINY, [f"data.task={PARITY}", f"data.train={train_file}", "data.eval=''"])
    assert cfg.data.task == PARITY and cfg.data.eval == ""
    spec = TASKS[PARITY]
    assert spec.eval_source(cfg.data.eval) == "random" and spec.generated("random")
    family = get_family(PARITY)
    assert (family.name, family.prompt_kind) == ("parity", "math")
    tasks = spec.load(train_file, None, 0)
    assert [t.prompt for t in tasks] == [f"Is {n} even or odd?" for n in numbers]
    assert family.score(Task("t", "Is 7 even or odd?", "1"), family.extract_answer("odd, so 1")) == 1.0
    assert spec.load("random", 5, 3) == spec.load("random", 5, 3) != spec.load("random", 5, 4)


def test_a_module_that_declares_no_family_is_a_config_error(tmp_path, capsys):
    bad = tmp_path / "nofamily.py"
    bad.write_text("NAME = 'x'\n")
    with pytest.raises(ConfigError, match=rf"data\.task={bad}: {bad} declares no TASK_FAMILY"):
        load_config(TINY, [f"data.task={bad}"])
    assert main(["--config", TINY, f"data.task={bad}"]) == 2
    assert "declares no TASK_FAMILY" in capsys.readouterr().err
    scorer_only = tmp_path / "scorer_only.py"
    scorer_only.write_text("from examples.parity import ParityFamily\nTASK_FAMILY = ParityFamily\n")
    with pytest.raises(ConfigError, match=rf"data\.task={scorer_only}: TASK_FAMILY must be a TaskFamilySpec"):
        load_config(TINY, [f"data.task={scorer_only}"])


def test_parity_trains_two_steps_on_the_data_it_wrote(ray_cluster, tmp_path):
    train_file, numbers = write_numbers(tmp_path)
    cfg = load_config(TINY, [f"out_dir={tmp_path}", f"data.task={PARITY}", f"data.train={train_file}",
                             "data.train_size=0", "data.eval=''", "data.eval_size=4",
                             "marl.workflow=single_agent", "rollout.engines_per_role=0", "learner.ranks=0",
                             "rollout.samples_per_prompt=8"])
    summary = train(cfg)
    run = tmp_path / "tiny"
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert rows[0]["data/train_tasks"] == len(numbers) and rows[0]["data/eval_tasks"] == 4
    family = get_family(PARITY)
    turns = [t for step in (0, 1)
             for t in pq.read_table(run / "rollouts" / f"step_{step:06d}.parquet").to_pylist()]
    assert {t["task_kind"] for t in turns} == {"parity"}
    asked = {int(t["task_prompt"].split()[1]) for t in turns}
    assert asked <= set(numbers)
    for t in turns:  # the family's instruction asked, its scorer scored
        assert family.instruction() in t["messages"]
        assert t["final_answer"] == family.extract_answer(t["response"])
        task = Task(t["task_id"], t["task_prompt"], t["task_answer"], t["task_kind"])
        assert t["episode_reward"] == family.score(task, t["final_answer"])
    assert any(t["episode_reward"] == 1.0 for t in turns) and any(t["episode_reward"] == 0.0 for t in turns)
    assert any(r.get("optim/steps/solver", 0) > 0 for r in rows)
    for r in rows[:2]:
        assert_rewards_match_episodes(run, r)
    assert_accuracy_is_a_count(summary, rows, cfg.data.eval_size)
