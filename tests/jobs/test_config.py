"""Config loading: schema, overrides, read-only result, and errors that name the key."""

from __future__ import annotations

import re

import pytest
from omegaconf import OmegaConf
from omegaconf.errors import ReadonlyConfigError

from jobs.config import ConfigError, load_config, to_yaml
from jobs.config.schema import as_node
from jobs.train import main

TINY = "jobs/configs/tiny.yaml"


def test_yaml_and_overrides_merge_onto_the_schema():
    cfg = load_config(TINY, ["rollout.sampling.temperature=0.9", "marl.sharing=shared"])
    assert cfg.rollout.sampling.temperature == 0.9
    assert cfg.marl.sharing == "shared"
    assert cfg.model.path == "builtin:tiny"
    assert cfg.algo.clip_high == 0.28  # schema default survives


def test_a_workflow_setting_reaches_the_workflow_from_an_override():
    from marl.workflows import workflow_options

    cfg = load_config(TINY, ["marl.workflow=voting", "marl.shuffle_candidates=true"])
    assert workflow_options(cfg.marl.workflow, cfg.marl).shuffle_candidates is True
    assert workflow_options("voting", load_config(TINY).marl).shuffle_candidates is False
    with pytest.raises(ConfigError, match=r"marl\.shuffle_candidates"):
        load_config(TINY, ["marl.shuffle_candidates=sometimes"])


def test_chat_template_kwargs_from_yaml_and_from_an_override(tmp_path):
    assert load_config(TINY).model.chat_template_kwargs == {}
    override = load_config(TINY, ["model.chat_template_kwargs.enable_thinking=false"])
    assert override.model.chat_template_kwargs == {"enable_thinking": False}
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  path: builtin:tiny\n  chat_template_kwargs: {enable_thinking: false, tag: x}\n"
                    "data:\n  train: digit\n  train_size: 8\n")
    assert dict(load_config(str(path)).model.chat_template_kwargs) == {"enable_thinking": False, "tag": "x"}


def test_loaded_config_is_frozen():
    cfg = load_config(TINY)
    with pytest.raises(ReadonlyConfigError):
        cfg.steps = 5


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("rollout.bogus=1", "rollout.bogus"),
        ("steps=abc", "steps"),
        ("steps=0", "steps"),
        ("data.sandbox.workers=-1", "data.sandbox.workers"),
        ("data.sandbox.timeout_per_test_s=-6", "data.sandbox.timeout_per_test_s"),
        ("marl.workflow=debate", "marl.workflow"),
        ("rollout.sampling.top_p=1.5", "rollout.sampling.top_p"),
        ("algo.group_by=[task,colour]", "algo.group_by"),
        ("learner.ranks=-1", "learner.ranks"),
        ("marl.sharing=custom", "marl.policy_map"),
        ("algo.clip_low=1.5", "algo.clip_low"),
        ("rollout.backend=sglang", "rollout.backend"),
        ("rollout.vllm.kv_cache_gb=-1", "rollout.vllm.kv_cache_gb"),
        ("rollout.vllm.gpu_memory_utilization=0", "rollout.vllm.gpu_memory_utilization"),
        ("rollout.vllm.max_model_len=-8", "rollout.vllm.max_model_len"),
        ("rollout.vllm.sync_path=inplace", "rollout.vllm.sync_path"),
        ("learner.rank_num_gpus=1", "learner.backend=deepspeed"),
        ("algo.ppo_mini_batch_size=-1", "algo.ppo_mini_batch_size"),
        ("algo.ppo_epochs=0", "algo.ppo_epochs"),
        ("algo.old_logprobs=engine", "algo.old_logprobs"),
        ("learner.optim.schedule_unit=epoch", "learner.optim.schedule_unit"),
        # Off-policy rows need the engine as the behaviour policy, or importance weights.
        ("rollout.one_step_off_policy=true", "algo.old_logprobs=rollout"),
        ("rollout.max_prompt_tokens=-1", "rollout.max_prompt_tokens"),
        ("algo.max_role_drop_frac=1.5", "algo.max_role_drop_frac"),
        (
            "model.chat_template_kwargs.add_generation_prompt=false",
            "model.chat_template_kwargs.add_generation_prompt",
        ),
        ("rollout.mode=batched", "rollout.mode"),
        ("rollout.stall_timeout_s=0", "rollout.stall_timeout_s"),
    ],
)
def test_bad_values_name_their_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(TINY, [override])


def test_a_removed_key_names_its_replacement():
    with pytest.raises(
        ConfigError, match=r"rollout\.call_timeout_s was removed; use rollout\.stall_timeout_s"
    ):
        load_config(TINY, ["rollout.call_timeout_s=300"])


def test_choices_are_the_enums_beside_their_registries():
    """A closed registry holds exactly the values of the Enum beside it, the schema's type for its key (its
    construction refuses anything else); the tables not yet a Registry are checked here. A bad value names
    the key and the choices, a good one reads back as its string."""
    from cluster.bundles import STRATEGIES
    from jobs.config.schema import PlacementStrategy
    from learners.schedule import SCHEDULES
    from learners.update.advantages import ADVANTAGE_ESTIMATORS, AdvantageEstimator
    from learners.update.losses import KL_ESTIMATORS, LOSS_AGGREGATIONS
    from marl.dtypes import DTYPES
    from marl.engine_map import ENGINE_SCOPES, EngineScope
    from marl.tasks.math import ANSWER_FALLBACKS, AnswerFallback
    from rollout.clients import CLIENTS, RolloutMode

    for registry in (ADVANTAGE_ESTIMATORS, LOSS_AGGREGATIONS, KL_ESTIMATORS, SCHEDULES, DTYPES):
        assert registry.enum is not None and registry.names() == tuple(m.value for m in registry.enum)
        with pytest.raises(ValueError, match="is closed"):
            registry.register("other", registry[registry.names()[0]])
    for enum, table in (
        (RolloutMode, CLIENTS),
        (PlacementStrategy, STRATEGIES),
        (EngineScope, ENGINE_SCOPES),
        (AnswerFallback, ANSWER_FALLBACKS),
    ):
        assert [m.value for m in enum] == list(table), enum
    with pytest.raises(ConfigError, match=r"algo\.advantage must be one of grpo, rloo; got 'mean'"):
        load_config(TINY, ["algo.advantage=mean"])
    cfg = load_config(
        TINY, ["algo.advantage=rloo", "algo.loss_agg=seq_mean_token_mean", "algo.kl_estimator=k1"]
    )
    assert (cfg.algo.advantage, cfg.algo.loss_agg, cfg.algo.kl_estimator) == (
        "rloo",
        "seq_mean_token_mean",
        "k1",
    )
    assert isinstance(cfg.algo.advantage, AdvantageEstimator) and f"{cfg.algo.advantage}" == "rloo"
    assert "advantage: rloo\n" in to_yaml(cfg)  # the run's config.yaml keeps the plain string


def test_a_prompt_cap_needs_room_for_a_whole_response_in_max_len():
    # tiny: max_new_tokens 8
    with pytest.raises(ConfigError, match=r"algo\.max_len must be >= .*; got 107 < 100 \+ 8"):
        load_config(TINY, ["rollout.max_prompt_tokens=100", "algo.max_len=107"])
    cfg = load_config(TINY, ["rollout.max_prompt_tokens=100", "algo.max_len=108"])
    assert (cfg.rollout.max_prompt_tokens, cfg.algo.max_role_drop_frac) == (100, 0.05)


def test_role_caps_name_their_role_and_count_in_max_len():
    cfg = load_config(TINY, ["marl.workflow=voting", "rollout.role_max_new_tokens={aggregator: 96}"])
    assert dict(cfg.rollout.role_max_new_tokens) == {"aggregator": 96}
    with pytest.raises(ConfigError, match="rollout.role_max_new_tokens.critic: voting has no role 'critic'"):
        load_config(TINY, ["marl.workflow=voting", "rollout.role_max_new_tokens={critic: 96}"])
    with pytest.raises(
        ConfigError, match=r"rollout.role_max_new_tokens.aggregator must be in \(0, algo.max_len"
    ):
        load_config(TINY, ["marl.workflow=voting", "rollout.role_max_new_tokens={aggregator: 0}"])
    with pytest.raises(ConfigError, match=r"algo.max_len must be >= .*; got 150 < 100 \+ 96"):
        load_config(
            TINY,
            [
                "marl.workflow=voting",
                "rollout.role_max_new_tokens={aggregator: 96}",
                "rollout.max_prompt_tokens=100",
                "algo.max_len=150",
                "rollout.sampling.max_new_tokens=32",
            ],
        )


def test_missing_required_model_path_is_named():
    with pytest.raises(ConfigError, match=r"model\.path"):
        load_config(None, [])


def test_missing_file_is_named():
    with pytest.raises(ConfigError, match="nope.yaml"):
        load_config("nope.yaml")


def test_print_config_cli(capsys):
    assert main(["--config", TINY, "--print-config", "steps=7"]) == 0
    out = capsys.readouterr().out
    assert "steps: 7" in out and "path: builtin:tiny" in out and "clip_high: 0.28" in out


def test_cli_config_error_exits_2_with_message(capsys):
    assert main(["--config", TINY, "learner.optim.lr=-1"]) == 2
    assert "learner.optim.lr" in capsys.readouterr().err


@pytest.mark.parametrize(
    "override,key",
    [
        ("algo.dual_clip_c=1.0", "algo.dual_clip_c"),  # verl asserts clip_ratio_c > 1
        ("algo.dual_clip_c=-3", "algo.dual_clip_c"),
        ("algo.log_ratio_clamp=-20", "algo.log_ratio_clamp"),
        ("learner.optim.cosine_clamp=maybe", "learner.optim.cosine_clamp"),
        (
            "algo.minibatch_order=verl_balanced",
            "algo.minibatch_shuffle=false",
        ),  # balanced for the in-order split
        ("algo.minibatch_order=sorted", "algo.minibatch_order"),
        ("algo.minibatch_ranks=-1", "algo.minibatch_ranks"),
        (
            "algo.minibatch_chunks=fixed algo.ppo_mini_batch_size=5 algo.minibatch_ranks=2",
            "algo.minibatch_chunks",
        ),
        ("algo.loss_normalizer=nominal", "algo.loss_normalizer"),  # tiny.yaml: token_mean, no mini-batch size
        ("algo.loss_normalizer=nominal algo.loss_agg=seq_mean_token_mean", "algo.loss_normalizer"),
        ("algo.singleton_advantage=reward algo.advantage=rloo", "algo.singleton_advantage"),
        ("algo.singleton_advantage=one", "algo.singleton_advantage"),
    ],
)
def test_verl_update_details_are_checked(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(TINY, override.split())


def test_verl_update_details_load():
    cfg = load_config(
        TINY,
        [
            "algo.dual_clip_c=3.0",
            "algo.log_ratio_clamp=20",
            "algo.minibatch_shuffle=false",
            "learner.optim.warmup_start_zero=true",
            "learner.optim.cosine_clamp=false",
            "learner.optim.schedule_unit=update_call",
        ],
    )
    assert (cfg.algo.dual_clip_c, cfg.algo.log_ratio_clamp, cfg.algo.minibatch_shuffle) == (3.0, 20.0, False)
    assert (cfg.learner.optim.warmup_start_zero, cfg.learner.optim.cosine_clamp) == (True, False)
    assert cfg.learner.optim.schedule_unit == "update_call"
    cfg = load_config(
        TINY,
        [
            "algo.minibatch_order=verl_balanced",
            "algo.minibatch_shuffle=false",
            "algo.minibatch_ranks=2",
            "algo.minibatch_chunks=fixed",
            "algo.ppo_mini_batch_size=8",
            "algo.loss_normalizer=nominal",
            "algo.loss_agg=seq_mean_token_mean",
        ],
    )
    assert (cfg.algo.minibatch_order, cfg.algo.minibatch_ranks, cfg.algo.minibatch_chunks,
            cfg.algo.loss_normalizer) == ("verl_balanced", 2, "fixed", "nominal")
    assert load_config(TINY).algo.minibatch_order == "given"  # today's order unless asked
    assert load_config(TINY, ["algo.singleton_advantage=reward"]).algo.singleton_advantage == "reward"
    assert load_config(TINY).algo.singleton_advantage == "zero"


def test_every_bound_a_schema_field_carries_is_checked():
    """A bound in a field's metadata needs no table: the defaults pass, and each bounded key just past its
    bound fails naming the key."""
    from omegaconf import OmegaConf

    from jobs.config.field_rules import check_fields, schema_rules
    from jobs.config.schema import TrainConfig

    base = OmegaConf.structured(TrainConfig)
    assert check_fields(base) is None
    bounded = [r for r in schema_rules().values() if r.low_bound() or r.high_bound()]
    assert {"steps", "learner.optim.lr", "algo.clip_low", "ray.gpu_memory_gb", "rollout.sampling.top_p",
            "checkpoint.keep_last"} <= {r.key for r in bounded}
    for rule in bounded:
        low = rule.above if rule.above is not None else (rule.min or 0) - 1
        high = [rule.below] if rule.below is not None else [rule.max + 1] if rule.max is not None else []
        for edge in [low, *high]:
            cfg = OmegaConf.merge(base, OmegaConf.from_dotlist([f"{rule.key}={edge}"]))
            got = OmegaConf.select(cfg, rule.key)
            assert check_fields(cfg) == f"{rule.key} must be {rule.bounds_label()}; got {got!r}"
    labels = {r.key: r.bounds_label() for r in bounded}
    assert (labels["steps"], labels["rollout.sampling.top_p"], labels["algo.clip_low"],
            labels["checkpoint.keep_last"]) == ("> 0", "in (0, 1]", "in [0, 1)", ">= 1")


@pytest.mark.parametrize(("old", "new"), [
    ("rollout.kv_cache_gb=1.5", "rollout.vllm.kv_cache_gb"),
    ("rollout.gpu_memory_utilization=0.5", "rollout.vllm.gpu_memory_utilization"),
    ("rollout.max_model_len=64", "rollout.vllm.max_model_len"),
    ("rollout.vllm_sync_path=reload", "rollout.vllm.sync_path"),
])
def test_vllm_settings_moved_into_their_section_and_the_old_keys_say_where(old, new):
    with pytest.raises(ConfigError, match=rf"^config: {re.escape(old.split('=')[0])} was removed; use "
                                          rf"{re.escape(new)}$"):
        load_config(TINY, [old])
    value = old.split("=")[1]
    cfg = load_config(TINY, [f"{new}={value}"])
    assert str(OmegaConf.select(as_node(cfg), new)) == value


def test_an_enabled_tracking_sink_needs_its_package(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match=r"^config: tracking\.wandb\.enabled=true needs the `wandb`"):
        load_config(TINY, ["tracking.wandb.enabled=true"])
    assert not load_config(TINY).tracking.wandb.enabled  # off: the package is never looked for
