"""How build_handles lays out engine groups (HF engines, in-process): one group per role, one per policy
(rollout.engine_scope=policy), or one multi-LoRA group for every policy; the Collector routes by role either
way and each sync reaches every engine group once."""

from __future__ import annotations

import pytest
import torch

from jobs.config import load_config
from jobs.driver.handles import build_handles
from jobs.models.resolve import resolve_model
from jobs.plan.layout import run_layout
from marl.tasks import get_family
from marl.types import Task
from rollout.engine import Sampling

TASKS = [Task(task_id=f"t{i}", prompt=f"Write the digit {i}.", answer=str(i)) for i in range(2)]
SAMPLING = Sampling(temperature=1.0, max_new_tokens=4)
ROLES = ["generator", "aggregator"]


def _system(tmp_path, sharing: str, *overrides: str):
    cfg = load_config(
        "jobs/configs/tiny.yaml",
        [
            f"out_dir={tmp_path}",
            "marl.workflow=voting",
            f"marl.sharing={sharing}",
            "rollout.engines_per_role=0",
            "learner.ranks=0",
            "rollout.torch_threads=1",
            *overrides,
        ],
    )
    return build_handles(run_layout(cfg), resolve_model(cfg.model.path), get_family("digit"))


def _roles_served(episodes) -> set[str]:
    return {turn.role for e in episodes for turn in e.turns}


def test_policy_scope_with_a_shared_policy_is_one_group_for_every_role_synced_once(tmp_path):
    handles = _system(tmp_path, "shared", "rollout.engine_scope=policy")
    try:
        groups = handles.engine_groups()
        assert len(groups) == 1 and groups[0].group.name == "tiny:engine:shared"
        assert handles.engines["generator"] is handles.engines["aggregator"] is groups[0]
        assert groups[0].policy_of == {"generator": "shared", "aggregator": "shared"}
        out = handles.sync(1)
        assert out["sync/verified"] == 1.0  # one engine, one broadcast: not one per role
        assert groups[0].versions() == [1]
        episodes = handles.collector.collect(TASKS, 2, SAMPLING).episodes
        assert _roles_served(episodes) == set(ROLES)
        assert {t.completion.version for e in episodes for t in e.turns} == {1}
    finally:
        handles.shutdown()


def test_role_scope_keeps_a_group_per_role(tmp_path):
    handles = _system(tmp_path, "shared")
    try:
        assert [g.group.name for g in handles.engine_groups()] == [
            "tiny:engine:generator",
            "tiny:engine:aggregator",
        ]
        assert handles.sync(1)["sync/verified"] == 2.0
    finally:
        handles.shutdown()


def test_multi_lora_is_one_group_serving_each_isolated_policy_through_its_adapter(tmp_path):
    handles = _system(tmp_path, "isolated", "model.lora.enabled=true", "model.lora.rank=8",
                     "rollout.lora_serving=multi")
    try:
        (group,) = handles.engine_groups()
        assert group.group.name == "tiny:engine:lora" and group.multi_lora
        out = handles.sync(2)
        assert out["sync/verified"] == 2.0  # one adapter per policy into the one engine
        adapter_bytes = out["sync/bytes"]
        full = sum(t.numel() * t.element_size()
                   for t in handles.learners["generator"].group._members[0].get_weights().values())
        assert adapter_bytes < full / 2  # adapters only, never the base weights
        episodes = handles.collector.collect(TASKS, 2, SAMPLING).episodes
        assert _roles_served(episodes) == set(ROLES)
        served = {(t.role, t.completion.policy_id, t.completion.version) for e in episodes for t in e.turns}
        assert served == {("generator", "generator", 2), ("aggregator", "aggregator", 2)}
        assert not [k for k in out if k.startswith("sync/merge_rounding")]  # nothing is merged
    finally:
        handles.shutdown()


def test_merged_lora_serving_in_bf16_reports_the_update_lost_to_rounding(tmp_path):
    handles = _system(
        tmp_path,
        "shared",
        "model.lora.enabled=true",
        "model.lora.rank=8",
        "model.dtype=bfloat16",
        "model.allow_emulated_bf16=true",
    )  # bf16 numerics on any CPU (jobs/config/precision.py)
    try:
        assert handles.sync(1)["sync/merge_rounding/shared"] == 0.0  # LoRA's B starts at 0: no update yet
        learner = handles.learners["shared"].group._members[0]
        with torch.no_grad():  # an update far below bf16's resolution of the base weights
            for module in learner.model.modules():
                if hasattr(module, "lora_B"):
                    module.lora_B["default"].weight.fill_(1e-6)
        assert handles.sync(2)["sync/merge_rounding/shared"] > 0.95
        with torch.no_grad():  # a large one arrives (up to bf16's rounding of the merged weights)
            for module in learner.model.modules():
                if hasattr(module, "lora_B"):
                    module.lora_B["default"].weight.normal_(0.0, 1.0)
        assert handles.sync(3)["sync/merge_rounding/shared"] < 0.01
    finally:
        handles.shutdown()


def test_multi_lora_needs_lora_enabled(tmp_path):
    from jobs.config import ConfigError

    with pytest.raises(ConfigError, match="rollout.lora_serving=multi"):
        load_config("jobs/configs/tiny.yaml", [f"out_dir={tmp_path}", "rollout.lora_serving=multi"])


def test_nccl_transport_is_validated_at_load(tmp_path):
    from jobs.config import ConfigError

    # tiny.yaml's members hold no GPU: NCCL cannot join them (jobs/config/gpu_rules.py)
    overrides = [f"out_dir={tmp_path}", "sync.transport=nccl", "rollout.backend=vllm"]
    with pytest.raises(ConfigError, match="sync.transport=nccl needs a GPU on both ends"):
        load_config("jobs/configs/tiny.yaml", overrides)
    with pytest.raises(ConfigError, match="sync.transport must be one of"):
        load_config("jobs/configs/tiny.yaml", [f"out_dir={tmp_path}", "sync.transport=carrier_pigeon"])
