"""Study 3's viability gate: the Wilson interval by hand, the parse counts per coordinating role (the
orchestrator by its workflow's own parser), and the gate sweep's cells."""

from __future__ import annotations

import json

import pytest

from jobs.config.sweep_spec import load_sweep, validate
from studies.cpu_smollm2_v3.gate import gate_table, parsed_turns, wilson


def test_wilson_interval_by_hand():
    low, high = wilson(30, 32)  # p = 0.9375: the textbook score interval
    assert (low, high) == (pytest.approx(0.7985, abs=1e-4), pytest.approx(0.9827, abs=1e-4))
    assert wilson(0, 32)[0] == 0.0 and wilson(32, 32)[1] == 1.0
    assert all(v != v for v in wilson(0, 0))


def test_parsed_turns_per_role():
    row = {"eval/before/turns/aggregator": 64, "eval/before/parse_failures/aggregator": 4,
           "eval/before/turns/orchestrator": 64, "eval/before/parse_failures/orchestrator": 30,
           "eval/before/plan_format/strategy": 34, "eval/before/plan_format/numbered": 20,
           "eval/before/plan_format/lines": 10}
    assert parsed_turns(row, "aggregator") == (60, 64)
    # a numbered list is a parse, as the workflow reads it
    assert parsed_turns(row, "orchestrator") == (54, 64)
    assert parsed_turns({}, "evaluator") == (0, 0)


def test_gate_table_from_run_dirs(tmp_path):
    run = tmp_path / "orch"
    run.mkdir()
    (run / "config.yaml").write_text("run_name: orch\nmarl:\n  workflow: orch_workers\n  sharing: shared\n"
                                     "rollout:\n  role_max_new_tokens:\n    orchestrator: 32\n")
    first = {"step": 0, "eval/accuracy_before": 0.1, "eval/before/episodes": 64.0,
             "eval/before/turns/orchestrator": 64.0, "eval/before/plan_format/strategy": 30.0,
             "eval/before/plan_format/numbered": 10.0, "eval/before/failures/too_many_strategies": 5.0}
    (run / "metrics.jsonl").write_text(json.dumps(first) + "\n")
    table = gate_table([tmp_path])
    assert ("| orch_workers | orchestrator | 32 | 40 / 64 | 0.625 | 0.503–0.733 | too_many_strategies 5, "
            "unparsable_plan 0 | yes |") in table


def test_the_gate_sweep_runs_fewshot_at_caps_32_and_64():
    spec = load_sweep("jobs/configs/sweeps/cpu_study_v3_gate.yaml")
    cells = validate(spec)
    assert "marl.prompts=fewshot" in spec.overrides and "data.eval_size=64" in spec.overrides
    caps = sorted((c["gate"]["marl.workflow"], v) for c in cells for k, v in c["gate"].items()
                  if k.startswith("rollout.role_max_new_tokens."))
    assert caps == [(w, c) for w in ("eval_opt", "orch_workers", "voting") for c in (32, 64)]
