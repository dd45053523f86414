"""Per-policy settings (marl.policies): validation that names the key, inheritance from the top level,
resource arithmetic per policy, and heterogeneous base models end to end (builtin:tiny generators with a
builtin:tiny-wide aggregator: another width, vocabulary and chat template)."""

from __future__ import annotations

import dataclasses
import json

import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from jobs.config import ConfigError, load_config
from jobs.config.policies import policy_config
from jobs.config.sweep_spec import cells, load_sweep
from jobs.driver.assets import prepare
from jobs.driver.handles import build_handles
from jobs.driver.resources import arithmetic
from jobs.models.resolve import resolve_model
from jobs.plan.layout import run_layout
from jobs.sweep import setup_of, trial_config
from jobs.telemetry.tracking import read_metrics
from jobs.train import train
from marl.tasks import get_family
from marl.tasks.data import digit_tasks
from rollout.engine import Sampling

TINY = "jobs/configs/tiny.yaml"
WIDE = "marl.policies.aggregator.model.path=builtin:tiny-wide"
PARITY = "tests.learning.first_token_parity"


def _cfg(*overrides: str):
    return load_config(TINY, list(overrides))


def test_a_policy_inherits_what_it_does_not_set():
    cfg = _cfg(
        WIDE, "marl.policies.aggregator.learner.optim.lr=5e-4", "marl.policies.aggregator.learner.ranks=2"
    )
    agg, gen = policy_config(cfg, "aggregator"), policy_config(cfg, "generator")
    assert (agg.model.path, agg.learner.optim.lr, agg.learner.ranks) == ("builtin:tiny-wide", 5e-4, 2)
    assert agg.learner.optim.warmup_steps == cfg.learner.optim.warmup_steps == 0  # inherited
    assert agg.learner.micro_batch_size == 32 and agg.model.dtype == "float32"
    assert gen is cfg and not agg.marl.policies


def test_overrides_apply_to_the_policies_the_map_produces():
    shared = _cfg("marl.sharing=shared", "marl.policies.shared.learner.optim.lr=5e-4")
    assert policy_config(shared, "shared").learner.optim.lr == 5e-4
    custom = _cfg("marl.workflow=orch_workers", "marl.sharing=custom", "marl.policy_map.orchestrator=lead",
                  "marl.policy_map.synthesizer=lead", "marl.policy_map.worker=crew",
                  "marl.policies.crew.model.path=builtin:tiny-wide")
    assert policy_config(custom, "crew").model.path == "builtin:tiny-wide"
    assert policy_config(custom, "lead").model.path == "builtin:tiny"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["marl.sharing=shared", WIDE],
            "marl.policies.aggregator: no such policy; marl.sharing=shared with voting has shared",
        ),
        (["marl.policies.judge.learner.ranks=1"], "marl.policies.judge: no such policy"),
        (
            ["marl.policies.aggregator.learner.backend=deepspeed"],
            "marl.policies.aggregator.learner.backend cannot be set per policy",
        ),
        (
            ["marl.policies.aggregator.algo.kl_coef=0.1"],
            "marl.policies.aggregator.algo.kl_coef cannot be set",
        ),
        (
            ["marl.policies.aggregator.rollout.sampling.temperature=1"],
            "marl.policies.aggregator.rollout.sampling",
        ),
        (
            ["marl.policies.aggregator.model.lora.bogus=1"],
            "marl.policies.aggregator.model.lora.bogus: Key 'bogus'",
        ),
        (
            ["marl.policies.aggregator.learner.optim.lr=abc"],
            "marl.policies.aggregator.learner.optim.lr: Value 'abc'",
        ),
        (
            ["marl.policies.aggregator.learner.optim.lr=-1"],
            "marl.policies.aggregator: learner.optim.lr must be > 0",
        ),
        (
            ["marl.policies.aggregator.model.dtype=fp8"],
            "marl.policies.aggregator: model.dtype must be one of",
        ),
        (
            ["marl.policies.aggregator.learner.rank_num_gpus=1"],
            "marl.policies.aggregator: learner.rank_num_gpus > 0 needs a backend that trains on GPUs "
            "(learner.backend=deepspeed)",
        ),
        (
            ["model.lora.enabled=true", "rollout.lora_serving=multi", WIDE],
            "marl.policies.aggregator.model.path: rollout.lora_serving=multi serves every policy from one "
            "engine group",
        ),
    ],
)
def test_a_wrong_override_names_itself(overrides, message):
    with pytest.raises(ConfigError) as e:
        _cfg(*overrides)
    assert message in str(e.value)


def test_resources_follow_each_policy():
    """Hand-computed: generator engine 0.5 + its rank 1 + aggregator engine 0.25 + its rank 0.25 = 2 GPUs."""
    cfg = _cfg(
        "learner.backend=deepspeed",
        "rollout.engine_num_gpus=0.25",
        "learner.rank_num_gpus=0.25",
        "marl.policies.generator.rollout.engine_num_gpus=0.5",
        "marl.policies.generator.learner.rank_num_gpus=1",
        "marl.policies.aggregator.rollout.engines_per_role=2",
        "marl.policies.aggregator.learner.ranks=2",
        "marl.policies.aggregator.learner.rank_num_cpus=1",
    )
    demands = {d.name: (d.n, dict(d.resources)) for d in run_layout(cfg).demands}
    assert demands == {
        "tiny:engine:generator": (1, {"CPU": 0.5, "GPU": 0.5}),
        "tiny:engine:aggregator": (2, {"CPU": 0.5, "GPU": 0.25}),
        "tiny:learner:generator": (1, {"CPU": 0.5, "GPU": 1.0}),
        "tiny:learner:aggregator": (2, {"CPU": 1.0, "GPU": 0.25}),
    }
    # CPU 1+0.5+1+0.5+2, GPU 0.5+0.5+1+0.5
    assert arithmetic(run_layout(cfg), {"CPU": 1}).endswith("= {CPU: 5, GPU: 2.5}")
    scoped = _cfg("rollout.engine_scope=policy", "marl.policies.aggregator.rollout.engine_num_cpus=2")
    assert {d.name: dict(d.resources) for d in run_layout(scoped).demands}["tiny:engine:aggregator"] \
        == {"CPU": 2.0, "GPU": 0.0}


def test_hetero_example_sweep_fits_two_gpus():
    spec = load_sweep("jobs/configs/sweeps/hetero_example.yaml")
    setup = setup_of(spec)
    for cell in cells(spec):
        cfg = trial_config(setup, {"grid": cell}, "hetero")
        assert policy_config(cfg, "generator").model.path == "/models/Qwen3-4B"
        assert policy_config(cfg, "evaluator").model.lora.rank == 16
        assert arithmetic(run_layout(cfg), dict(setup.driver)).endswith("= {CPU: 9, GPU: 2}")


def test_prepare_gives_each_policy_its_model_and_pad_id():
    inp = prepare(_cfg(WIDE, "data.eval_size=2"))
    assert inp.model_paths == {"generator": resolve_model("builtin:tiny"),
                               "aggregator": resolve_model("builtin:tiny-wide")}
    assert inp.pad_ids == {"generator": 0, "aggregator": 100}


def _tokenizers(paths: dict[str, str]) -> dict[str, AutoTokenizer]:
    return {pid: AutoTokenizer.from_pretrained(path) for pid, path in paths.items()}


def _assert_own_tokenizer(turns: list[dict], tokenizers: dict) -> None:
    """Each turn was encoded by its policy's tokenizer and chat template, and sampled from its vocabulary."""
    for t in turns:
        tok = tokenizers[t["policy_id"]]
        # Parquet: JSON
        messages = json.loads(t["messages"]) if isinstance(t["messages"], str) else t["messages"]
        assert t["prompt_ids"] == tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                          return_dict=False)
        assert all(i < len(tok) for i in t["response_ids"])


def test_custom_map_two_roles_share_a_model_a_third_has_its_own(tmp_path):
    """orch_workers: orchestrator and synthesizer share policy `lead` (tiny), the
    worker has `crew` (tiny-wide)."""
    cfg = _cfg(
        f"out_dir={tmp_path}",
        "marl.workflow=orch_workers",
        "marl.sharing=custom",
        "marl.max_strategies=8",
        "marl.policy_map.orchestrator=lead",
        "marl.policy_map.synthesizer=lead",
        "marl.policy_map.worker=crew",
        "marl.policies.crew.model.path=builtin:tiny-wide",
        "rollout.engine_scope=policy",
        "rollout.engines_per_role=0",
        "learner.ranks=0",
    )
    handles = build_handles(run_layout(cfg), resolve_model(cfg.model.path), get_family("digit"))
    try:
        assert handles.engine_groups("crew") == [handles.engines["worker"]]
        assert (
            handles.engines["orchestrator"] is handles.engines["synthesizer"] is not handles.engines["worker"]
        )
        episodes = handles.collector.collect(
            digit_tasks(8, 0)[:2], 2, Sampling(max_new_tokens=8, seed=3)
        ).episodes
        assert handles.sync(version=1)["sync/verified"] == 2  # each policy's weights, to its own group only
    finally:
        handles.shutdown()
    turns = [{**dataclasses.asdict(t.completion), "messages": t.messages, "role": t.role}
             for e in episodes for t in e.turns]
    assert {t["role"] for t in turns} == {"orchestrator", "worker", "synthesizer"}
    _assert_own_tokenizer(turns, _tokenizers({"lead": resolve_model("builtin:tiny"),
                                              "crew": resolve_model("builtin:tiny-wide")}))


@pytest.mark.parametrize(("backend", "actors"), [
    ("hf", 1), pytest.param("vllm", 0, marks=[pytest.mark.vllm, pytest.mark.slow])])
def test_heterogeneous_voting_trains_and_exports(ray_cluster, tmp_path, backend, actors):
    """Generators on builtin:tiny (64 wide, 104 ids, ChatML), the aggregator on builtin:tiny-wide (128 wide,
    132 ids, `[role]` headers), each with its own lr, trained 2 steps through Ray actors (HF) or in-process
    vLLM engines; every sync is fingerprint-verified on every engine. A shaping hook gives the random models'
    turns differing rewards, so both policies really move."""
    cfg = _cfg(f"out_dir={tmp_path}", WIDE, "marl.policies.aggregator.learner.optim.lr=5e-4",
               "learner.optim.schedule=constant", f"rollout.backend={backend}",
               "rollout.vllm.kv_cache_gb=0.25",
               f"rollout.engines_per_role={actors}", f"learner.ranks={actors}", "rollout.prompts_per_step=2",
               "rollout.samples_per_prompt=4", "data.eval_size=2", *(f"marl.reward_shaping.{role}={PARITY}"
                                                                     for role in ("generator", "aggregator")))
    train(cfg)
    run = tmp_path / "tiny"
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert rows[1]["lr/generator"] == pytest.approx(1e-3) and rows[1]["lr/aggregator"] == pytest.approx(5e-4)
    assert all(r["sync/verified"] == 2 for r in rows[:2])
    for pid in ("generator", "aggregator"):
        # A policy moves in every step unless the step gave all its rows one reward within each group (every
        # advantage zero, so every row dropped: a sampled outcome), and in at least one of the two steps.
        assert all(
            rows[s][f"grad/norm/{pid}"] > 0
            or rows[s][f"batch/dropped_zero_adv/{pid}"] == rows[s][f"batch/rows/{pid}"]
            for s in (0, 1)
        )
        assert any(rows[s][f"grad/norm/{pid}"] > 0 for s in (0, 1))
    for r in rows[:2]:  # the per-policy and per-role numbers of each step, for the record
        print(f"\n[{backend}] step {r['step']}: " + ", ".join(
            f"{k}={v:.4g}" for k, v in sorted(r.items()) if k.endswith(("/generator", "/aggregator"))
            and k.split("/")[0] in ("lr", "loss", "grad", "clip_frac", "optim", "reward", "response_len")))
    paths = {"generator": resolve_model("builtin:tiny"), "aggregator": resolve_model("builtin:tiny-wide")}
    tokenizers = _tokenizers(paths)
    for step in (0, 1):
        _assert_own_tokenizer(
            pq.read_table(run / "rollouts" / f"step_00000{step}.parquet").to_pylist(), tokenizers
        )
    for pid, width, vocab in (("generator", 64, 104), ("aggregator", 128, 132)):
        export = run / "export" / pid
        model, tok = AutoModelForCausalLM.from_pretrained(export), AutoTokenizer.from_pretrained(export)
        assert (model.config.hidden_size, model.config.vocab_size, len(tok)) == (width, vocab, vocab)
        assert (
            tok.chat_template == tokenizers[pid].chat_template
            and tok.pad_token_id == tokenizers[pid].pad_token_id
        )
        assert AutoConfig.from_pretrained(paths[pid]).hidden_size == width
        base = AutoModelForCausalLM.from_pretrained(paths[pid]).state_dict()
        # trained, then exported
        assert any(not torch.equal(base[k], v) for k, v in model.state_dict().items())
