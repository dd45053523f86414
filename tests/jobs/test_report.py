"""`python -m jobs.report`: run dirs found in sweep trees, valid PNGs, an index that references them, cliffs
flagged, missing metrics noted instead of crashing; and once from a real tiny training run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from PIL import Image

from jobs.config import load_config, to_yaml
from jobs.report import eval_curve, find_runs, load_run, main
from jobs.telemetry.tracking import RunLog
from tests.cluster.test_ray_metrics import real_step_metrics

TINY = "jobs/configs/tiny.yaml"


def _write_run(folder: Path, name: str, sharing: str, accuracies: list[float], drop_grads: bool = False,
               workflow: str = "voting") -> Path:
    """A run dir as the driver leaves it: config.yaml and metrics.jsonl (rows built by the real metric
    functions), with a mid-run eval per step and the final eval row at step == steps."""
    run = folder / name
    run.mkdir(parents=True)
    cfg = load_config(TINY, [f"run_name={name}", f"marl.sharing={sharing}", f"steps={len(accuracies)}",
                             "cliff.drop=0.2", "cliff.window=2", f"marl.workflow={workflow}"])
    (run / "config.yaml").write_text(to_yaml(cfg))
    log, last = RunLog(run, tensorboard=False), len(accuracies) - 1
    for step in range(len(accuracies)):
        # no mid-run eval last
        m = real_step_metrics(step, sharing, accuracies[step] if step < last else None)
        m[f"update/policy_move/{'shared' if sharing == 'shared' else 'generator'}"] = 0.01 * (step + 1)
        log.log(step, {k: v for k, v in m.items() if not (drop_grads and k.startswith(("grad/", "update/")))})
    log.log(len(accuracies), {"eval/accuracy": accuracies[-1]})
    log.close()
    return run


def _check_outputs(out: Path, n_runs: int) -> str:
    pngs = sorted(out.glob("*.png"))
    assert len(pngs) == n_runs + 1
    for png in pngs:
        with Image.open(png) as img:
            img.verify()  # a complete, well-formed PNG
        with Image.open(png) as img:
            assert img.format == "PNG" and img.size[0] > 300 and img.size[1] > 200
    page = (out / "index.html").read_text()
    assert set(re.findall(r"src='([^']+)'", page)) == {p.name for p in pngs}
    return page


def test_sweep_tree_renders_every_run_with_cliffs_and_notes(tmp_path):
    sweep = tmp_path / "sweep"
    _write_run(sweep / "trial_0" / "runs", "iso", "isolated", [0.5, 0.7, 0.45, 0.4, 0.4])
    _write_run(sweep / "trial_1" / "runs", "sha", "shared", [0.5, 0.55, 0.6, 0.65, 0.7])
    _write_run(sweep / "trial_2" / "runs", "nograd", "shared", [0.5, 0.5, 0.5], drop_grads=True)
    _write_run(sweep / "trial_4" / "runs", "rec", "shared", [0.5, 0.7, 0.45, 0.4, 0.75])
    (sweep / "trial_3").mkdir()  # a failed trial with nothing in it
    assert main([str(sweep), "--out", str(tmp_path / "out")]) == 0
    page = _check_outputs(tmp_path / "out", 4)
    for label in ("iso · voting · isolated", "sha · voting · shared", "nograd · voting · shared"):
        assert label in page
    # iso: peak 0.7 after 2 steps, then 0.45 and 0.4 (>= 0.2 below) for two evaluations → flagged at step 4.
    assert "iso · voting · isolated: terminal cliff flagged at step 4 (running peak 0.700" in page
    assert "final 0.400" in page
    # The same fall, then back above the peak it fell from: flagged, and noted as recovered, not terminal.
    assert "rec · voting · shared: cliff flagged at step 4 (running peak 0.700" in page
    assert "recovered: final 0.750" in page and "rec · voting · shared: terminal" not in page
    assert "sha · voting · shared: terminal cliff" not in page
    assert "nograd · voting · shared: no grad/role_norm/&lt;role&gt; metrics recorded" in page
    assert "nograd · voting · shared: no grad/mass_share/&lt;role&gt; metrics recorded" in page
    # The policy-movement panel: drawn for every run that logged it, noted for the one that did not.
    assert page.count("no update/policy_move/&lt;role&gt; metrics recorded") == 1
    assert "nograd · voting · shared: no update/policy_move/&lt;role&gt; metrics recorded" in page


def test_the_single_agent_baseline_is_labelled_without_a_sharing_mode(tmp_path):
    # One role: shared and isolated are the same run, which the sweep runs once (as shared).
    base = _write_run(tmp_path / "runs", "base", "shared", [0.3, 0.4], workflow="single_agent")
    voting = _write_run(tmp_path / "runs", "vote", "shared", [0.3, 0.4])
    assert (load_run(base).label, load_run(base).line_style) == ("base · single_agent", "-.")
    assert (load_run(voting).label, load_run(voting).line_style) == ("vote · voting · shared", "-")
    assert main([str(tmp_path / "runs"), "--out", str(tmp_path / "out")]) == 0
    page = _check_outputs(tmp_path / "out", 2)
    assert "base · single_agent<" in page and "single_agent · shared" not in page


def test_figures_keep_their_run_names_and_runs_named_alike_stay_apart(tmp_path):
    a = _write_run(tmp_path / "sweep_a" / "runs", "trial", "shared", [0.3, 0.4])
    assert main([str(a), "--out", str(tmp_path / "one")]) == 0
    first = (tmp_path / "one" / "run_trial.png").read_bytes()
    # A second run joins, named like the first (another sweep's trial): both figures are drawn, and the page
    # shows each under its own run.
    _write_run(tmp_path / "sweep_b" / "runs", "trial", "isolated", [0.3, 0.2])
    assert main([str(tmp_path / "sweep_a"), str(tmp_path / "sweep_b"), "--out", str(tmp_path / "two")]) == 0
    page = _check_outputs(tmp_path / "two", 2)
    assert "run_trial_00.png" in page and "run_trial_01.png" in page
    # Re-rendering an unchanged run writes the same file, so a committed report changes only where a run did.
    assert main([str(a), "--out", str(tmp_path / "one")]) == 0
    assert (tmp_path / "one" / "run_trial.png").read_bytes() == first


def test_eval_curve_counts_optimizer_steps_done():
    rows = [{"step": 0, "time/step_s": 1.0, "eval/accuracy": 0.2}, {"step": 1, "time/step_s": 1.0},
            {"step": 2, "time/step_s": 1.0, "eval/accuracy": float("nan")}, {"step": 5, "eval/accuracy": 0.4}]
    # The final row is logged at `steps` even when the run stopped early: it follows the last step run.
    assert eval_curve(rows) == ([1, 3], [0.2, 0.4])
    # The base model's accuracy travels in step 0's row and is the curve's first point, at 0 steps.
    rows[0]["eval/accuracy_before"] = 0.1
    assert eval_curve(rows) == ([0, 1, 3], [0.1, 0.2, 0.4])


def test_a_relogged_step_replaces_the_older_row(tmp_path):
    run = _write_run(tmp_path, "r", "isolated", [0.5, 0.6])
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 0, "reward/mean": 0.99}\n')
    rows = load_run(run).rows
    assert [r["step"] for r in rows] == [0, 1, 2] and rows[0]["reward/mean"] == 0.99


def test_run_dirs_are_found_once_and_missing_ones_are_an_error(tmp_path, capsys):
    run = _write_run(tmp_path / "a", "r", "isolated", [0.5, 0.6])
    assert find_runs([run, tmp_path]) == [run.resolve()]
    assert main([str(tmp_path / "empty"), "--out", str(tmp_path / "out")]) == 2
    assert "no run dirs" in capsys.readouterr().err


def test_a_run_without_config_or_evals_still_renders(tmp_path):
    run = tmp_path / "bare"
    log = RunLog(run, tensorboard=False)
    run.mkdir()
    log.log(0, {"reward/mean": 0.1, "time/step_s": 1.0})
    log.close()
    assert main([str(run), "--out", str(tmp_path / "out")]) == 0
    page = _check_outputs(tmp_path / "out", 1)
    assert (
        "no config.yaml" in page
        and "no eval/accuracy recorded" in page
        and "no reward/mean/&lt;role&gt;" in page
    )


@pytest.mark.slow
def test_report_of_real_tiny_runs(ray_cluster, tmp_path):
    from jobs.train import train

    for sharing in ("isolated", "shared"):
        cfg = load_config(
            TINY,
            [
                f"out_dir={tmp_path / 'runs'}",
                f"run_name=tiny_{sharing}",
                f"marl.sharing={sharing}",
                "steps=3",
                "eval_every=1",
                "data.eval_size=4",
                "rollout.prompts_per_step=2",
                "rollout.samples_per_prompt=2",
                "rollout.engines_per_role=0",
                "learner.ranks=0",
                "ray.num_cpus=2",
            ],
        )
        train(cfg)
    assert main([str(tmp_path / "runs"), "--out", str(tmp_path / "out")]) == 0
    page = _check_outputs(tmp_path / "out", 2)
    assert "tiny_isolated · voting · isolated" in page and "tiny_shared · voting · shared" in page
    for sharing in ("isolated", "shared"):
        xs, ys = eval_curve(load_run(tmp_path / "runs" / f"tiny_{sharing}").rows)
        # the base model at 0 steps, then each eval
        assert xs == [0, 1, 2, 3] and all(0.0 <= y <= 1.0 for y in ys)
