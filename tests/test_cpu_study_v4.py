"""Study 4 (studies/cpu_smollm2_v4/): its cells' order and sweeps, the pilot's separation from the study's
seeds, the refusal to run off the pinned commit, and the declared paired tests by hand."""

from __future__ import annotations

import math
import subprocess

import pytest
from omegaconf import OmegaConf

from jobs.config.sweep_spec import load_sweep, validate
from jobs.sweep import setup_of, trial_config
from studies.cells import StudyError, check_commit
from studies.cpu_smollm2_v4.run import PILOT_SEED, cell_sweep, cells, estimates, main
from studies.cpu_smollm2_v4.stats import (
    differences,
    holm,
    midranks,
    sign_flip_interval,
    sign_flip_p,
    wilcoxon_p,
)


def _arms(order):
    return [(seed, arm["marl.workflow"], arm["marl.sharing"]) for seed, arm in order]


def test_seeds_run_in_turn_single_agent_first_and_the_two_sharings_alternating():
    assert _arms(cells([0, 1])) == [
        (0, "single_agent", "shared"), (0, "orch_workers", "shared"), (0, "orch_workers", "isolated"),
        (1, "single_agent", "shared"), (1, "orch_workers", "isolated"), (1, "orch_workers", "shared")]


def test_a_cells_sweep_is_study_3s_settings_with_the_orchestrators_cap_and_the_horizon(tmp_path):
    configs = []
    for seed, arm in cells([4]):
        path = tmp_path / "cell.yaml"
        path.write_text(OmegaConf.to_yaml(OmegaConf.create(cell_sweep(seed, arm, 60))))
        spec = load_sweep(str(path))
        (cell,) = validate(spec)
        assert cell["seed"] == 4 and cell["arm"] == arm
        configs.append(trial_config(setup_of(spec), {"grid": cell}, "t"))
    assert [(c.steps, c.eval_every) for c in configs] == [(60, 15)] * 3
    assert all(c.rollout.sampling.max_new_tokens == 64 and c.marl.prompts == "fewshot" for c in configs)
    assert [dict(c.rollout.role_max_new_tokens) for c in configs] == [{}] + [{"orchestrator": 32}] * 2
    assert all((c.learner.optim.lr, str(c.learner.optim.schedule)) == (3e-4, "constant") for c in configs)
    assert all(c.learner.gradient_checkpointing for c in configs)
    assert cell_sweep(*cells([4])[0], 60)["name"] == "cpu_study_v4_s4_sa_h60"
    assert cell_sweep(PILOT_SEED, cells([0])[1][1], 40)["name"] == "cpu_study_v4_pilot_sp_h40"
    with pytest.raises(StudyError, match="multiple of 4"):
        cell_sweep(0, cells([0])[0][1], 42)


def test_the_estimates_scale_the_training_half_with_the_horizon():
    at40, at80 = estimates(40), estimates(80)
    assert all(at80[k] == pytest.approx(1.5 * at40[k]) for k in at40)


def test_the_arms_need_a_horizon_and_never_take_the_pilots_seed(capsys):
    assert main(["arms"]) == 2
    assert main(["arms", "--steps", "40", "--seeds", "0", str(PILOT_SEED)]) == 2
    assert "pilot's" in capsys.readouterr().err


def _git(cwd, *args):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def test_the_runner_runs_only_from_the_tagged_commit_on_a_clean_tree(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("a")
    _git(tmp_path, "add", "a.txt")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    with pytest.raises(StudyError, match="no tag study-v4"):
        check_commit("study-v4")
    _git(tmp_path, "tag", "study-v4")
    assert len(check_commit("study-v4")) == 40
    (tmp_path / "a.txt").write_text("b")
    with pytest.raises(StudyError, match="uncommitted"):
        check_commit("study-v4")


def test_sign_flip_p_by_hand():
    # Four positive differences: of the 16 sign assignments only all-plus and all-minus reach |sum| 10.
    assert sign_flip_p([1.0, 2.0, 3.0, 4.0]) == pytest.approx(2 / 16)
    # [1, -1, 2], observed |sum| 2: the 8 sums of +-1 +-1 +-2 are 4, 0, 2, -2, 2, -2, 0, -4; 6 reach 2.
    assert sign_flip_p([1.0, -1.0, 2.0]) == pytest.approx(6 / 8)
    assert sign_flip_p([]) == 1.0 and sign_flip_p([0.0, 0.0]) == 1.0
    assert differences([0.5, 0.25], [0.25, 0.25]) == [0.25, 0.0]
    with pytest.raises(ValueError, match="same seeds"):
        differences([0.1], [0.1, 0.2])


def test_wilcoxon_p_by_hand():
    assert midranks([3.0, 1.0, 3.0, 2.0]) == [3.5, 1.0, 3.5, 2.0]
    # Five positive differences: the rank sum 15 is reached only by all-plus and all-minus of 32.
    assert wilcoxon_p([0.1, 0.2, 0.3, 0.4, 0.5]) == pytest.approx(2 / 32)
    # A zero is dropped: the same as the four nonzero ones.
    assert wilcoxon_p([0.1, -0.2, 0.0, 0.3, 0.4]) == pytest.approx(wilcoxon_p([0.1, -0.2, 0.3, 0.4]))
    # ranks of |d| = 1, 2, 3, 4; observed signed sum 1 - 2 + 3 + 4 = 6; |sum| >= 6 in 6 of 16 assignments
    assert wilcoxon_p([0.1, -0.2, 0.3, 0.4]) == pytest.approx(6 / 16)


def test_holm_by_hand():
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.001]) == pytest.approx([0.5, 0.002])
    assert holm([0.9, 0.8]) == pytest.approx([1.0, 1.0])  # 0.8 x 2 capped at 1


def test_sign_flip_interval_holds_the_mean_and_widens_with_the_spread():
    d = [0.05, 0.10, 0.08, 0.12, 0.02, 0.09, 0.11, 0.07, 0.06, 0.10, 0.04]
    low, high = sign_flip_interval(d)
    mean = sum(d) / len(d)
    assert low < mean < high and low > 0  # all positive: 0 is rejected (p 2/2048)
    wide = sign_flip_interval([x * 3 for x in d])
    assert wide[1] - wide[0] > 2.5 * (high - low)
    assert sign_flip_interval([0.1, 0.2]) == (float("-inf"), float("inf"))  # 2 seeds never reject at 0.05


def test_mean_strategies_counts_the_plans_of_one_to_three_strategies():
    from studies.cpu_smollm2_v4.figures import mean_strategies

    shares = {"plans 1": 0.25, "plans 2": 0.25, "plans 3": 0.25, "plans >3": 0.125, "plans 0": 0.125}
    assert mean_strategies(shares) == 2.0
    assert mean_strategies({**shares, "plans 1": 0.5, "plans 3": 0.0}) == (0.5 + 0.5) / 0.75
    assert math.isnan(mean_strategies(dict.fromkeys(shares, 0.0)))


def test_the_pilots_mechanics_are_drawn_from_its_committed_cells(tmp_path):
    from studies.cpu_smollm2_v4 import collect, figures

    runs = collect.committed(collect.HERE / "pilot")
    assert {r.arm for r in runs} == {collect.SA, collect.SP, collect.IP}
    ratios = figures.at_evals(next(r for r in runs if r.arm == collect.IP),
                              [1.0] * 4, base=False)
    assert ratios == ([10, 20, 30, 40], [1.0] * 4)  # the IP ratios sit at the evaluations after the base
    out = figures.draw(runs, tmp_path / "pilot.png", "pilot")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_committed_results_are_those_of_the_exported_cells():
    from studies.cpu_smollm2_v4 import collect

    assert (collect.HERE / "results.md").read_text() == collect.results(collect.HERE), (
        "results.md is stale: run python -m studies.cpu_smollm2_v4.collect")


def test_the_cost_counts_training_and_both_kinds_of_evaluation_and_projects_the_cells_left():
    from studies.cpu_smollm2_v4 import collect

    rows = [{"step": 0, "time/eval_before_s": 60.0, "time/step_s": 120.0},
            {"step": 1, "time/step_s": 180.0, "time/eval_s": 30.0}, {"step": 2, "time/eval_s": None}]
    assert collect.cell_minutes(rows) == (5.0, 1.5)
    runs = collect.committed(collect.HERE / "pilot")
    table = collect.cost_table(runs, planned=3).splitlines()
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in table[2:3 + len(runs)]]
    logged = {row[0]: row for row in cells}
    for run in runs:  # one pilot cell per arm, so two left of three, at that cell's minutes
        minutes = sum(collect.cell_minutes(run.record.rows))
        assert logged[run.arm][5] == "2"
        assert float(logged[run.arm][6]) == pytest.approx(2 * minutes / 60, abs=0.01)
    assert float(logged["all"][4]) == pytest.approx(
        sum(sum(collect.cell_minutes(r.record.rows)) for r in runs) / 60, abs=0.02)
