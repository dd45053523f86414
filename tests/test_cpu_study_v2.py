"""The second CPU study's analysis (studies/cpu_smollm2_v2): its statistics on hand-computed
examples, the cliff rule, and the collect pipeline on a small runs folder built by hand; its sweeps
load and declare the design."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from jobs.config.sweep_spec import flatten, load_sweep, validate
from jobs.driver.eval_records import append_eval
from marl.types import Episode, Task
from studies.cpu_smollm2_v2 import collect
from studies.cpu_smollm2_v2.stats import (
    binomial_two_sided,
    fisher_exact,
    is_cliff,
    last_mean,
    mcnemar_exact,
    mean_sd,
)


def test_the_readme_tables_are_those_of_the_committed_runs():
    in_readme = collect.readme_tables(collect.README.read_text())
    assert set(in_readme) == {*collect.TABLES, "calibration", "gate"}, (
        "every measured table has its place, once"
    )
    assert in_readme == collect.committed_tables(), (
        "stale tables: run `python -m studies.cpu_smollm2_v2.collect`"
    )


def test_fisher_exact_by_hand():
    # Fisher's tea tasting, 3 of 4 right: p = (16 + 1 + 16 + 1) / 70 two-sided.
    assert fisher_exact(3, 1, 1, 3) == pytest.approx(34 / 70)
    assert fisher_exact(1, 9, 11, 3) == pytest.approx(0.0027594562)  # the textbook 2x2 example
    assert fisher_exact(0, 5, 5, 0) == pytest.approx(2 / 252)  # only the two extreme tables
    assert fisher_exact(1, 1, 0, 2) == 1.0 and fisher_exact(0, 3, 0, 3) == 1.0


def test_mcnemar_and_sign_test_by_hand():
    assert mcnemar_exact(1, 9) == pytest.approx(2 * 11 / 1024)
    assert mcnemar_exact(4, 0) == pytest.approx(2 / 16) and mcnemar_exact(0, 0) == 1.0
    assert binomial_two_sided(5, 10) == 1.0


def test_cliff_rule_and_summaries():
    assert is_cliff([0.2, 0.8, 0.1], 10, 0.1)  # 0.7 below the peak; 2 SE = 0.32
    assert not is_cliff([0.2, 0.5, 0.4], 10, 0.1)  # 0.1 below, but 2 SE = 0.44: noise at 10 tasks
    assert not is_cliff([0.20, 0.30, 0.25], 10_000, 0.1)  # significant, but under the 10-point floor
    assert not is_cliff([0.2, 0.8, 0.1, 0.8], 10, 0.1)  # recovered by the end
    assert not is_cliff([0.5], 10, 0.1)
    assert last_mean([0.1, 0.2, 0.3, 0.6]) == pytest.approx(1.1 / 3)
    m, sd = mean_sd([0.3, 0.2])
    assert (m, sd) == (pytest.approx(0.25), pytest.approx(math.sqrt(0.005)))
    assert math.isnan(mean_sd([1.0])[1])


def write_run(root: Path, name: str, workflow: str, sharing: str, seed: int, curve: list[float], right: int,
              **algo: object) -> Path:
    """A finished run of 2 steps, evaluated at 0, 2 and at the end, on 10 tasks; `right` of them (t0..)
    correct in the final evaluation."""
    path = root / name
    path.mkdir(parents=True)
    cfg = {"seed": seed, "marl": {"workflow": workflow, "sharing": sharing}, "data": {"eval_size": 10},
           "algo": {"ppo_mini_batch_size": 16, **algo}, "learner": {"optim": {"lr": 3e-4}}}
    (path / "config.yaml").write_text("# code/commit: abc\n" + yaml.safe_dump(cfg))
    rows = [{"step": 0, "code/commit": "abc", "code/dirty": False, "time/step_s": 1.0,
             "eval/accuracy_before": curve[0], "update/policy_move/p": 0.5},
            {"step": 1, "time/step_s": 1.0, "eval/accuracy": curve[1], "update/policy_move/p": 0.25},
            {"step": 2, "eval/accuracy": curve[2]}]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    append_eval(
        path, 2, [Episode(Task(f"t{i}", "q", "a"), 0, workflow, reward=float(i < right)) for i in range(10)]
    )
    return path


@pytest.fixture
def sweep(tmp_path):
    src = tmp_path / "sweep"
    write_run(src, "a", "single_agent", "shared", 0, [0.2, 0.5, 0.5], 5)
    write_run(src, "b", "single_agent", "shared", 1, [0.2, 0.4, 0.4], 4)
    write_run(src, "c", "voting", "isolated", 0, [0.2, 0.8, 0.1], 1)
    write_run(src, "d", "voting", "isolated", 1, [0.2, 0.5, 0.4], 4)
    write_run(src, "e", "voting", "isolated", 0, [0.2, 0.3, 0.3], 3, ppo_mini_batch_size=0)
    return src


def test_collect_pipeline_on_runs_built_by_hand(sweep, tmp_path):
    root = tmp_path / "runs"
    assert sorted(collect.copy_runs(sweep, root)) == [
        "single_agent-shared/seed0", "single_agent-shared/seed1", "voting-isolated+mb0/seed0",
        "voting-isolated/seed0", "voting-isolated/seed1"]
    assert {p.name for p in (root / "voting-isolated" / "seed0").iterdir()} == {
        "metrics.jsonl", "config.yaml", "eval_tasks.csv", "eval_curve.csv"}
    runs = collect.committed(root)
    arms = collect.arms_table(runs).splitlines()
    assert arms[2] == ("| single_agent-shared | 0,1 | 0/2 | 0.200 ± 0.000 | 0.450 ± 0.071 | 0.450 ± 0.071 | "
                       "0.367 ± 0.047 | 0.250 ± 0.071 |")
    assert arms[3].startswith("| voting-isolated | 0,1 | 1/2 |")
    tests = collect.tests_table(runs).splitlines()
    # voting-isolated vs single: cliffs 1/2 vs 0/2 (Fisher p = 1); seed 0's final: single alone right on
    # t1..t4, seed 1's: the same four tasks right in both -> 20 pairs, 0 / 4 discordant, McNemar p = 2/16.
    assert (
        tests[2]
        == "| voting-isolated vs single_agent-shared | 1/2 vs 0/2 | 1.000 | 20 | 0 / 4 | -0.200 | 0.125 |"
    )
    # The ablation against its headline arm, on the one seed both ran: 3 right against 1.
    assert (
        tests[3]
        == "| voting-isolated+mb0 vs voting-isolated | 0/1 vs 1/2 | 1.000 | 10 | 2 / 0 | +0.200 | 0.500 |"
    )
    assert collect.provenance_table(runs).splitlines()[2] == "| abc | 5 | 0 |"
    assert (
        collect.calibration_table(runs[:1]).splitlines()[2]
        == "| 0.0003 | 0 | 0.200 | 0.500 | 0.500 | no | 0.500 |"
    )


def test_calibration_runs_differing_in_lr_are_committed_apart(tmp_path):
    """The calibration's runs share arm and seed: each lr gets its own folder, and two runs bound for one
    folder stop the copy instead of overwriting each other."""
    src = tmp_path / "sweep"
    for name, lr in (("a", 1e-4), ("b", 3e-4)):
        write_run(src, name, "single_agent", "shared", 0, [0.2, 0.5, 0.5], 5)
        cfg = yaml.safe_load((src / name / "config.yaml").read_text())
        cfg.setdefault("learner", {})["optim"] = {"lr": lr}
        (src / name / "config.yaml").write_text("# code/commit: abc\n" + yaml.safe_dump(cfg))
    assert sorted(collect.copy_runs(src, tmp_path / "calibration", "calibration")) == [
        "single_agent-shared-lr0.0001/seed0", "single_agent-shared-lr0.0003/seed0"]
    assert [r.lr for r in collect.committed(tmp_path / "calibration")] == [1e-4, 3e-4]
    with pytest.raises(ValueError, match="would be committed to"):
        collect.copy_runs(src, tmp_path / "study")


def test_gate_table_from_the_base_models_parse_failures(tmp_path):
    sweep = tmp_path / "sweep"
    for cap, failures in ((32, 20.0), (64, 12.0)):
        run = sweep / f"t{cap}"
        run.mkdir(parents=True)
        cfg = {"marl": {"workflow": "voting"}, "rollout": {"role_max_new_tokens": {"aggregator": cap}}}
        (run / "config.yaml").write_text(yaml.safe_dump(cfg))
        row = {"step": 0, "time/step_s": 1.0, "eval/before/episodes": 32.0,
               "eval/before/parse_failures/aggregator": failures}
        (run / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    assert sorted(collect.copy_runs(sweep, tmp_path / "gate", "gate")) == [
        "voting-aggregator-32", "voting-aggregator-64"]
    rows = collect.gate_table(collect.find_runs([tmp_path / "gate"])).splitlines()[2:]
    assert rows == ["| voting | aggregator | 32 | 32 | 20 | 0.375 | no |",
                    "| voting | aggregator | 64 | 32 | 12 | 0.625 | yes |"]


def test_a_role_with_a_turn_per_round_is_gated_on_an_upper_bound_of_its_rate(tmp_path):
    """eval-opt's evaluator answers once per round (2 here): 62 failures in 32 episodes is at most 2 parsed
    turns of 64, not a rate of 1 - 62/32; 20 failures leaves the rate at most 0.688, unproven either way."""
    for cap, failures in ((32, 62.0), (64, 20.0)):
        run = tmp_path / f"eval_opt-evaluator-{cap}"
        run.mkdir()
        cfg = {"marl": {"workflow": "eval_opt", "max_rounds": 2},
               "rollout": {"role_max_new_tokens": {"evaluator": cap}}}
        (run / "config.yaml").write_text(yaml.safe_dump(cfg))
        (run / "metrics.jsonl").write_text(
            json.dumps(
                {"step": 0, "eval/before/episodes": 32.0, "eval/before/parse_failures/evaluator": failures}
            )
            + "\n"
        )
    rows = collect.gate_table(collect.find_runs([tmp_path])).splitlines()[2:]
    assert rows == ["| eval_opt | evaluator | 32 | 32 | 62 | <= 0.031 | no |",
                    "| eval_opt | evaluator | 64 | 32 | 20 | <= 0.688 | ? |"]


def test_arm_names_come_from_the_config():
    base = {"marl": {"workflow": "voting", "sharing": "shared"}, "algo": {"ppo_mini_batch_size": 16}}
    assert collect.arm_of(base) == "voting-shared"
    assert (
        collect.arm_of({**base, "algo": {"ppo_mini_batch_size": 16, "skip_empty_optimizer_steps": True}})
        == "voting-shared+skip"
    )
    assert collect.comparisons(
        ["single_agent-shared", "voting-shared", "voting-isolated", "voting-shared+mb0"]
    ) == [
        ("voting-shared", "single_agent-shared"),
        ("voting-isolated", "single_agent-shared"),
        ("voting-shared", "voting-isolated"),
        ("voting-shared+mb0", "voting-shared"),
    ]


SWEEPS = "jobs/configs/sweeps/"


def test_calibration_and_gate_sweeps_are_valid():
    lrs = [c["learner.optim.lr"] for c in validate(load_sweep(SWEEPS + "cpu_study_v2_calibration.yaml"))]
    assert lrs == [1e-4, 3e-4, 1e-3]
    gate = [flatten(c) for c in validate(load_sweep(SWEEPS + "cpu_study_v2_gate.yaml"))]
    caps = {
        (c["marl.workflow"], next(v for k, v in c.items() if k.startswith("rollout.role_max"))) for c in gate
    }
    assert caps == {(w, n) for w in ("voting", "eval_opt", "orch_workers") for n in (32, 64, 128, 256)}


def test_the_study_sweep_runs_single_agent_at_the_calibrated_lr():
    cells = validate(load_sweep(SWEEPS + "cpu_study_v2.yaml"))
    assert {flatten(c)["learner.optim.lr"] for c in cells} == {3e-4}, (
        "the calibration's outcome (the README's)"
    )
    # The gate removed every voting arm (no workflow passed it): the single-agent seeds remain.
    assert arms_of(cells) == {"single_agent-shared": [0, 1, 2, 3, 4]}
    spec = load_sweep(SWEEPS + "cpu_study_v2.yaml")
    spec.grid["seed"] = [4]  # seed by seed, as the sweep file runs them
    assert arms_of(validate(spec)) == {"single_agent-shared": [4]}


def arms_of(cells: list[dict]) -> dict[str, list[int]]:
    arms: dict[str, list[int]] = {}
    for cell in cells:
        values = flatten(cell)
        cfg = {"marl": {"workflow": values["marl.workflow"], "sharing": values["marl.sharing"]},
               "algo": {"ppo_mini_batch_size": values.get("algo.ppo_mini_batch_size", 16),
                        "skip_empty_optimizer_steps": values.get("algo.skip_empty_optimizer_steps", False)}}
        arms.setdefault(collect.arm_of(cfg), []).append(values["seed"])
    return arms
