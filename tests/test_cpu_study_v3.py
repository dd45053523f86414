"""Study 3's viability gate: the Wilson interval by hand, the parse counts per coordinating role (the
orchestrator by its workflow's own parser), the gate sweep's cells and the cap rules; the runner's per-seed
sweeps and its refusal to run off the pinned commit."""

from __future__ import annotations

import datetime as dt
import json
import math
import subprocess

import pytest
from omegaconf import OmegaConf

from jobs.config.sweep_spec import load_sweep, validate
from jobs.driver.eval_records import write_eval_turns
from jobs.report import load_run
from jobs.sweep import setup_of, trial_config
from marl.types import Completion, Episode, Task, Turn
from studies.cpu_smollm2_v2.collect import Run
from studies.cpu_smollm2_v3.collect import (
    IP,
    SA,
    SP,
    ProvenanceError,
    check_provenance,
    choice_counts,
    eval_series,
    parse_rate,
    run_minutes,
    slim_turns,
)
from studies.cpu_smollm2_v3.collect import tests_table as seed_tests_table
from studies.cpu_smollm2_v3.gate import (
    aggregator_cap,
    answer_cap,
    base_lengths,
    ended_within,
    gate_table,
    parsed_turns,
    wilson,
)
from studies.cpu_smollm2_v3.run import (
    StudyError,
    cell_sweep,
    cells,
    check_commit,
    exported,
    fits,
    parse_until,
)
from studies.cpu_smollm2_v3.stats import incomplete_beta, permutation_p, student_two_sided, welch


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
    assert "marl.prompts=fewshot" in spec.overrides and "learner.optim.schedule=constant" in spec.overrides
    lengths = [c["gate"] for c in cells if c["gate"]["marl.workflow"] == "single_agent"]
    assert lengths == [{"marl.workflow": "single_agent", "rollout.sampling.max_new_tokens": 96}]


def test_answer_cap_rule_by_hand():
    # 10 responses: 8 end within 32, one at 40, one cut at the cap (96, 'length').
    lengths = [(20, "stop")] * 8 + [(40, "stop"), (96, "length")]
    assert ended_within(lengths, 32) == 0.8 and ended_within(lengths, 48) == 0.9
    assert answer_cap(lengths) == 48
    assert answer_cap([(20, "stop")] * 9 + [(33, "stop")]) == 32
    assert answer_cap([(70, "stop")] * 10) == 64  # none reaches 90 %: the largest


def test_aggregator_cap_is_the_smallest_passing_voting_cap():
    rows = [
        ["eval_opt", "evaluator", "32", "", "", "", "", "yes"],
        ["voting", "aggregator", "32", "", "", "", "", "no"],
        ["voting", "aggregator", "64", "", "", "", "", "yes"],
    ]
    assert aggregator_cap(rows) == 64
    assert aggregator_cap(rows[:2]) is None


def test_base_lengths_read_the_base_evaluations_turns(tmp_path):
    task = Task("t0", "1 + 1", "2")
    turns = [Turn("solver", "solver", 0, [], Completion("2", [1, 2], [5, 6, 7], [-0.1] * 3, "stop"))]
    write_eval_turns(tmp_path, 0, [Episode(task, 0, "single_agent", turns=turns, reward=1.0)])
    assert base_lengths(tmp_path) == [(3, "stop")]


def test_cells_run_seed_by_seed_each_with_the_caps_on_the_right_roles(tmp_path):
    order = cells([3, 4])
    assert [(seed, arm["marl.workflow"], arm["marl.sharing"]) for seed, arm in order] == [
        (3, "single_agent", "shared"), (3, "voting", "shared"), (3, "voting", "isolated"),
        (4, "single_agent", "shared"), (4, "voting", "shared"), (4, "voting", "isolated")]
    configs, names = [], []
    for seed, arm in order[:3]:
        path = tmp_path / "cell.yaml"
        path.write_text(OmegaConf.to_yaml(OmegaConf.create(cell_sweep(seed, arm, 48, 64))))
        spec = load_sweep(str(path))
        (cell,) = validate(spec)
        assert cell["seed"] == 3 and cell["arm"] == arm
        names.append(spec.name)
        configs.append(trial_config(setup_of(spec), {"grid": cell}, "t"))
    assert names == ["cpu_study_v3_s3_sa", "cpu_study_v3_s3_sp", "cpu_study_v3_s3_ip"]
    assert all(c.rollout.sampling.max_new_tokens == 48 and c.marl.prompts == "fewshot" for c in configs)
    assert [dict(c.rollout.role_max_new_tokens) for c in configs] == [
        {},
        {"aggregator": 64},
        {"aggregator": 64},
    ]
    assert all((c.learner.optim.lr, str(c.learner.optim.schedule)) == (3e-4, "constant") for c in configs)


def test_a_cell_exported_to_the_studys_folder_is_not_run_again(tmp_path):
    seed, arm = cells([2])[1]
    assert not exported(tmp_path, seed, arm)
    dest = tmp_path / "runs" / "voting-shared" / "seed2"  # collect.py's destination of that run
    dest.mkdir(parents=True)
    (dest / "metrics.jsonl").write_text("{}\n")
    assert (
        exported(tmp_path, seed, arm)
        and not exported(tmp_path, 3, arm)
        and not exported(tmp_path, *cells([2])[2])
    )


def _git(cwd, *args):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def test_until_is_the_next_such_time_and_a_cell_starts_only_if_its_estimate_fits():
    now = dt.datetime.now(dt.UTC)
    soon = now + dt.timedelta(minutes=30)
    until = parse_until(f"{soon.hour:02d}:{soon.minute:02d}")
    assert dt.timedelta(minutes=28) < until - now <= dt.timedelta(minutes=30)
    past = now - dt.timedelta(minutes=5)  # already past today: tomorrow's
    assert parse_until(f"{past.hour:02d}:{past.minute:02d}") - now > dt.timedelta(hours=23)
    assert fits(until, 15) and not fits(until, 45) and fits(None, 10_000)


def test_the_runner_runs_only_from_the_tagged_commit_on_a_clean_tree(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("a")
    _git(tmp_path, "add", "a.txt")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    with pytest.raises(StudyError, match="no tag study-v3"):
        check_commit()
    _git(tmp_path, "tag", "study-v3")
    assert len(check_commit()) == 40
    (tmp_path / "a.txt").write_text("b")
    with pytest.raises(StudyError, match="uncommitted"):
        check_commit()
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "two")
    with pytest.raises(StudyError, match="study's commit"):
        check_commit()


def test_permutation_p_by_hand():
    # 20 splits of six values into three and three; only the observed split and its mirror are this extreme.
    assert permutation_p([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]) == pytest.approx(2 / 20)
    assert permutation_p([1.0, 1.0], [1.0, 1.0]) == 1.0  # every split ties the observed zero
    assert permutation_p([0.3, 0.4, 0.2, 0.5, 0.35], [0.1, 0.18, 0.15, 0.05, 0.12]) == pytest.approx(2 / 252)
    # a tie across the arms (0.2 in both) doubles the extreme splits: the swap of the tied values is one too
    assert permutation_p([0.3, 0.4, 0.2, 0.5, 0.35], [0.1, 0.2, 0.15, 0.05, 0.12]) == pytest.approx(4 / 252)
    assert math.isnan(permutation_p([], [1.0]))


def test_student_t_against_table_values():
    # Two-sided 5 % and 1 % critical values of Student's t (any statistics table).
    for t, df, p in [
        (2.776, 4, 0.05),
        (2.306, 8, 0.05),
        (3.355, 8, 0.01),
        (1.960, 1e6, 0.05),
        (12.706, 1, 0.05),
    ]:
        assert student_two_sided(t, df) == pytest.approx(p, abs=2e-4)
    assert student_two_sided(0.0, 5) == pytest.approx(1.0)
    assert incomplete_beta(0.3, 2, 3) == pytest.approx(0.3483, abs=1e-4)  # 1 - sum_{j<2} C(4,j) .3^j .7^(4-j)


def test_welch_by_hand():
    a, b = [0.3, 0.4, 0.5], [0.1, 0.2, 0.2, 0.1]
    t, df, p = welch(a, b)
    va, vb = 0.01 / 3, (1 / 300) / 4  # sample variances 0.01 and 1/300 over n
    assert t == pytest.approx((0.4 - 0.15) / math.sqrt(va + vb))
    assert df == pytest.approx((va + vb) ** 2 / (va**2 / 2 + vb**2 / 3))
    assert p == pytest.approx(student_two_sided(t, df)) and p < 0.05
    assert all(math.isnan(v) for v in welch([0.1], [0.2, 0.3]))


def _voting_run(root, seed: int, commit: str = "c0ffee", dirty: bool = False, final: float = 0.5):
    """A committed-looking voting run: base and one later evaluation, with the aggregator's counts."""
    run = root / f"run{seed}"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(f"seed: {seed}\nmarl:\n  workflow: voting\n  sharing: shared\n"
                                     "algo:\n  ppo_mini_batch_size: 16\ndata:\n  eval_size: 4\n")
    rows = [{"step": 0, "code/commit": commit, "code/dirty": dirty, "eval/accuracy_before": 0.25,
             "eval/before/turns/aggregator": 4.0, "eval/before/parse_failures/aggregator": 1.0,
             "time/step_s": 1.0, "grad/step_norm_share/aggregator": 0.2, "update/policy_move/shared": 0.01},
            {"step": 1, "time/step_s": 1.0, "eval/accuracy": final, "eval/turns/aggregator": 4.0,
             "eval/choice/accuracy/aggregator": 0.75, "grad/step_norm_share/aggregator": 0.4}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_collect_refuses_a_run_from_another_commit_or_a_dirty_tree(tmp_path):
    assert check_provenance(_voting_run(tmp_path, 0), "c0ffee") == 1
    with pytest.raises(ProvenanceError, match="not the study's commit"):
        check_provenance(_voting_run(tmp_path, 1, commit="other"), "c0ffee")
    with pytest.raises(ProvenanceError, match="dirty: True"):
        check_provenance(_voting_run(tmp_path, 2, dirty=True), "c0ffee")
    resumed = _voting_run(tmp_path, 3)
    with (resumed / "metrics.jsonl").open("a") as f:  # a second start at another commit
        f.write(json.dumps({"step": 1, "code/commit": "other", "code/dirty": False}) + "\n")
    with pytest.raises(ProvenanceError):
        check_provenance(resumed, "c0ffee")


def test_eval_series_and_parse_rate_read_base_then_evaluations(tmp_path):
    rows = load_run(_voting_run(tmp_path, 0)).rows
    assert eval_series(rows, "eval/choice/accuracy/aggregator")[1] == 0.75
    assert math.isnan(eval_series(rows, "eval/choice/accuracy/aggregator")[0])  # base did not log it here
    assert parse_rate(rows, "aggregator") == [0.75, 1.0]  # 1 of 4 failed at base, none after (not logged: 0)


def test_slim_turns_keep_what_roles_wrote_and_its_length(tmp_path):
    task = Task("t0", "1 + 1", "2")
    turns = [
        Turn("generator", "generator0", 0, [], Completion("2", [1], [5, 6], [-0.1] * 2, "stop")),
        Turn(
            "aggregator", "aggregator", 0, [], Completion("\\boxed{1}", [1], [7, 8, 9], [-0.1] * 3, "length")
        ),
    ]
    for steps in (0, 10):
        write_eval_turns(tmp_path, steps, [Episode(task, 0, "voting", turns=turns, reward=1.0)])
    table = slim_turns(tmp_path).to_pylist()
    assert [(r["step"], r["role"], r["response_tokens"], r["finish_reason"]) for r in table] == [
        (0, "generator", 2, "stop"), (0, "aggregator", 3, "length"), (10, "generator", 2, "stop"),
        (10, "aggregator", 3, "length")]
    assert "messages" not in table[0] and "logprobs" not in table[0] and table[1]["response"] == "\\boxed{1}"


def test_choice_counts_read_the_aggregator_turns_as_the_workflow_parses_them(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    turns = [  # (step, role, response): 1, 3, unparsed (prose, and an out-of-range box), a generator ignored
        (0, "aggregator", "\\boxed{1}"), (0, "aggregator", "so \\boxed{3}."), (0, "aggregator", "It is 2."),
        (0, "generator", "\\boxed{2}"), (10, "aggregator", "\\boxed{7}"), (10, "aggregator", "\\boxed{2}"),
    ]
    columns = dict(zip(("step", "role", "response"), map(list, zip(*turns, strict=True)), strict=True))
    pq.write_table(pa.table(columns), tmp_path / "eval_turns.parquet")
    assert choice_counts(tmp_path) == {0: [1, 0, 1, 1], 10: [0, 1, 0, 1]}


def test_run_minutes_sum_steps_and_evaluations_by_hand():
    rows = [{"time/step_s": 30.0, "time/eval_before_s": 60.0, "time/update_s": 20.0},
            {"time/step_s": 45.0, "time/eval_s": 45.0, "eval/accuracy": 0.5}, {"time/step_s": float("nan")}]
    assert run_minutes(rows) != run_minutes(rows)  # a NaN is not hidden
    assert run_minutes(rows[:2]) == 3.0  # 30 + 60 + 45 + 45 s; update_s is inside step_s, not added


def test_training_shares_average_the_steps_with_a_gradient_and_movement_every_step(tmp_path):
    from studies.cpu_smollm2_v3.collect import _training_mean

    run_dir = _voting_run(tmp_path, 0)
    rows = [{"step": s, "grad/step_norm_share/aggregator": a, "grad/step_norm_share/generator": g,
             "update/policy_move/shared": m} for s, a, g, m in
            [(0, 0.0, 0.0, 0.0), (1, 0.2, 0.8, 0.3), (2, 0.0, 0.0, 0.0), (3, 0.4, 0.6, 0.1)]]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = Run(SP, 0, load_run(run_dir), [0.1, 0.2], 64, {}, 3e-4)
    # A step with no advantage logs 0 for every role; it is left out of the shares, not of the movement.
    assert _training_mean(run, "grad/step_norm_share/", True) == pytest.approx(
        {"aggregator": 0.3, "generator": 0.7})
    assert _training_mean(run, "grad/step_norm_share/", False) == pytest.approx(
        {"aggregator": 0.15, "generator": 0.35})
    assert _training_mean(run, "update/policy_move/", False) == pytest.approx({"shared": 0.1})


def test_role_norms_keep_the_steps_where_both_roles_trained_and_the_table_takes_medians(tmp_path):
    from studies.cpu_smollm2_v3.collect import role_norms, role_norms_table

    rows = [{"step": s, "grad/role_norm/aggregator": a, "grad/role_norm/generator": g} for s, (a, g) in
            enumerate([(0.0, 0.5), (0.9, 0.3), (0.2, 0.0), (0.4, 0.4), (0.5, 0.1)])] + [{"step": 9}]
    assert role_norms(rows) == [(0.9, 0.3), (0.4, 0.4), (0.5, 0.1)]
    run_dir = _voting_run(tmp_path, 0)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = Run(IP, 0, load_run(run_dir), [0.1, 0.2], 64, {}, 3e-4)
    idle = Run(SP, 1, load_run(_voting_run(tmp_path, 1)), [0.1, 0.2], 64, {}, 3e-4)
    table = role_norms_table([run, idle, Run(SA, 0, None, [0.1], 64, {}, 3e-4)])  # type: ignore[arg-type]
    # Ratios 3, 1 and 5: their median is 3, not the ratio of the medians (0.5 / 0.3).
    assert f"| {IP} | 0 | 3 | 0.500 | 0.300 | 3.00 |" in table
    assert f"| {SP} | 1 | 0 | – | – | – |" in table and SA not in table


def test_mechanics_table_means_each_evaluation_over_seeds(tmp_path):
    from studies.cpu_smollm2_v3.collect import mechanics_table

    runs = []
    for seed, available in enumerate([(2.0, 3.0), (4.0, 1.0)]):
        run_dir = _voting_run(tmp_path, seed)
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        rows[0]["eval/before/choice/available/aggregator"] = available[0]
        rows[1]["eval/choice/available/aggregator"] = available[1]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        runs.append(Run(SP, seed, load_run(run_dir), [0.25, 0.5], 4, {}, 3e-4))
    table = mechanics_table(runs)
    assert f"| {SP} | episodes with a right candidate | 3.000 | 2.000 |" in table
    assert f"| {SP} | aggregator parse rate | 0.750 | 1.000 |" in table  # 1 of 4 failed at base, none after
    assert f"| {SP} | aggregator choice accuracy | – | 0.750 |" in table


def test_grading_again_gives_every_committed_single_agent_turn_its_logged_reward():
    import pyarrow.parquet as pq

    import studies.cpu_smollm2_v3.collect as collect

    runs = [r for r in collect.committed() if r.arm == SA]
    assert runs, "the study has committed single-agent runs"
    path = runs[0].record.path
    graded = collect.graded_turns(path, "solver")
    turns = pq.read_table(path / "eval_turns.parquet", columns=["step", "episode", "reward"]).to_pylist()
    logged: dict[int, dict[int, float]] = {}
    for t in turns:
        logged.setdefault(t["step"], {})[t["episode"]] = t["reward"]
    assert {step: [e[0][1] for e in episodes] for step, episodes in graded.items()} == {
        step: list(by_episode.values()) for step, by_episode in logged.items()}
    assert sum(len(e) for e in graded.values()) == len(turns) == 5 * 64


def test_generator_measures_by_hand(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from studies.cpu_smollm2_v3.collect import generator_measures, graded_turns

    spec = "reasoning_gym:chain_sum?min_terms=2&max_terms=2&min_digits=1&max_digits=2"
    (tmp_path / "config.yaml").write_text(
        f"data:\n  eval: '{spec}'\n  eval_size: 2\n  eval_seed: 0\n  task: math\n  answer_fallback: none\n")
    from marl.tasks.data import load_tasks
    tasks = load_tasks(spec, 2, 1_000_000_000, "math")
    right = [f"\\boxed{{{t.answer}}}" for t in tasks]
    # Step 0: episode 0 all three right (they agree); episode 1 one right, two alike but wrong, one unread.
    rows = [(0, 0, 0, right[0]), (0, 0, 0, right[0]), (0, 0, 0, right[0]),
            (0, 1, 1, right[1]), (0, 1, 1, "\\boxed{-1}"), (0, 1, 1, "no answer")]
    turns = [{"step": st, "episode": ep, "task_id": tasks[t].task_id, "role": "generator",
              "agent": f"generator{i % 3}", "response": r} for i, (st, ep, t, r) in enumerate(rows)]
    turns.append({"step": 0, "episode": 0, "task_id": tasks[0].task_id, "role": "aggregator",
                  "agent": "aggregator", "response": "\\boxed{1}"})
    pq.write_table(pa.Table.from_pylist(turns), tmp_path / "eval_turns.parquet")
    assert [score for _, score in graded_turns(tmp_path, "generator")[0][1]] == [1.0, 0.0, 0.0]
    assert generator_measures(tmp_path) == ([4 / 6], [0.5])


def test_tests_table_runs_the_seed_level_tests_in_order():
    def run(arm, seed, final):
        return Run(arm, seed, None, [0.1, final], 64, {}, 3e-4)  # type: ignore[arg-type]
    runs = [run(SP, s, f) for s, f in enumerate([0.3, 0.4, 0.5])] + [
        run(IP, s, f) for s, f in enumerate([0.1, 0.2, 0.15])] + [run(SA, s, 0.3) for s in range(3)]
    table = seed_tests_table(runs).splitlines()
    assert table[2].startswith(f"| {SP} vs {IP} | 3 / 3 | +0.250 | 0.100 |")  # 2 of the 20 splits
    assert table[3].startswith(f"| {SP} vs {SA} |") and table[4].startswith(f"| {IP} vs {SA} |")


def test_seeds_and_cliff_tables_apply_the_rule_per_run_by_hand():
    from studies.cpu_smollm2_v3.collect import cliff_tests_table, seeds_table

    def run(arm, seed, curve):
        return Run(arm, seed, None, curve, 64, {}, 3e-4)  # type: ignore[arg-type]
    # 0.5 -> 0.1 is 0.4 below the peak (two standard errors at 64 tasks: about 0.16): a cliff;
    # 0.3 -> 0.25 is not
    runs = [run(SP, 0, [0.1, 0.5, 0.1]), run(SP, 1, [0.1, 0.3, 0.25]), run(IP, 0, [0.1, 0.2, 0.3]),
            run(IP, 1, [0.2, 0.2, 0.2])]
    table = seeds_table(runs)
    assert f"| {SP} | 0 | 0.100 | 0.500 | 0.100 | +0.000 | yes |" in table
    assert f"| {SP} | 1 | 0.100 | 0.300 | 0.250 | +0.150 | no |" in table
    assert f"| {IP} | 0 | 0.100 | 0.300 | 0.300 | +0.200 | no |" in table
    cliffs = cliff_tests_table(runs).splitlines()
    # Fisher on [[1, 1], [0, 2]]: both tables with a cliff in one arm are as likely (1/2 each) -> p = 1
    assert cliffs[2] == f"| {SP} vs {IP} | 1/2 vs 0/2 | 1.000 |" and len(cliffs) == 3  # no SA runs


def test_the_readme_tables_are_those_of_the_committed_runs():
    import studies.cpu_smollm2_v3.collect as collect

    in_readme = collect.readme_tables(collect.README.read_text())
    assert set(in_readme) == {*collect.TABLES, "gate", "lengths"}, "every measured table has its place, once"
    assert in_readme == collect.committed_tables(), (
        "stale tables: run `python -m studies.cpu_smollm2_v3.collect`"
    )
    for run in collect.committed():  # every committed run ran from the study's one commit, on a clean tree
        assert collect.check_provenance(run.record.path) >= 1


def test_mean_curve_leaves_out_missing_values_by_hand():
    from studies.cpu_smollm2_v3.figures import mean_curve

    got = mean_curve([[1.0, math.nan, 3.0], [3.0, 5.0]])
    assert got == [2.0, 5.0]  # positions past the shortest seed are not drawn
    assert math.isnan(mean_curve([[math.nan], [math.nan]])[0])


def test_a_share_is_not_drawn_on_a_step_without_a_gradient():
    from studies.cpu_smollm2_v3.figures import share_per_step

    rows = [{"step": 0, "grad/step_norm_share/aggregator": 0.0, "grad/step_norm_share/generator": 0.0},
            {"step": 1, "grad/step_norm_share/aggregator": 0.0, "grad/step_norm_share/generator": 1.0},
            {"step": 2, "grad/step_norm_share/aggregator": 0.25, "grad/step_norm_share/generator": 0.75}]
    steps, shares = share_per_step(rows, "grad/step_norm_share/aggregator")
    assert steps == [0, 1, 2] and math.isnan(shares[0]) and shares[1:] == [0.0, 0.25]


def test_the_figure_draws_every_committed_run(tmp_path):
    import studies.cpu_smollm2_v3.collect as collect
    from studies.cpu_smollm2_v3.figures import draw, per_step

    runs = collect.committed()
    out = draw(runs, tmp_path / "figure.png", collect.parse_rate, collect.eval_series)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1530, 675)  # 17 x 7.5 inches at 90 dpi
    voting = [r for r in runs if r.arm.startswith("voting")]
    for run in voting:  # the per-step panels have their data in every voting run
        steps, shares = per_step(run.record.rows, "grad/step_norm_share/aggregator")
        assert len(steps) == len(shares) > 0 and all(0.0 <= s <= 1.0 for s in shares)


def test_checkpointed_runner_adds_checkpointing_to_the_voting_cells_only():
    from studies.cpu_smollm2_v3 import checkpointed

    voting = checkpointed.cell_sweep(0, {"marl.workflow": "voting", "marl.sharing": "isolated"}, 64, 32)
    single = checkpointed.cell_sweep(1, {"marl.workflow": "single_agent", "marl.sharing": "shared"}, 64, 32)
    assert voting["overrides"][-1] == "learner.gradient_checkpointing=true"
    assert voting["overrides"][:-1] == cell_sweep(0, {"marl.workflow": "voting", "marl.sharing": "isolated"},
                                                  64, 32)["overrides"]
    assert "learner.gradient_checkpointing=true" not in single["overrides"]
