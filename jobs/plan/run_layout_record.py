"""The `RunLayout` record on its own: the planner reads layouts and layout.py builds them with the planner's
help (the `auto` settings it resolves), so the record sits below both and neither imports the other back.
Build one with `jobs.plan.layout.run_layout(cfg)`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from cluster.bundles import Demand
from cluster.gpus import ClusterGpus
from jobs.config.schema import TrainConfig
from marl.engine_map import EngineMap
from marl.policy_map import PolicyMap


@dataclass(frozen=True)
class RunLayout:
    """One run's groups as decided by its config; read-only like the config it was built from."""

    cfg: TrainConfig  # the run's whole config
    policy_map: PolicyMap
    engine_map: EngineMap
    configs: Mapping[str, TrainConfig]  # policy -> the whole config as that policy sees it
    learner_groups: Mapping[str, str]  # policy -> its learner group's name (one shared name when colocated)
    colocated: bool  # learner.lora_colocate: one learner group holds every policy's adapter on one base
    # every engine group's, then every learner group's members and their resources
    demands: tuple[Demand, ...]
    # policy -> learner.gradient_checkpointing, auto resolved by the plan (planner.resolve_checkpointing)
    checkpointing: Mapping[str, bool]
    # The GPUs of the cluster's nodes (cluster/gpus.py), read once where the layout is built: the plan, the
    # `auto` checkpointing and the NCCL gate read these, never the driver's own devices.
    gpus: ClusterGpus = field(default_factory=ClusterGpus)

    def engine_config(self, policy: str | None) -> TrainConfig:
        """The config an engine group of `policy` is built from (None: the
        multi-LoRA group, on the top level)."""
        return self.configs[policy] if policy is not None else self.cfg
