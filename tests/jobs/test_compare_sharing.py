"""The headline comparison a newcomer runs (`python -m jobs.sweep --config
jobs/configs/compare_sharing.yaml`): the quickstart's model and task as a voting workflow under the `fewshot`
prompt set, Shared and Isolated as a two-trial sweep, ending with both held-out curves, the aggregator's parse
rate and choice accuracy per arm, and the report's location. The slow test asserts only what such a run can
guarantee: both arms train, the aggregator parses at least half its base turns, and the comparison prints."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from jobs.compare import comparison, parse_rate
from jobs.config import load_config
from jobs.config.sweep_spec import load_sweep, validate
from jobs.report import load_run
from jobs.telemetry.tracking import read_metrics

COMPARE = "jobs/configs/compare_sharing.yaml"


def test_the_compare_sweep_is_the_quickstart_as_voting_shared_and_isolated():
    spec = load_sweep(COMPARE)
    cells = validate(spec)  # every cell's train config loads
    assert [c["marl.sharing"] for c in cells] == ["shared", "isolated"] and spec.compare
    quick = load_config(spec.base)
    cfg = load_config(spec.base, [*spec.overrides, "marl.sharing=shared"])
    same = (cfg.model.path, cfg.data.train, cfg.data.eval)
    assert same == (quick.model.path, quick.data.train, quick.data.eval)
    assert (cfg.marl.workflow, cfg.marl.prompts, spec.max_concurrent_trials) == ("voting", "fewshot", 1)


def _write_run(path: Path, sharing: str, rows: list[dict]) -> None:
    path.mkdir(parents=True)
    config = f"run_name: {path.name}\nmarl:\n  workflow: voting\n  sharing: {sharing}\n"
    (path / "config.yaml").write_text(config)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_comparison_prints_curves_and_the_aggregators_parse_and_choice(tmp_path):
    base = {"step": 0, "time/step_s": 1.0, "eval/accuracy_before": 0.25, "eval/before/episodes": 4.0,
            "eval/before/turns/aggregator": 4.0, "eval/before/parse_failures/aggregator": 1.0,
            "eval/before/choice/accuracy/aggregator": 0.5, "eval/before/choice/available/aggregator": 2.0,
            "eval/before/choice/first/aggregator": 0.5, "eval/before/choice/random/aggregator": 0.5,
            "eval/before/choice/majority/aggregator": 0.25, "eval/before/choice/always_first/aggregator": 0.5}
    final = {"step": 2, "eval/accuracy": 0.5, "eval/episodes": 4.0, "eval/turns/aggregator": 4.0,
             "eval/choice/accuracy/aggregator": 2 / 3, "eval/choice/available/aggregator": 3.0,
             "eval/choice/first/aggregator": 1.0, "eval/choice/random/aggregator": 0.6,
             "eval/choice/majority/aggregator": 0.8, "eval/choice/always_first/aggregator": 1.0}
    _write_run(tmp_path / "a", "shared", [base, {"step": 1, "time/step_s": 1.0}, final])
    text = comparison([load_run(tmp_path / "a")])
    assert parse_rate(base, "aggregator", "eval/before/") == 0.75 and parse_rate(final, "aggregator") == 1.0
    assert "a · voting · shared   0: 0.250  2: 0.500" in text
    assert ("shared    aggregator: parses 0.75 at base -> 1.00 after training; decides right "
            "0.50 (of 2) -> 0.67 (of 3) (chance: a random pick 0.50 -> 0.60, a majority vote 0.25 -> 0.80, "
            "always the first 0.50 -> 1.00); picks the first response shown 0.50 -> 1.00") in text


def test_one_override_makes_the_comparison_orchestrator_workers():
    spec = load_sweep(COMPARE, ["vars.workflow=orch_workers"])
    cells = validate(spec)
    cfg = load_config(spec.base, [*spec.overrides, "marl.sharing=isolated"])
    assert (spec.name, cfg.run_name, cfg.marl.workflow) == ("compare_orch_workers",) * 2 + ("orch_workers",)
    assert [c["marl.sharing"] for c in cells] == ["shared", "isolated"] and spec.compare
    assert cfg.learner.gradient_checkpointing is True  # three learners do not fit 24 GB without it


# The slow test runs the compare sweep cut to 2 steps and 16 held-out tasks (the whole one takes ~22
# minutes on 2 cores, half CI's budget): the same config, model, prompts and code path, and what it
# asserts holds at any length.
SHORT = {"steps=6": "steps=2", "data.eval_size=48": "data.eval_size=16"}


def _short_sweep(tmp_path: Path) -> Path:
    raw = yaml.safe_load(Path(COMPARE).read_text())
    assert set(SHORT) <= set(raw["overrides"]), "the compare config changed: update SHORT"
    raw["overrides"] = [SHORT.get(o, o) for o in raw["overrides"]]
    raw["base"] = str(Path(raw["base"]).resolve())
    path = tmp_path / "compare_sharing.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.slow
@pytest.mark.timeout(25 * 60)  # two trained voting runs in a subprocess, on 2 cores
def test_compare_sharing_trains_both_arms_and_prints_the_comparison(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    sweep = _short_sweep(tmp_path)
    command = [".venv/bin/python", "-m", "jobs.sweep", "--config", str(sweep), f"storage_path={tmp_path}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=20 * 60, check=False, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    runs = sorted((tmp_path / "compare_voting" / "runs").iterdir())
    assert len(runs) == 2
    for run in runs:
        rows = read_metrics(run)
        assert sum("time/step_s" in r for r in rows) == 2  # the arm trained every step
        # fewshot: the aggregator does its job at base
        assert parse_rate(rows[0], "aggregator", "eval/before/") >= 0.5, run
        assert rows[0]["prompts/set"] == "fewshot"
    out = done.stdout
    assert "held-out accuracy by training steps done:" in out
    assert "voting · shared" in out and "voting · isolated" in out
    assert out.count("aggregator: parses") == 2 and "decides right" in out and "a random pick" in out
    assert (tmp_path / "compare_voting" / "report" / "index.html").is_file() and "report with plots:" in out


def test_the_evaluators_verdicts_are_shown_beside_the_more_common_grade(tmp_path):
    base = {"step": 0, "time/step_s": 1.0, "eval/accuracy_before": 0.25, "eval/before/episodes": 4.0,
            "eval/before/turns/evaluator": 4.0, "eval/before/verdict/accuracy/evaluator": 0.5,
            "eval/before/verdict/majority/evaluator": 0.75}
    final = {"step": 2, "eval/accuracy": 0.5, "eval/episodes": 4.0, "eval/turns/evaluator": 4.0,
             "eval/verdict/accuracy/evaluator": 0.8, "eval/verdict/majority/evaluator": 0.6}
    _write_run(tmp_path / "a", "isolated", [base, {"step": 1, "time/step_s": 1.0}, final])
    text = comparison([load_run(tmp_path / "a")])
    assert ("evaluator: parses 1.00 at base -> 1.00 after training; judges right 0.50 -> 0.80 (chance: "
            "always the more common grade 0.75 -> 0.60)") in text
