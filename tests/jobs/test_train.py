"""The whole cycle on the tiny model: every workflow × sharing through Ray actors, learning, isolation,
bad input."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import ray
import torch

from cluster.group import GroupTimeout
from jobs.config import load_config
from jobs.driver.assets import InputError
from jobs.driver.eval_records import read_eval
from jobs.driver.handles import build_handles
from jobs.driver.provenance import code_version
from jobs.driver.step import RolloutSource, train_step
from jobs.models.resolve import resolve_model
from jobs.plan.layout import run_layout
from jobs.telemetry.tracking import read_metrics
from jobs.train import train
from learners.member import LearnerMember
from marl.policy_map import PolicyMap
from marl.tasks import get_family
from marl.tasks.sampler import PromptSampler
from marl.workflows import roles_of
from rollout.storage import read_episodes
from tests.learning import (
    assert_accuracy_is_a_count,
    assert_learned,
    assert_rewards_match_episodes,
    assert_updates_follow_advantages,
    write_seven_tasks,
)

TINY = "jobs/configs/tiny.yaml"
WORKFLOWS = ["single_agent", "eval_opt", "voting", "orch_workers"]


def _cfg(tmp_path: Path, *overrides: str):
    return load_config(TINY, [f"out_dir={tmp_path}", *overrides])


# Through Ray actors, the layouts that differ: voting shared (one engine and one learner group for two roles)
# and isolated (a group each) in the fast tier, isolated eval_opt and orch_workers (the most actors, one
# learner per role) in the slow one. The other cells check their workflow's whole cycle in-process: what a
# workflow adds (its roles, turns and rewards) does not depend on where its members run, and a layout that
# does is one of the actor cells' (shared or isolated, one role or several).
def _cell(workflow: str, sharing: str):
    if sharing == "isolated" and workflow in ("eval_opt", "orch_workers"):
        return pytest.param(workflow, sharing, 1, marks=pytest.mark.slow)
    return workflow, sharing, int(workflow == "voting")


@pytest.mark.parametrize(("workflow", "sharing", "actors"), [
    _cell(w, s) for w in WORKFLOWS for s in ("shared", "isolated")])
def test_two_steps_of_every_workflow_and_sharing(ray_cluster, tmp_path, workflow, sharing, actors):
    roles = roles_of(workflow)
    # Turn rewards by the first token's parity: a random model's rows then carry
    # advantages from the first step.
    parity = [f"marl.reward_shaping.{role}=tests.learning.first_token_parity" for role in roles]
    cfg = _cfg(tmp_path, f"marl.workflow={workflow}", f"marl.sharing={sharing}",
               f"rollout.engines_per_role={actors}", f"learner.ranks={actors}", "rollout.prompts_per_step=2",
               "rollout.samples_per_prompt=2", "data.eval_size=2", *parity)
    summary = train(cfg)
    run = tmp_path / "tiny"
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [0, 1, 2]
    policy_map = PolicyMap.build(sharing, roles)
    for role in roles:
        assert f"reward/mean/{role}" in rows[0] and f"rollout/parse_failures/{role}" in rows[0]
        assert rows[0][f"batch/dropped_truncated/{role}"] == 0 and f"batch/truncated/{role}" in rows[0]
    assert_updates_follow_advantages(run, rows, policy_map, resolve_model(cfg.model.path))
    # the check above had a push
    assert any(r.get(f"grad/mass/{role}", 0) > 0 for r in rows for role in roles)
    for r in rows[:2]:
        assert_rewards_match_episodes(run, r)
    # Engines serve the version synced after step 0 when step 1 rolls out.
    versions = set(pq.read_table(run / "rollouts" / "step_000001.parquet")["version"].to_pylist())
    assert versions == {1}
    assert_accuracy_is_a_count(summary, rows, cfg.data.eval_size)
    evals = read_eval(run)  # per-task results of the base and the final evaluation
    assert sorted(evals) == [0, 2] and [len(v) for v in evals.values()] == [2, 2]
    assert sum(evals[2].values()) / 2 == summary["eval/accuracy_after"]
    for steps_done, per_task in evals.items():  # every evaluation's turns, beside its per-task rewards
        turns = read_episodes(run / "eval_rollouts" / f"eval_{steps_done:06d}.parquet")
        assert {e.task.task_id: e.reward for e in turns} == per_task and all(e.turns for e in turns)
    assert rows[0]["code/commit"] == code_version()["code/commit"] and "code/commit" not in rows[1]
    assert (run / "config.yaml").read_text().startswith("# code/commit: ")
    # The config keeps gradient checkpointing's `auto` as null; the run records what its layout resolved.
    resolved = run_layout(cfg).checkpointing
    header = (run / "config.yaml").read_text()
    for pid in policy_map.policies:
        assert rows[0][f"layout/gradient_checkpointing/{pid}"] is resolved[pid]
        assert f"# layout/gradient_checkpointing/{pid}: {str(resolved[pid]).lower()}\n" in header
    assert all(f"update/policy_move/{pid}" in rows[1] for pid in policy_map.policies)
    assert rows[0]["eval/before/episodes"] == 2.0 and rows[2]["eval/episodes"] == 2.0
    assert _run_actors_gone("tiny:"), "run actors outlive the run"


def _run_actors_gone(prefix: str, deadline_s: float = 10.0) -> bool:
    # ray.kill is asynchronous: poll the named-actor registry until the run's actors are gone.
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if not any(n.startswith(prefix) for n in ray.util.list_named_actors()):
            return True
        time.sleep(0.1)
    return False


# The fast tier learns through the HF engine in-process; the slow tier through Ray actors on vLLM. (vLLM
# in-process with a shared policy is not run here: its engine is the actors' engine, and the shared policy map
# is the HF run's. The HF engine through actors is not run either: its learning is the in-process cell's, and
# the actor layout's, with isolated policies, the vLLM cell's; the HF engine as an actor is in every actor
# cell of test_two_steps_of_every_workflow_and_sharing.)
@pytest.mark.parametrize(("sharing", "actors", "backend"), [
    ("shared", 0, "hf"), pytest.param("isolated", 1, "vllm", marks=[pytest.mark.vllm, pytest.mark.slow])])
def test_reward_is_learned_through_the_whole_cycle(ray_cluster, tmp_path, sharing, actors, backend):
    """Fails if the gradient sign, the loss mask or the weight sync to the engines is wrong.

    Shared runs its groups in-process and isolated through Ray actors, so both placements are covered;
    every sync is verified by fingerprint on every engine."""
    data = write_seven_tasks(tmp_path)
    cfg = _cfg(tmp_path, "marl.workflow=voting", f"marl.sharing={sharing}", "steps=40", f"data.train={data}",
               f"rollout.engines_per_role={actors}", f"learner.ranks={actors}", f"rollout.backend={backend}",
               "rollout.vllm.kv_cache_gb=0.25", f"data.eval={data}", "data.eval_size=8",
               "learner.optim.lr=1e-2",
               "rollout.prompts_per_step=4", "rollout.samples_per_prompt=8", "ray.num_cpus=2")
    summary = train(cfg)
    rows = read_metrics(tmp_path / "tiny")
    assert_learned(rows, summary)
    engines = len(roles_of("voting")) * max(actors, 1)
    assert all(r["sync/verified"] == engines for r in rows if "sync/verified" in r)


def test_isolated_policy_changes_only_from_its_own_roles_turns(ray_cluster, tmp_path):
    # In-process members: which policy a turn's gradient reaches is the learners' routing, not the actors'.
    cfg = _cfg(tmp_path, "marl.workflow=voting", "marl.sharing=isolated", "ray.num_cpus=2",
               "rollout.engines_per_role=0", "learner.ranks=0")
    model_path = resolve_model(cfg.model.path)
    handles = build_handles(run_layout(cfg), model_path, get_family("digit"))
    # Only generator turns carry reward signal (varying within each group); the aggregator's is constant.
    handles.collector.shaping = {"aggregator": lambda episode, turn: 0.0,
                                "generator": lambda episode, turn: float(turn.completion.response_ids[0] % 2)}
    before = {pid: _weights(handles, pid) for pid in handles.policy_map.policies}
    (tmp_path / "tiny" / "rollouts").mkdir(parents=True)
    tasks = _load_digit_tasks()[:4]
    train_step(handles, cfg, RolloutSource(handles, cfg, PromptSampler(tasks, 0)), 0,
               pad_ids=dict.fromkeys(handles.policy_map.policies, 0),
               run_dir=tmp_path / "tiny")
    after = {pid: _weights(handles, pid) for pid in handles.policy_map.policies}
    assert all(torch.equal(before["aggregator"][k], after["aggregator"][k]) for k in before["aggregator"])
    assert any(not torch.equal(before["generator"][k], after["generator"][k]) for k in before["generator"])
    handles.shutdown()


def _weights(handles, pid):
    weights = handles.learners[pid].group.submit_to([0], LearnerMember.get_weights).result(60)[0]
    return {k: v.clone() for k, v in weights.items()}


def _load_digit_tasks():
    from marl.tasks.data import digit_tasks

    return digit_tasks(8, 0)


def test_missing_model_path_is_a_clear_error(tmp_path):
    cfg = _cfg(tmp_path, f"model.path={tmp_path}/no-such-model")
    with pytest.raises(InputError, match=r"model\.path"):
        train(cfg)


def test_data_without_valid_rows_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "Write the digit 3."}\n{"answer": "4"}\n')
    with pytest.raises(InputError, match="bad.jsonl"):
        train(_cfg(tmp_path, f"data.train={bad}"))


def test_engine_call_past_its_deadline_names_the_engine(ray_cluster, tmp_path):
    # The learner in-process: the first engine call fails before any update, so no learner actor is needed. No
    # replacement: the whole run's error path is under test here; replacing a hung engine first is
    # tests/rollout/test_engine_faults.py's.
    # One role, so the engine that stalls first is known.
    cfg = _cfg(tmp_path, "rollout.stall_timeout_s=0.001", "ray.num_cpus=2", "learner.ranks=0",
               "rollout.replace_dead_engines=false", "marl.workflow=single_agent")
    with pytest.raises(GroupTimeout, match=r"tiny:engine:solver:0\.generate"):
        train(cfg)


def test_unparsable_outputs_are_counted(ray_cluster, tmp_path):
    # In-process members: what is counted is the same, without starting actors.
    train(_cfg(tmp_path, "steps=1", "data.eval_size=0", "ray.num_cpus=2", "rollout.engines_per_role=0",
               "learner.ranks=0"))
    row = read_metrics(tmp_path / "tiny")[0]
    # A random model never writes \boxed{i}: every aggregator turn falls back and is counted.
    assert row["rollout/parse_failures/aggregator"] == row["rollout/episodes"] > 0
