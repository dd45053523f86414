"""Sweep files: cells, validation naming the key and the cell before anything runs, each trial's config and
resources, the per-step Tune reporter with its pointer checkpoint, and the shipped matrices."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from ray import tune

from jobs import sweep
from jobs.config.sweep_spec import (
    WHERE,
    SweepError,
    as_overrides,
    cell_label,
    cells,
    flatten,
    load_sweep,
    validate,
)
from jobs.plan.layout import run_layout
from jobs.plan.planner import make_plan
from jobs.sweep import POINTER, TrialSetup, TuneReporter, setup_of, trial_config, trial_resources
from learners.compute.memory import GIB

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "jobs/configs/sweeps/tiny_matrix.yaml"
PAPER = ROOT / "jobs/configs/sweeps/paper_matrix.yaml"


def _sweep_file(tmp_path: Path, body: str) -> str:
    path = tmp_path / "sweep.yaml"
    path.write_text(f"name: t\nbase: {ROOT}/jobs/configs/tiny.yaml\n{body}")
    return str(path)


def test_tiny_matrix_is_workflow_by_sharing():
    spec = load_sweep(str(TINY))
    assert validate(spec) == [{"marl.workflow": w, "marl.sharing": s}
                              for w in ("voting", "eval_opt") for s in ("shared", "isolated")]


def test_an_unknown_key_names_the_key_and_the_cell(tmp_path):
    spec = load_sweep(_sweep_file(tmp_path, "grid:\n  marl.workflow: [voting]\n  learner.optim.lrr: [0.1]\n"))
    with pytest.raises(SweepError, match=r"cell \[marl.workflow=voting, learner.optim.lrr=0.1\].*lrr"):
        validate(spec)


def test_a_bad_value_names_its_cell(tmp_path):
    spec = load_sweep(
        _sweep_file(tmp_path, "grid:\n  marl.sharing: [shared]\n  marl.workflow: [voting, chain]\n")
    )
    with pytest.raises(SweepError, match=r"cell \[marl.sharing=shared, marl.workflow=chain\].*marl.workflow"):
        validate(spec)


@pytest.mark.parametrize(("body", "message"), [
    ("search:\n  learner.optim.lr: {gaussian: [0, 1]}\n", "search.learner.optim.lr must be one of"),
    ("search:\n  learner.optim.lr: {loguniform: [-1, 1]}\n", "search.learner.optim.lr: loguniform"),
    ("search:\n  learner.optim.lr: {choice: [0.1, -1.0]}\n", r"search learner.optim.lr=-1.0\].*must be > 0"),
    ("grid:\n  seed: [0]\nsearch:\n  seed: {randint: [0, 9]}\n", "seed in both grid and search"),
    ("grid:\n  seed: []\n", "grid.seed has no values"),
    ("mode: maximise\n", "mode must be min or max"),
])
def test_bad_sweep_files_fail_before_anything_runs(tmp_path, body, message):
    with pytest.raises(SweepError, match=message):
        validate(load_sweep(_sweep_file(tmp_path, body)))


def test_sweep_file_keys_are_typed(tmp_path):
    with pytest.raises(SweepError, match="num_sample"):
        load_sweep(_sweep_file(tmp_path, "num_sample: 2\n"))
    with pytest.raises(SweepError, match="file not found"):
        load_sweep(str(tmp_path / "absent.yaml"))


def test_a_mapping_value_sets_several_keys_together():
    cell = {"task": {"data.task": "code", "data.train": "code_synthetic"}, "seed": 3, "flag": True}
    assert as_overrides(cell) == ["data.task=code", "data.train=code_synthetic", "seed=3", "flag=true"]


def test_a_trial_config_is_base_then_overrides_then_its_cell(tmp_path):
    spec = load_sweep(str(TINY), [f"storage_path={tmp_path}"])
    setup = setup_of(spec)
    cfg = trial_config(
        setup, {"grid": {"marl.sharing": "shared"}, "search": {"learner.optim.lr": 0.5}}, "t_1"
    )
    assert (cfg.steps, cfg.marl.sharing, cfg.learner.optim.lr, cfg.run_name) == (2, "shared", 0.5, "t_1")
    assert cfg.out_dir == str(tmp_path.resolve() / "tiny_matrix" / "runs")


def test_trial_resources_are_a_driver_bundle_then_every_engine_and_learner_rank():
    setup = TrialSetup("t", str(ROOT / "jobs/configs/tiny.yaml"), ("rollout.engines_per_role=2",
                       "rollout.engine_num_gpus=0.5", "learner.rank_resources={trainer: 1}"), "/tmp/x",
                       (("CPU", 1.0),))
    pgf = trial_resources(setup, {"grid": {"marl.workflow": "voting", "marl.sharing": "isolated"}})
    engine, learner = {"CPU": 0.5, "GPU": 0.5}, {"CPU": 0.5, "trainer": 1.0}
    # voting isolated: 2 roles x 2 engines, 2 policies x 1 rank
    assert pgf.bundles == [{"CPU": 1.0}, *[engine] * 4, *[learner] * 2]
    assert pgf.strategy == "PACK"
    in_process = trial_resources(setup, {"grid": {"rollout.engines_per_role": 0, "learner.ranks": 0}})
    assert in_process.bundles == [{"CPU": 1.0}]


def test_paper_matrix_fits_two_gpus_per_trial():
    spec = load_sweep(str(PAPER))
    all_cells = cells(spec)
    # GPUs depend on workflow x sharing only (roles and policies): one model and seed stand for the rest.
    setup, some = setup_of(spec), [c for c in all_cells if c["seed"] == 0 and c["model.path"].endswith("4B")]
    gpus = [sum(b.get("GPU", 0.0) for b in trial_resources(setup, {"grid": c}).bundles) for c in some]
    assert len(some) == 14 and 0 < min(gpus) and max(gpus) <= 2.0
    # The colocated layout (the paper's): every trial holds two whole GPUs, each one engine and one rank of
    # the learner group (multi-LoRA serving and colocated adapters: one of each whatever the workflow).
    assert (min(gpus), max(gpus)) == (2.0, 2.0)
    plans = [make_plan(run_layout(trial_config(setup, {"grid": c}, "p"))) for c in some]
    assert all(p.fits() and p.memory == 80 * GIB for p in plans)  # every 4B cell fits an 80 GB GPU
    cfg = trial_config(setup, {"grid": some[-1]}, "p")
    assert cfg.rollout.lora_serving == "multi" and cfg.model.chat_template_kwargs == {
        "enable_thinking": False
    }
    assert (
        cfg.model.lora.rank,
        cfg.model.lora.alpha,
        cfg.learner.optim.lr,
        cfg.learner.optim.warmup_steps,
        cfg.rollout.prompts_per_step,
        cfg.rollout.samples_per_prompt,
        cfg.steps,
        cfg.checkpoint.every,
    ) == (64, 32, 2e-5, 15, 64, 8, 500, 5)
    assert (cfg.data.task, cfg.marl.workflow, cfg.marl.sharing) == ("code", "orch_workers", "isolated")


# The paper's caps, prompt / response tokens per task and workflow.
PAPER_CAPS = {("math", "eval_opt"): (30720, 5120), ("math", "voting"): (20480, 5120),
              ("math", "orch_workers"): (20480, 5120), ("math", "single_agent"): (15360, 5120),
              **{("code", w): (10240, 2048) for w in ("eval_opt", "voting", "orch_workers")},
              ("code", "single_agent"): (4096, 2048)}


def test_paper_matrix_runs_the_single_agent_baseline_once_per_model_task_and_seed():
    all_cells = cells(load_sweep(str(PAPER)))
    assert len(all_cells) == 3 * 2 * 3 * 2 * 3 + 2 * 3 * 3 == 126
    single = [flatten(c) for c in all_cells if c["marl.workflow"] == "single_agent"]
    assert len(single) == 18 and {c["marl.sharing"] for c in single} == {"shared"}
    assert len({tuple(sorted(c.items())) for c in map(flatten, all_cells)}) == 126  # no cell twice


def test_paper_matrix_cells_get_their_task_and_workflow_caps_rounds_and_held_out_split():
    spec = load_sweep(str(PAPER))
    for cell in cells(spec):
        values = flatten(cell)
        task, workflow = values["data.task"], values["marl.workflow"]
        prompt, response = PAPER_CAPS[task, workflow]
        assert (values["rollout.max_prompt_tokens"], values["rollout.sampling.max_new_tokens"],
                values["algo.max_len"]) == (prompt, response, prompt + response), (task, workflow)
        assert values.get("marl.max_rounds") == {"eval_opt": 3 if task == "math" else 2}.get(workflow)
        split = "dapo_math_17k" if task == "math" else "deepcoder"
        assert (values["data.train"], values["data.eval"]) == (f"/data/paper/{split}_train.parquet",
                                                               f"/data/paper/{split}_test.parquet")
    code_eval_opt = next(c for c in cells(spec) if flatten(c)["data.task"] == "code"
                         and c["marl.workflow"] == "eval_opt")
    cfg = trial_config(setup_of(spec), {"grid": code_eval_opt}, "p")
    assert (cfg.marl.max_rounds, cfg.rollout.max_prompt_tokens, cfg.rollout.sampling.max_new_tokens,
            cfg.algo.max_len, cfg.data.eval, cfg.data.eval_size) == (
        2, 10240, 2048, 12288, "/data/paper/deepcoder_test.parquet", 500)


@pytest.mark.slow
def test_every_paper_matrix_cell_is_a_valid_config():
    assert len(validate(load_sweep(str(PAPER)))) == 126


RULES = """grid:
  marl.workflow: [single_agent, voting, eval_opt]
  marl.sharing: [shared, isolated]
  task:
    - {data.task: digit, data.train: digit}
    - {data.task: math, data.train: digit}
"""
EXCLUDE = """exclude:
  - {marl.workflow: single_agent, marl.sharing: isolated}
"""
WHERE_RULES = """where:
  - when: {data.task: math}
    set: {rollout.sampling.max_new_tokens: 16, algo.max_len: 64}
  - when: {data.task: math, marl.workflow: [voting, eval_opt]}
    set: {algo.max_len: 128}
  - when: {marl.workflow: eval_opt}
    set: {marl.max_rounds: 2}
"""


def test_exclude_drops_matching_cells_and_where_rules_apply_in_order(tmp_path):
    spec = load_sweep(_sweep_file(tmp_path, RULES + EXCLUDE + WHERE_RULES))
    all_cells = validate(spec)
    assert len(all_cells) == (1 + 2 + 2) * 2
    sets = {(c["marl.workflow"], c["marl.sharing"], c["task"]["data.task"]): c.get(WHERE) for c in all_cells}
    assert sets == {
        ("single_agent", "shared", "digit"): None,
        ("single_agent", "shared", "math"): {"rollout.sampling.max_new_tokens": 16, "algo.max_len": 64},
        **{("voting", s, "digit"): None for s in ("shared", "isolated")},
        **{("voting", s, "math"): {"rollout.sampling.max_new_tokens": 16, "algo.max_len": 128}
           for s in ("shared", "isolated")},
        **{("eval_opt", s, "digit"): {"marl.max_rounds": 2} for s in ("shared", "isolated")},
        **{("eval_opt", s, "math"): {"rollout.sampling.max_new_tokens": 16, "algo.max_len": 128,
                                     "marl.max_rounds": 2} for s in ("shared", "isolated")},
    }
    cell = next(c for c in all_cells if c["marl.workflow"] == "eval_opt" and c["task"]["data.task"] == "math")
    cfg = trial_config(setup_of(spec), {"grid": cell}, "t")
    assert (cfg.algo.max_len, cfg.rollout.sampling.max_new_tokens, cfg.marl.max_rounds) == (128, 16, 2)
    # The label is the grid's values; what the rules set follows from them.
    assert cell_label(cell) == "marl.workflow=eval_opt, marl.sharing=shared, data.task=math, data.train=digit"


def test_tune_runs_exactly_the_kept_cells(tmp_path):
    from ray.tune.search.variant_generator import generate_variants

    spec = load_sweep(_sweep_file(tmp_path, RULES + EXCLUDE + WHERE_RULES), [f"storage_path={tmp_path}"])
    param_space = sweep.make_tuner(spec, str(tmp_path / "t"), resume=False)._local_tuner._param_space
    assert [v["grid"] for _, v in generate_variants(param_space)] == cells(spec)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "exclude:\n  - {marl.workflw: voting}\n",
            r"exclude\[0\].marl.workflw is not a key the grid sets; grid keys: marl.workflow, marl.sharing, "
            r"data.task, "
            r"data.train",
        ),
        ("exclude:\n  - {marl.workflow: votin}\n", r"exclude\[0\] .*matches no cell"),
        ("exclude:\n  - {}\n", r"exclude\[0\] names no key"),
        ("exclude:\n  - {marl.workflow: [single_agent, voting, eval_opt]}\n", "exclude removes every cell"),
        (
            EXCLUDE + "where:\n  - when: {data.tsk: math}\n    set: {algo.max_len: 64}\n",
            r"where\[0\].when.data.tsk is not a key the grid sets",
        ),
        (
            EXCLUDE + "where:\n  - when: {data.task: [code]}\n    set: {algo.max_len: 64}\n",
            r"where\[0\].when .*matches no cell",
        ),
        (
            EXCLUDE
            + "where:\n  - when: {marl.sharing: isolated, marl.workflow: single_agent}\n    set: {seed: 1}\n",
            r"where\[0\].when .*matches only excluded cells",
        ),
        (
            EXCLUDE + "where:\n  - when: {data.task: math}\n    set: {marl.sharing: shared}\n",
            r"where\[0\].set.marl.sharing is a grid or search key",
        ),
        (
            EXCLUDE + "where:\n  - when: {data.task: math}\n    set: {algo.max_lenn: 64}\n",
            r"cell \[.*data.task=math.*algo.max_lenn",
        ),
        (
            EXCLUDE + "where:\n  - when: {data.task: math}\n    sett: {algo.max_len: 64}\n",
            r"where\[0\].*sett",
        ),
    ],
)
def test_a_bad_exclude_or_where_rule_names_itself(tmp_path, body, message):
    with pytest.raises(SweepError, match=message):
        validate(load_sweep(_sweep_file(tmp_path, RULES + body)))


def test_where_is_no_grid_axis(tmp_path):
    with pytest.raises(SweepError, match="grid.where is reserved"):
        validate(load_sweep(_sweep_file(tmp_path, "grid:\n  where: [1]\n")))


def test_reporter_sends_metrics_and_a_pointer_checkpoint(monkeypatch, tmp_path):
    sent = []

    def report(metrics, checkpoint=None):  # what tune.report would persist: the pointer file, read back
        pointer = json.loads((Path(checkpoint.path) / POINTER).read_text()) if checkpoint else None
        sent.append((metrics, pointer))

    monkeypatch.setattr(tune, "report", report)
    reporter = TuneReporter(tmp_path / "run")
    reporter.on_step(0, {"reward/mean": 0.25}, None)
    reporter.on_step(4, {"reward/mean": 0.5}, tmp_path / "run" / "checkpoints" / "step_000005")
    assert sent[0] == ({"reward/mean": 0.25, "step": 0}, None)
    assert sent[1] == ({"reward/mean": 0.5, "step": 4}, {
        "checkpoint": str(tmp_path / "run" / "checkpoints" / "step_000005"), "run_dir": str(tmp_path / "run"),
        "step": 4})


def test_cli_dry_run_and_exit_codes(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "jobs.sweep", *args], cwd=ROOT, capture_output=True,
                              text=True, timeout=120)

    out = run("--config", str(TINY), "--dry-run")
    assert out.returncode == 0 and "4 cells x 1 samples" in out.stdout
    assert out.stdout.count("plan: no GPU memory declared") == 4  # every cell's plan, on CPU not checked
    assert "[marl.workflow=voting, marl.sharing=isolated] bundles [{'CPU': 0.5}, {'CPU': 0.25}" in out.stdout
    bad = run("--config", _sweep_file(tmp_path, "grid:\n  marl.workflow: [voting, chain]\n"), "--dry-run")
    assert bad.returncode == 2 and "marl.workflow=chain" in bad.stderr
    none = run("--config", str(TINY), f"storage_path={tmp_path}", "--resume", "ray.num_cpus=1")
    assert none.returncode == 2 and "has no sweep to resume" in none.stderr


def test_cells_of_a_sweep_without_grid_is_one_empty_cell(tmp_path):
    assert cells(load_sweep(_sweep_file(tmp_path, ""))) == [{}]
    assert json.loads(json.dumps(sweep.POINTER)) == "pointer.json"


def test_a_trial_resumed_after_its_last_step_reports_its_last_logged_step(tmp_path):
    """A trial whose run had committed its last step before the sweep was interrupted trains nothing when
    resumed; its final result still needs the sweep's metric, taken from the run's last logged step."""
    from jobs.sweep import last_step_metrics

    rows = [{"step": 0, "reward/mean": 0.25, "eval/accuracy_before": 0.1}, {"step": 1, "reward/mean": 0.5,
            "note": "text"}, {"step": 2, "eval/accuracy": 0.4}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert last_step_metrics(tmp_path) == {"step": 1.0, "reward/mean": 0.5}
    assert last_step_metrics(tmp_path / "absent") == {}


def test_a_cell_whose_plan_does_not_fit_is_refused_before_anything_runs(tmp_path, capsys):
    """The plan check is the sweep's (loading a config plans nothing): it names the cell and the plan."""
    gpu = ["model.path=builtin:qwen3-0.6b-shape?vocab=151936", "marl.workflow=single_agent",
           "marl.sharing=shared", "learner.backend=deepspeed", "learner.rank_num_gpus=0.5",
           "rollout.engine_num_gpus=0.5", "rollout.engines_per_role=1", "learner.ranks=1",
           "learner.micro_batch_size=4", "algo.max_len=2048", "rollout.vllm.gpu_memory_utilization=0.3"]
    listed = "".join(f"  - {o}\n" for o in gpu)
    path = _sweep_file(tmp_path, f"overrides:\n{listed}grid:\n  ray.gpu_memory_gb: [80, 16]\n")
    validate(load_sweep(path))  # every cell is a valid config
    assert sweep.main(["--config", path, "--dry-run"]) == 2
    assert "cell [ray.gpu_memory_gb=16]: config: the plan does not fit 16 GiB GPUs" in capsys.readouterr().err
