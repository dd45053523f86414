"""The code task end to end: config validation of data.task=code and data.sandbox, and one real training
step of the tiny model on synthetic code tasks in every workflow, with the code/* metrics logged."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from jobs.config import ConfigError, load_config
from jobs.telemetry.tracking import read_metrics
from jobs.train import train
from marl.workflows import roles_of

TINY = "jobs/configs/tiny.yaml"
CODE = ["data.task=code", "data.train=code_synthetic", "data.eval=code_synthetic"]
# The role whose turn each workflow's final answer comes from.
ANSWERING = {
    "single_agent": "solver",
    "eval_opt": "generator",
    "voting": "generator",
    "orch_workers": "synthesizer",
}


# The runs ask for ray.num_cpus=2: the `ray_cluster` fixture (tests/conftest.py)
# starts a cluster of that size.
RAY_CPUS = 2


def test_code_task_config_is_accepted_and_its_sandbox_validated():
    cfg = load_config(
        TINY, [*CODE, "data.sandbox.timeout_s=4", "data.sandbox.workers=1", "marl.max_rounds=2"]
    )
    assert cfg.data.task == "code" and cfg.data.sandbox.timeout_s == 4 and cfg.data.sandbox.workers == 1
    for bad in ("data.sandbox.timeout_s=0", "data.sandbox.memory_mb=-1", "data.sandbox.workers=-1",
                "data.sandbox.max_output_bytes=0"):
        with pytest.raises(ConfigError, match=bad.split("=")[0].replace(".", r"\.")):
            load_config(TINY, [*CODE, bad])


@pytest.mark.parametrize(("overrides", "message"), [
    (["data.task=code"], "data.train must be one of humaneval, code_synthetic"),  # tiny.yaml trains on digit
    (["data.train=humaneval"], "set data.task=code"),
    (["data.task=code", "data.train=humaneval", "data.eval=gsm8k"], "data.eval"),
])
def test_task_and_sources_must_agree(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(TINY, overrides)


@pytest.mark.parametrize("workflow", ["single_agent", "eval_opt", "voting", "orch_workers"])
def test_one_training_step_on_the_code_task(ray_cluster, tmp_path, workflow):
    cfg = load_config(TINY, [
        f"out_dir={tmp_path}", *CODE, f"marl.workflow={workflow}", "marl.max_rounds=2", "steps=1",
        "data.train_size=8", "data.eval_size=2", "rollout.engines_per_role=0", "learner.ranks=0",
        "rollout.prompts_per_step=2", "rollout.samples_per_prompt=2", "rollout.sampling.max_new_tokens=8",
        "data.sandbox.workers=1",
    ])
    summary = train(cfg)
    assert summary["eval/accuracy_before"] == 0.0  # a random model writes no program
    row = read_metrics(tmp_path / "tiny")[0]
    roles = roles_of(workflow)
    for name in ("timeouts", "crashes", "oom", "no_code_block"):
        assert f"code/{name}" in row and all(f"code/{name}/{role}" in row for role in roles)
    # Every scored episode ended without a code block, attributed to the role that answers.
    scored = row["rollout/episodes"] - row["rollout/failures"]
    assert row["code/no_code_block"] == row[f"code/no_code_block/{ANSWERING[workflow]}"] == scored
    assert row["code/timeouts"] == row["code/crashes"] == row["code/oom"] == 0
    stored = pq.read_table(tmp_path / "tiny" / "rollouts" / "step_000000.parquet").to_pylist()
    infos = [json.loads(r["score_info"]) for r in stored if r["failure"] is None]
    # orch_workers also records how its parser read the plan (a scored episode's plan was read somehow).
    plan = [i.pop("plan_format") for i in infos] if workflow == "orch_workers" else []
    assert all(p in ("strategy", "numbered", "lines") for p in plan)
    # voting records the position its aggregator chose (its fallback reads a random model's text as 1..3).
    chosen = [i.pop("choice") for i in infos] if workflow == "voting" else []
    assert all(c in (1, 2, 3) for c in chosen)
    assert all(i == {"answer_role": ANSWERING[workflow], "reason": "no_code_block"} for i in infos)
    # A random orchestrator's plan may be blank or too long (a line per strategy),
    # ending its episodes unscored.
    assert len(infos) > 0 or workflow == "orch_workers"
