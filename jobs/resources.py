"""What a run asks of the cluster: one resource demand per engine group and learner group, computed from
the config alone, turned into the run's placement group (a standalone run) or a Tune trial's resource
request (a sweep). Both go through the same layout, so a trial's placement group is exactly what the run
inside it looks for.

Per run: (engine groups x rollout.engines_per_role) bundles of {engine_num_cpus, engine_num_gpus,
engine_resources} + (policies x learner.ranks) bundles of {rank_num_cpus, rank_num_gpus, rank_resources};
a Tune trial adds one bundle in front for its driver.
"""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

from cluster.placement import Demand, PlacementError, RunPlacement, layout, place
from marl.policy_map import PolicyMap
from marl.workflows import roles_of

# The config keys a placement failure points the user to.
RESOURCE_KEYS = ("rollout.engines_per_role", "rollout.engine_num_cpus", "rollout.engine_num_gpus",
                 "rollout.engine_resources", "learner.ranks", "learner.rank_num_cpus", "learner.rank_num_gpus",
                 "learner.rank_resources", "ray.placement_strategy")


MULTI_LORA_KEY = "lora"  # the one engine group of multi-LoRA serving


def engine_group_name(run_name: str, key: str) -> str:
    return f"{run_name}:engine:{key}"


def learner_group_name(run_name: str, policy_id: str) -> str:
    return f"{run_name}:learner:{policy_id}"


def policy_map_of(cfg: Any) -> PolicyMap:
    roles = list(roles_of(cfg.marl.workflow))
    return PolicyMap.build(cfg.marl.sharing, roles, OmegaConf.to_container(cfg.marl.policy_map))


def engine_keys(cfg: Any, policy_map: PolicyMap) -> list[str]:
    """One engine group per role, or per policy with rollout.engine_scope=policy, or one for every policy
    with rollout.lora_serving=multi (the base model plus one LoRA adapter per policy)."""
    if OmegaConf.select(cfg, "rollout.lora_serving", default="single") == "multi":
        return [MULTI_LORA_KEY]
    if OmegaConf.select(cfg, "rollout.engine_scope", default="role") == "policy":
        return list(policy_map.policies)
    return list(policy_map.roles)


def run_demands(cfg: Any, policy_map: PolicyMap) -> list[Demand]:
    """Every engine group's and learner group's members with their per-member resources."""
    r, lr = cfg.rollout, cfg.learner
    engine = {"CPU": r.engine_num_cpus, "GPU": r.engine_num_gpus, **r.engine_resources}
    learner = {"CPU": lr.rank_num_cpus, "GPU": lr.rank_num_gpus, **lr.rank_resources}
    return [
        *(Demand(engine_group_name(cfg.run_name, k), r.engines_per_role, engine)
          for k in engine_keys(cfg, policy_map)),
        *(Demand(learner_group_name(cfg.run_name, p), lr.ranks, learner) for p in policy_map.policies),
    ]


def build_placement(cfg: Any, policy_map: PolicyMap) -> RunPlacement | None:
    """The run's placement group (or the enclosing Tune trial's), ready before any member starts."""
    try:
        return place(run_demands(cfg, policy_map), cfg.ray.placement_strategy, cfg.ray.placement_timeout_s,
                     name=f"{cfg.run_name}:placement")
    except PlacementError as e:
        raise PlacementError(f"{e}\n  (set by {', '.join(RESOURCE_KEYS)})") from None


def trial_bundles(cfg: Any, driver: dict[str, float]) -> list[dict[str, float]]:
    """A Tune trial's bundles: its driver's, then the run's own layout (what `build_placement` adopts)."""
    return layout(run_demands(cfg, policy_map_of(cfg)), head=driver).bundles
