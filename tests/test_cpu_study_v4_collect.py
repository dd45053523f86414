"""Study 4's analysis (studies/cpu_smollm2_v4/collect.py, mechanics.py) on small synthetic cells whose
numbers are worked by hand: the paired tests and Holm, the plan and synthesizer measures from evaluation
turns, and the training windows between evaluations."""

from __future__ import annotations

import json
import math

import pyarrow as pa
import pyarrow.parquet as pq

from marl.tasks.data import load_tasks
from studies.cpu_smollm2_v4 import collect, mechanics

SPEC = "reasoning_gym:chain_sum?min_terms=2&max_terms=2&min_digits=1&max_digits=2"


def cell(root, workflow, sharing, seed, curve, extra=None):
    """An exported cell: config, and metrics with a base evaluation and one evaluation after each step."""
    path = root / f"{workflow}-{sharing}" / f"seed{seed}"
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(
        f"seed: {seed}\nmarl:\n  workflow: {workflow}\n  sharing: {sharing}\n  max_strategies: 3\n"
        f"algo:\n  ppo_mini_batch_size: 16\ndata:\n  eval: '{SPEC}'\n  eval_size: 2\n  eval_seed: 0\n"
        "  task: math\n  answer_fallback: none\n")
    rows = [{"step": i, "time/step_s": 1.0, "eval/accuracy": acc, **(extra or [{}] * 4)[i]}
            for i, acc in enumerate(curve[1:])]
    rows[0] |= {"eval/accuracy_before": curve[0]}
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_declared_tests_pair_by_seed_and_holm_the_secondaries(tmp_path):
    # SP - IP finals per seed: +0.2, +0.1, +0.3 (all positive: sign-flip p = 2/8); SA below both
    for seed, (sp, ip, sa) in enumerate(((0.5, 0.3, 0.1), (0.4, 0.3, 0.2), (0.6, 0.3, 0.0))):
        cell(tmp_path, "orch_workers", "shared", seed, [0.1, 0.2, 0.2, 0.2, sp])
        cell(tmp_path, "orch_workers", "isolated", seed, [0.1, 0.2, 0.2, 0.2, ip])
        cell(tmp_path, "single_agent", "shared", seed, [0.1, 0.1, 0.1, 0.1, sa])
    runs = collect.committed(tmp_path)
    found = {name: (n, mean, p) for name, n, mean, p, _ in collect.tests(runs)}
    n, mean, p = found["primary: SP - IP, final"]
    assert n == "3" and math.isclose(mean, 0.2) and p == 0.25
    assert math.isclose(found["(a) SP - IP, last-3"][1], 0.2 / 3)  # two shared evaluations of 0.2 cancel
    assert found["(b) cliffs SP vs IP"][0] == "0/3 vs 0/3" and found["(b) cliffs SP vs IP"][2] == 1.0
    assert found["(c) SP - SA, final"][2] == 0.25 and found["(d) IP - SA, final"][2] == 0.25
    lines = collect.tests_table(runs).splitlines()
    # Holm over the four secondaries (0.25, 1, 0.25, 0.25): 4 * 0.25 = 1 capped, so every one is 1.000
    assert lines[2].startswith(
        "| primary: SP - IP, final | 3 | +0.200 | 0.250 | 0.250 | – (judged alone) | 1.000")
    assert lines[3].startswith("| (a) SP - IP, last-3 | 3 | +0.067 | 0.250 | 0.250 | 1.000 |")
    assert "95 % interval (sign-flip inverted): -inf to +inf" in lines[-1]  # 3 seeds cannot reject at 0.05


def test_plans_are_counted_and_ended_by_the_workflows_parser(tmp_path):
    path = cell(tmp_path, "orch_workers", "shared", 0, [0.0] * 5)
    plans = ["STRATEGY 1: add\nSTRATEGY 2: count", "1. add\n2. carry\n3. check\n4. again", "just add them",
             ""]
    pq.write_table(pa.Table.from_pylist([{"step": 10, "role": "orchestrator", "response": t} for t in plans]),
                   path / "eval_turns.parquet")
    m = mechanics.plan_measures(path)[10]
    assert (m["plans 2"], m["plans >3"], m["plans 1"], m["plans 0"]) == (0.25, 0.25, 0.25, 0.25)
    assert (m["format strategy"], m["format numbered"], m["format lines"], m["format none"]) == (0.25,) * 4
    assert m["ended"] == 0.5  # four strategies, and none


def test_the_synthesizers_decision_is_its_episode_reward_against_the_graded_workers(tmp_path):
    path = cell(tmp_path, "orch_workers", "shared", 0, [0.0] * 5)
    tasks = load_tasks(SPEC, 2, 1_000_000_000, "math")
    right = [f"\\boxed{{{t.answer}}}" for t in tasks]
    rows = [(0, "worker", "worker0", "\\boxed{-1}", 0.0), (0, "worker", "worker1", right[0], 0.0),
            (0, "worker", "worker2", right[0], 0.0), (0, "synthesizer", "synthesizer", "x", 0.0),
            (1, "worker", "worker0", "\\boxed{-1}", 1.0), (1, "synthesizer", "synthesizer", right[1], 1.0)]
    turns = [{"step": 0, "episode": e, "task_id": tasks[e].task_id, "role": r, "agent": a, "response": t,
              "episode_reward": w} for e, r, a, t, w in rows]
    pq.write_table(pa.Table.from_pylist(turns), path / "eval_turns.parquet")
    m = mechanics.synthesizer_measures(path)[0]
    # episode 0 alone had a right worker (2 of 3), and the synthesizer missed it; worker0 was wrong
    assert m["available"] == 1 and m["decision"] == 0.0 and m["first"] == 0.0
    assert math.isclose(m["random"], 2 / 3) and m["majority_available"] == 1.0 and m["accuracy"] == 0.5


def test_training_windows_average_the_steps_since_the_previous_evaluation(tmp_path):
    rows = [{"step": 0, "grad/step_mass_share/worker": 0.6, "grad/step_mass_share/synthesizer": 0.4,
             "grad/role_norm/worker": 1.0, "grad/role_norm/synthesizer": 4.0},
            {"step": 1, "grad/step_mass_share/worker": 0.0, "grad/step_mass_share/synthesizer": 0.0,
             "eval/accuracy": 0.1},  # no gradient: not a share
            {"step": 2, "grad/step_mass_share/worker": 0.8, "grad/step_mass_share/synthesizer": 0.2,
             "grad/role_norm/worker": 2.0, "grad/role_norm/synthesizer": 2.0},
            {"step": 3, "grad/step_mass_share/worker": 1.0, "grad/step_mass_share/synthesizer": 0.0,
             "grad/role_norm/worker": 1.0, "grad/role_norm/synthesizer": 0.0, "eval/accuracy": 0.2}]
    assert mechanics.windows(rows, "grad/step_mass_share/worker", "grad/step_mass_share/") == [0.6, 0.9]
    assert mechanics.windows(rows, "grad/step_mass_share/worker") == [0.3, 0.9]
    # step 3: the synthesizer did not train, so the second window holds step 2 alone
    assert mechanics.role_norm_ratio(rows, "synthesizer") == [4.0, 1.0]


def test_the_mechanics_agree_with_what_a_committed_orch_workers_run_logged():
    # study 3's gate cell ran orchestrator-workers evaluations: the re-read plans and the synthesizer's
    # rewards must give what its metrics logged (plan formats 63 strategy + 1 lines of 64, accuracy 6/64)
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "studies/cpu_smollm2_v3/gate/orch_workers-orchestrator-32"
    rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines() if line.strip()]
    logged = {k: v for row in rows for k, v in row.items()}
    plans = mechanics.plan_measures(path)[0]
    assert plans["format strategy"] * 64 == logged["eval/before/plan_format/strategy"] == 63
    assert plans["format lines"] * 64 == logged["eval/before/plan_format/lines"] == 1
    decisions = mechanics.synthesizer_measures(path)[0]
    assert decisions["accuracy"] == logged["eval/accuracy_before"]
    assert decisions["available"] == 12  # a right worker in 12 of 64 episodes at base
