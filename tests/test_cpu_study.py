"""The CPU study (studies/cpu_smollm2): its README's tables are exactly what its committed runs give, its
report regenerates from them, the table functions compute what they say on runs built by hand, and its sweep
keeps the settings the README declares."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from jobs.config import load_config, to_yaml
from jobs.config.sweep_spec import as_overrides, cells, load_sweep
from jobs.report import load_run
from jobs.telemetry.tracking import RunLog
from studies.cpu_smollm2 import collect

SWEEP = "jobs/configs/sweeps/cpu_study.yaml"


def test_the_readme_tables_are_those_of_the_committed_runs():
    text = collect.README.read_text()
    in_readme = collect.readme_tables(text)
    assert set(in_readme) == set(collect.TABLES), "every measured table has its place in the README, once"
    assert in_readme == collect.tables(collect.committed_runs()), \
        "stale README tables: run `python -m studies.cpu_smollm2.collect`"


def test_every_committed_run_is_whole_and_small():
    runs = collect.committed_runs()
    assert runs, "the study has committed runs"
    total = 0
    for run in runs:
        assert run.path.name == collect.cell_name(run)
        files = {p.name for p in run.path.iterdir()}
        assert files == {"metrics.jsonl", "config.yaml", "eval_curve.csv"}, files
        total += sum(p.stat().st_size for p in run.path.iterdir())
        cfg = load_config(str(run.path / "config.yaml"))
        assert (cfg.steps, cfg.data.eval_size, cfg.eval_every, cfg.rollout.eval_temperature) == (
            40,
            128,
            5,
            0.7,
        )
    assert total < 20 * 2**20


def test_the_report_regenerates_from_the_committed_runs(tmp_path):
    index = collect.report([collect.RUNS], tmp_path)
    page = index.read_text()
    for run in collect.committed_runs():
        assert run.label in page
    assert len(list(tmp_path.glob("*.png"))) == len(collect.committed_runs()) + 1


def test_the_committed_report_holds_only_the_figures_its_page_shows():
    page = (collect.REPORT / "index.html").read_text()
    shown = set(re.findall(r"[\w.-]+\.png", page))
    assert {p.name for p in collect.REPORT.glob("*.png")} == shown


def test_the_sweep_fixes_the_declared_settings():
    spec = load_sweep(SWEEP)
    grid = cells(spec)
    assert [(c["marl.workflow"], c["marl.sharing"]) for c in grid] == [
        ("voting", "shared"), ("voting", "isolated"), ("eval_opt", "shared"), ("eval_opt", "isolated"),
        # priority order
        ("single_agent", "shared"), ("orch_workers", "shared"), ("orch_workers", "isolated")]
    for cell in grid:
        cfg = load_config(spec.base, [*spec.overrides, *as_overrides(cell)])
        assert (cfg.steps, cfg.eval_every, cfg.data.eval_size, cfg.rollout.eval_temperature) == (
            40,
            5,
            128,
            0.7,
        )
        # The paper's mini-batch semantics: one step's samples per optimizer step, in every cell.
        assert cfg.algo.ppo_mini_batch_size == cfg.rollout.prompts_per_step * cfg.rollout.samples_per_prompt
        assert cfg.learner.optim.lr == 1e-3 and cfg.seed == 0 and cfg.model.lora.enabled


def _run(folder: Path, workflow: str, sharing: str, accuracies: list[float], norms: dict[str, float],
         norms_at: dict[int, dict[str, float]] | None = None) -> Path:
    """A run dir: config.yaml and metrics.jsonl with one eval after every step, and constant role norms but
    for the steps in `norms_at`."""
    run = folder / f"{workflow}-{sharing}"
    run.mkdir(parents=True)
    cfg = load_config("jobs/configs/tiny.yaml",
                      [f"marl.workflow={workflow}", f"marl.sharing={sharing}", f"steps={len(accuracies) - 1}",
                       "cliff.drop=0.2", "cliff.window=2", "cliff.relative_drop=0.5"])
    (run / "config.yaml").write_text(to_yaml(cfg))
    log = RunLog(run, tensorboard=False)
    for step in range(len(accuracies) - 1):
        row = {"time/step_s": 2.0, "time/rollout_s": 1.0, "time/update_s": 0.5, "time/sync_s": 0.1,
               "time/eval_s": 3.0, "eval/accuracy": accuracies[step + 1],
               **{f"grad/role_norm/{r}": n for r, n in {**norms, **(norms_at or {}).get(step, {})}.items()},
               **{f"grad/step_mass_share/{r}": 1 / len(norms) for r in norms},
               **{f"optim/steps/{r}": 3.0 if r == "generator" else 1.0 for r in norms}}
        if step == 0:
            row.update({"eval/accuracy_before": accuracies[0], "time/eval_before_s": 3.0})
        log.log(step, row)
    log.close()
    return run


def test_the_tables_by_hand(tmp_path):
    _run(tmp_path, "single_agent", "shared", [0.2, 0.3, 0.4, 0.4], {"solver": 1.0})
    # Peaks at 0.6 after 2 steps, then falls to 0.3 and 0.25: 0.3 below the peak (absolute, 0.2) and at most
    # half of it (relative, 0.5) for two evaluations in a row.
    _run(tmp_path, "voting", "isolated", [0.2, 0.5, 0.6, 0.3, 0.25], {"generator": 0.5, "aggregator": 3.0})
    # Falls from 0.5 to 0.2 and 0.25 (flagged), then climbs back past it: recovered.
    _run(tmp_path, "eval_opt", "shared", [0.1, 0.5, 0.2, 0.25, 0.55], {"generator": 1.0, "evaluator": 1.0})
    runs = collect.committed_runs(tmp_path)
    assert [collect.cell_name(r) for r in runs] == [
        "single_agent-shared",
        "voting-isolated",
        "eval_opt-shared",
    ]
    results = collect.results_table(runs).splitlines()
    assert results[2] == "| single_agent | – | 3 | 0.200 | 0.400 @ 2 | 0.400 @ 3 | +0.000 | +0.000 | no |"
    assert results[3] == ("| voting | isolated | 4 | 0.200 | 0.600 @ 2 | 0.250 @ 4 | +0.200 | -0.150 | "
                          "absolute/relative |")
    assert results[4] == ("| eval_opt | shared | 4 | 0.100 | 0.550 @ 4 | 0.550 @ 4 | +0.150 | +0.150 | "
                          "absolute/relative, recovered |")
    assert collect.grad_ratio_table(runs).splitlines()[2] == \
        "| voting-isolated | aggregator / generator | 4 | 6.00 | 6.00 | 6.00 | 6.00 |"
    steps = collect.optimizer_steps_table(runs).splitlines()
    assert "| voting-isolated | generator | 3.00 | 3–3 |" in steps
    wall = collect.wall_table(runs).splitlines()
    # voting: 4 steps x 2 s + 4 mid-run evals x 3 s + the base eval's 3 s = 23 s
    assert wall[3].startswith("| voting-isolated | 0.4 | 0.1 | 0.2 | 2.0 | 1.0 | 0.5 | 0.1 |")
    text = "x\n<!-- table:results -->\nold\n<!-- /table -->\ny\n"
    assert collect.readme_tables(collect.rewrite_readme(text, {"results": "new\n"})) == {"results": "new\n"}


def test_a_ratio_to_a_vanished_norm_is_left_out_and_the_steps_counted(tmp_path):
    # Step 1: the worker's policy saturated (norm 1e-9, a ratio of 5e8); step 2: no gradient at all.
    _run(tmp_path, "orch_workers", "isolated", [0.2, 0.3, 0.3, 0.3, 0.3],
         {"orchestrator": 1.0, "worker": 0.5, "synthesizer": 0.25},
         norms_at={1: {"worker": 1e-9}, 2: {"orchestrator": 0.0, "worker": 0.0, "synthesizer": 0.0}})
    rows = collect.grad_ratio_table(collect.committed_runs(tmp_path)).splitlines()[2:]
    assert rows == ["| orch_workers-isolated | orchestrator / worker | 2 | 2.00 | 2.00 | 2.00 | 2.00 |",
                    "| orch_workers-isolated | synthesizer / worker | 2 | 0.50 | 0.50 | 0.50 | 0.50 |"]


def test_copy_runs_keeps_metrics_config_and_the_curve(tmp_path):
    sweep = tmp_path / "sweep" / "runs"
    _run(sweep, "voting", "shared", [0.2, 0.3], {"generator": 1.0, "aggregator": 2.0})
    (sweep / "voting-shared" / "rollouts").mkdir()  # not copied
    assert collect.copy_runs(tmp_path / "sweep", tmp_path / "study") == ["voting-shared"]
    dest = tmp_path / "study" / "voting-shared"
    assert {p.name for p in dest.iterdir()} == {"metrics.jsonl", "config.yaml", "eval_curve.csv"}
    assert (dest / "eval_curve.csv").read_text().splitlines() == ["steps_done,accuracy", "0,0.2", "1,0.3"]
    assert load_run(dest).rows == load_run(sweep / "voting-shared").rows
    assert json.loads((dest / "metrics.jsonl").read_text().splitlines()[0])["step"] == 0


@pytest.mark.parametrize("name", sorted(collect.TABLES))
def test_each_table_renders_without_runs(name):
    assert collect.TABLES[name]([]).startswith("| ")
