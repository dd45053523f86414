"""studies/cpu_guard_gate/table.py on study 3's committed gate runs (unguarded): the decisions graded again
from the turns where the runs recorded none, against counts read off the committed turns by hand here."""

import json
import shutil

import pyarrow.parquet as pq
from omegaconf import OmegaConf

from marl.workflows.common import parse_verdict
from studies.cpu_guard_gate import table

GATE = table.UNGUARDED


def test_the_evaluator_verdicts_are_paired_with_the_same_rounds_generator():
    run = GATE / "eval_opt-evaluator-64"
    pairs = table.verdict_pairs(run)
    first = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert len(pairs) == int(first["eval/before/turns/evaluator"]) == 123
    turns = [t for t in pq.read_table(run / "eval_turns.parquet").to_pylist()
             if t["step"] == 0 and t["role"] == "evaluator"]
    # every turn the workflow could not parse reads as Incorrect, as eval_opt reads it
    assert sum(not v for v, _ in pairs) == sum(parse_verdict(t["response"]) is not True for t in turns)
    m = table.regraded(run, "evaluator")
    assert m["verdict/majority/evaluator"] >= 0.5
    assert 0.0 <= m["verdict/accuracy/evaluator"] <= 1.0


def test_a_run_without_recorded_baselines_is_graded_again():
    row = table.row(GATE / "voting-aggregator-64")
    assert row is not None and row[2] == "unguarded"
    assert "random" in row[5] and "–" not in row[5].split("(")[1]


def test_each_guarded_run_is_shown_beside_study_3s_run_of_its_role_at_its_cap_or_the_largest(tmp_path):
    guarded = tmp_path / "orch"
    shutil.copytree(GATE / "orch_workers-orchestrator-32", guarded)
    cfg = OmegaConf.load(guarded / "config.yaml")
    cfg.rollout.role_max_new_tokens.orchestrator = 232
    cfg.marl.guards = {"orchestrator": "builtin"}
    OmegaConf.save(cfg, guarded / "config.yaml")
    runs = table.unguarded_runs([GATE / "voting-aggregator-64", guarded])
    assert [p.name for p in runs] == ["voting-aggregator-64", "orch_workers-orchestrator-64"]
    assert table.row(guarded)[2:4] == ["guarded", "232"]


def test_the_verdict_split_adds_up_to_the_verdicts_accuracy():
    run = GATE / "eval_opt-evaluator-64"
    pairs = table.verdict_pairs(run)
    on_right, right, on_wrong, wrong = table.verdict_split(pairs)
    assert right + wrong == len(pairs) == 123 and right == sum(g for _, g in pairs)
    accuracy = (on_right + wrong - on_wrong) / len(pairs)
    assert accuracy == table.regraded(run, "evaluator")["verdict/accuracy/evaluator"]
    shown = f"Correct on {on_right} / {right} right answers, {on_wrong} / {wrong} wrong ones"
    assert shown in table.row(run)[5]


def test_the_guarded_gates_recorded_decisions_are_those_of_its_committed_turns():
    """The trainer's eval/before/* decision metrics of each committed guarded run, against the same graded
    again from its turns by the study code: two independent paths to one number."""
    for name, role in (("eval_opt-evaluator-64", "evaluator"), ("voting-aggregator-64", "aggregator"),
                       ("orch_workers-orchestrator-232", "orchestrator")):
        run = table.HERE / "runs" / name
        first = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
        for key, value in table.regraded(run, role).items():
            assert abs(first[table.B + key] - value) < 1e-12, (name, key)


def test_the_readme_shows_the_table_of_the_committed_runs():
    readme = (table.HERE / "README.md").read_text()
    shown = readme.split("<!-- table:guarded-gate -->\n")[1].split("<!-- /table:guarded-gate -->")[0]
    runs = [table.HERE / "runs"]
    assert shown == table.table([*runs, *table.unguarded_runs(runs)])
