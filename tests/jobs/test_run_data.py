"""The run's data (jobs/driver/run_data.py): the whole train set by default, seeded cuts, eval held out from
train (overlap counted, an input error above data.max_overlap, generated train sets decontaminated), the epoch
count, and its start-up line and step-0 metrics."""

from __future__ import annotations

import json

import pytest

from jobs.config import ConfigError, load_config
from jobs.driver.run_data import EVAL_SEED_OFFSET, load_run_data
from jobs.telemetry.tracking import read_metrics
from jobs.train import EXIT_INPUT, main, train
from marl.tasks.overlap import prompt_set, shared_tasks

TINY = "jobs/configs/tiny.yaml"
QUICKSTART = "jobs/configs/quickstart.yaml"


def _write(path, prompts):
    path.write_text(
        "".join(json.dumps({"prompt": p, "answer": str(i)}) + "\n" for i, p in enumerate(prompts))
    )
    return str(path)


def _math(tmp_path, train, evals, *overrides):
    return load_config(TINY, [f"out_dir={tmp_path}", "data.task=math", f"data.train={train}",
                              f"data.eval={evals}", "data.train_size=0", "data.eval_size=100",
                              "data.max_overlap=0", *overrides])


def test_defaults_take_every_train_row_and_report_unique_prompts_and_epochs(tmp_path):
    # 40 rows, two of which repeat earlier problems with other capitals and spacing: 38 unique prompts.
    train = _write(
        tmp_path / "train.jsonl", [f"Problem {i}?" for i in range(38)] + ["problem  0?", "PROBLEM 1?"]
    )
    evals = _write(tmp_path / "eval.jsonl", [f"Held out {i}?" for i in range(5)])
    cfg = _math(tmp_path, train, evals, "steps=19", "rollout.prompts_per_step=4")
    data = load_run_data(cfg)
    assert len(data.train) == 40 and len(data.eval) == 5
    assert data.metrics == {"data/train_tasks": 40.0, "data/train_prompts": 38.0, "data/train_dropped": 0.0,
                            "data/eval_tasks": 5.0, "data/overlap": 0.0, "data/epochs": 2.0}  # 19 x 4 / 38
    assert "40 tasks, 38 unique prompts" in data.summary and "= 2.00 epochs" in data.summary
    assert load_config(None, ["model.path=x", f"data.train={train}"]).data.train_size == 0
    with pytest.raises(ConfigError, match=r"data\.train"):  # no default training set
        load_config(None, ["model.path=x"])


def test_a_train_size_is_a_seeded_selection(tmp_path):
    train = _write(tmp_path / "train.jsonl", [f"Problem {i}?" for i in range(40)])
    evals = _write(tmp_path / "eval.jsonl", ["Held out?"])
    picked = [t.task_id for t in load_run_data(_math(tmp_path, train, evals, "data.train_size=10")).train]
    assert len(picked) == 10 and picked != [f"train:{i}" for i in range(10)]
    again = load_run_data(_math(tmp_path, train, evals, "data.train_size=10")).train
    other_seed = load_run_data(_math(tmp_path, train, evals, "data.train_size=10", "seed=1")).train
    assert picked == [t.task_id for t in again] != [t.task_id for t in other_seed]


def test_overlap_above_the_limit_is_an_input_error_naming_both_sources(tmp_path, capsys):
    train = _write(tmp_path / "train.jsonl", [f"Problem {i}?" for i in range(20)])
    # 2 of 10 eval prompts are training problems, written with other capitals and whitespace.
    evals = _write(
        tmp_path / "eval.jsonl", ["PROBLEM 3?", "problem\n 7? "] + [f"Other {i}?" for i in range(8)]
    )
    with pytest.raises(
        ValueError, match=r"eval\.jsonl shares 2 of its 10 prompts with data\.train=.*train\.jsonl"
    ):
        load_run_data(_math(tmp_path, train, evals))
    with pytest.raises(ValueError, match="max_overlap=0.1"):
        load_run_data(_math(tmp_path, train, evals, "data.max_overlap=0.1"))
    data = load_run_data(_math(tmp_path, train, evals, "data.max_overlap=0.2"))
    assert data.metrics["data/overlap"] == 2.0 and len(data.train) == 20
    # The driver turns it into exit code 3 (model/data error) with the message.
    assert main(["--config", TINY, f"out_dir={tmp_path}", "data.task=math", f"data.train={train}",
                 f"data.eval={evals}", "data.train_size=0", "data.max_overlap=0"]) == EXIT_INPUT
    assert "shares 2 of its 10 prompts" in capsys.readouterr().err


def test_a_generated_train_set_drops_the_eval_prompts(tmp_path):
    spec = "reasoning_gym:chain_sum?min_terms=2&max_terms=2&min_digits=1&max_digits=1"  # 200 distinct prompts
    cfg = _math(tmp_path, spec, spec, "data.train_size=300", "data.eval_size=20")
    data = load_run_data(cfg)
    assert len(data.eval) == 20 and not shared_tasks(data.train, data.eval)
    assert data.metrics["data/train_dropped"] == 300 - len(data.train) > 0
    assert data.metrics["data/overlap"] == 0.0 and data.metrics["data/train_prompts"] == len(
        prompt_set(data.train)
    )
    # Within the limit nothing is dropped and the overlap is reported.
    kept = load_run_data(
        _math(tmp_path, spec, spec, "data.train_size=300", "data.eval_size=20", "data.max_overlap=1")
    )
    assert len(kept.train) == 300 and kept.metrics["data/overlap"] > 0


def test_quickstart_eval_is_held_out():
    cfg = load_config(QUICKSTART)
    data = load_run_data(cfg)
    assert len(data.eval) == cfg.data.eval_size and data.train
    assert not shared_tasks(data.train, data.eval) and data.metrics["data/overlap"] == 0.0
    # Eval comes from a generator seed range disjoint from training's (item i of
    # seed s is generated from s + i).
    train_seeds = {int(t.task_id.split(":")[-2]) + int(t.task_id.split(":")[-1]) for t in data.train}
    eval_seeds = {int(t.task_id.split(":")[-2]) + int(t.task_id.split(":")[-1]) for t in data.eval}
    assert max(train_seeds) < EVAL_SEED_OFFSET <= min(eval_seeds)


@pytest.mark.parametrize(("override", "message"), [
    # tiny.yaml trains on the digit generator
    ("data.train_size=0", r"data\.train_size=0 takes every row of a listing source: a generated data\.train"),
    ("data.max_overlap=1.5", r"data\.max_overlap"),
    ("data.train_size=-1", r"data\.train_size must be >= 0"),
])
def test_data_config_errors_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(TINY, [override])


def test_step_zero_carries_the_data_metrics(ray_cluster, tmp_path, capsys):
    cfg = load_config(
        TINY,
        [
            f"out_dir={tmp_path}",
            "steps=1",
            "rollout.engines_per_role=0",
            "learner.ranks=0",
            "rollout.prompts_per_step=2",
            "rollout.samples_per_prompt=2",
            "data.eval_size=4",
        ],
    )
    train(cfg)
    row = read_metrics(tmp_path / "tiny")[0]
    # digit: 64 tasks over its 10 prompts, every eval prompt also a train one (tiny.yaml allows it).
    assert row["step"] == 0 and row["data/train_tasks"] == 64 and row["data/train_prompts"] == 10
    assert (
        row["data/eval_tasks"] == 4 and row["data/overlap"] == 4 and row["data/epochs"] == pytest.approx(0.2)
    )
    assert "[tiny] data: train digit: 64 tasks, 10 unique prompts" in capsys.readouterr().out
