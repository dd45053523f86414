"""The run layout: everything decided once from the config before any member starts. The role -> policy
map, the role -> engine group map with every group's name, each policy's own config (marl.policies over
the top level) and every group's resource demand, and the `auto` settings resolved (each policy's
gradient checkpointing, by the memory plan: planner.py), never written back into the config.
`run_layout(cfg)` builds it; placement (jobs/driver/resources.py), system building
(jobs/driver/handles.py: the learner ranks read their checkpointing from it), a sweep's trial bundles and
the planner (planner.py) read it, and nothing rebuilds a part.

Per run: for each engine group, rollout.engines_per_role members of {engine_num_cpus,
engine_num_gpus, engine_resources}, and for each policy, learner.ranks members of {rank_num_cpus,
rank_num_gpus, rank_resources}, each read from the settings of the policy the group serves (a
multi-LoRA engine group's from the top level; with learner.lora_colocate one learner group holds
every policy on the top-level rank settings). Under rollout.layout=colocated every group's member i
shares bundle i (one GPU: engine i and rank i of each learner group).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from cluster.bundles import Demand
from cluster.gpus import ClusterGpus, cluster_gpus
from jobs.config.colocation import colocated, colocated_name
from jobs.config.policies import engine_map_of, policy_configs, policy_map_of
from jobs.config.schema import TrainConfig
from jobs.plan.planner import resolve_checkpointing
from jobs.plan.run_layout_record import RunLayout
from marl.engine_map import EngineMap
from marl.names import group_name

GPU_SHARE = "gpu"  # rollout.layout=colocated: every group's member i in bundle i


def run_layout(cfg: TrainConfig, gpus: ClusterGpus | None = None) -> RunLayout:
    """The layout of `cfg` on `gpus` (default: the connected cluster's, else this machine's: cluster/gpus.py)
    (ValueError on a custom map that does not name exactly the workflow's roles, or on a model the planner
    cannot size when there is GPU memory to plan against)."""
    policy_map = policy_map_of(cfg)
    configs = policy_configs(cfg, policy_map)
    engine_map = engine_map_of(cfg, policy_map)
    shared = colocated(cfg)
    learner_groups = {pid: colocated_name(cfg) if shared else group_name(cfg.run_name, "learner", pid)
                      for pid in policy_map.policies}
    demands = (
        *_engine_demands(cfg, engine_map, configs),
        *_learner_demands(cfg, configs, learner_groups, shared),
    )
    if cfg.rollout.layout == "colocated":  # engine i and rank i of every learner group: one bundle, one GPU
        demands = tuple(replace(d, share=GPU_SHARE) for d in demands)
    configured = {pid: bool(pc.learner.gradient_checkpointing) for pid, pc in configs.items()}  # auto: off
    layout = RunLayout(cfg, policy_map, engine_map, configs, learner_groups, shared, demands, configured,
                       cluster_gpus() if gpus is None else gpus)
    resolved = resolve_checkpointing(layout)  # planned on this layout, auto as off
    return layout if resolved == configured else replace(layout, checkpointing=resolved)


def _engine_demands(
    cfg: TrainConfig, engine_map: EngineMap, configs: Mapping[str, TrainConfig]
) -> list[Demand]:
    out = []
    for spec in engine_map.groups:
        r = (configs[spec.policy] if spec.policy is not None else cfg).rollout
        out.append(Demand(spec.name, r.engines_per_role,
                          {"CPU": r.engine_num_cpus, "GPU": r.engine_num_gpus, **r.engine_resources}))
    return out


def _learner_demands(cfg: TrainConfig, configs: Mapping[str, TrainConfig], learner_groups: Mapping[str, str],
                     shared: bool) -> list[Demand]:
    # learner.lora_colocate: one group, on the top-level rank settings, holds every
    # policy's adapter on one base.
    groups = ({colocated_name(cfg): cfg.learner} if shared else
              {learner_groups[pid]: pc.learner for pid, pc in configs.items()})
    return [Demand(name, lr.ranks, {"CPU": lr.rank_num_cpus, "GPU": lr.rank_num_gpus, **lr.rank_resources})
            for name, lr in groups.items()]
