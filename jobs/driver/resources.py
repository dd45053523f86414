"""What a run asks of the cluster: one resource demand per engine group and learner group, computed from
the config alone, turned into the run's placement group (a standalone run) or a Tune trial's resource
request (a sweep). Both go through the same layout, so a trial's placement group is exactly what the run
inside it looks for.

Per run: for each engine group, rollout.engines_per_role bundles of {engine_num_cpus, engine_num_gpus,
engine_resources}, and for each policy, learner.ranks bundles of {rank_num_cpus, rank_num_gpus, rank_resources},
each read from the settings of the policy the group serves (marl.policies, jobs/config/policies.py); a Tune trial adds
one bundle in front for its driver.
"""

from __future__ import annotations

from cluster.placement import Demand, PlacementError, RunPlacement, bundle, layout, place
from jobs.config.colocation import colocated, colocated_name
from jobs.config.policies import engine_map_of, policy_configs, policy_map_of
from jobs.config.schema import TrainConfig
from marl.engine_map import group_name
from marl.policy_map import PolicyMap

# The config keys a placement failure points the user to.
RESOURCE_KEYS = ("rollout.engines_per_role", "rollout.engine_num_cpus", "rollout.engine_num_gpus",
                 "rollout.engine_resources", "learner.ranks", "learner.rank_num_cpus", "learner.rank_num_gpus",
                 "learner.rank_resources", "ray.placement_strategy")


def run_demands(cfg: TrainConfig, policy_map: PolicyMap) -> list[Demand]:
    """Every engine group's and learner group's members with their per-member resources, each group's from the
    settings of its policy (a multi-LoRA group's from the top level)."""
    configs = policy_configs(cfg, policy_map)
    engines = []
    for spec in engine_map_of(cfg, policy_map).groups:
        r = (configs[spec.policy] if spec.policy is not None else cfg).rollout
        engines.append(Demand(spec.name, r.engines_per_role,
                              {"CPU": r.engine_num_cpus, "GPU": r.engine_num_gpus, **r.engine_resources}))
    # learner.lora_colocate: one group, on the top-level rank settings, holds every policy's adapter on one base.
    groups = ([(colocated_name(cfg), cfg.learner)] if colocated(cfg) else
              [(group_name(cfg.run_name, "learner", pid), configs[pid].learner) for pid in policy_map.policies])
    learners = [Demand(name, lr.ranks, {"CPU": lr.rank_num_cpus, "GPU": lr.rank_num_gpus, **lr.rank_resources})
                for name, lr in groups]
    return [*engines, *learners]


def build_placement(cfg: TrainConfig, policy_map: PolicyMap) -> RunPlacement | None:
    """The run's placement group (or the enclosing Tune trial's), ready before any member starts."""
    try:
        # str(): Ray gets the plain strategy name, not the config's Enum member
        return place(run_demands(cfg, policy_map), str(cfg.ray.placement_strategy), cfg.ray.placement_timeout_s,
                     name=f"{cfg.run_name}:placement")
    except PlacementError as e:
        raise PlacementError(f"{e}\n  (set by {', '.join(RESOURCE_KEYS)})") from None


def trial_bundles(cfg: TrainConfig, driver: dict[str, float]) -> list[dict[str, float]]:
    """A Tune trial's bundles: its driver's, then the run's own layout (what `build_placement` adopts)."""
    return layout(run_demands(cfg, policy_map_of(cfg)), head=driver).bundles


def arithmetic(cfg: TrainConfig, driver: dict[str, float] | None = None) -> str:
    """The run's resource sum, group by group (what `--dry-run` prints):
    `driver 1 x {CPU: 1} + engine:generator 1 x {CPU: 2, GPU: 0.5} + ... = {CPU: 9, GPU: 2.25}`."""
    demands = [d for d in run_demands(cfg, policy_map_of(cfg)) if d.n]
    named = [("driver", 1, bundle(driver))] if driver else []
    named += [(d.name.removeprefix(f"{cfg.run_name}:"), d.n, bundle(d.resources)) for d in demands]
    total: dict[str, float] = {}
    for _, n, res in named:
        for k, v in res.items():
            total[k] = total.get(k, 0.0) + n * v
    return " + ".join(f"{name} {n} x {_fmt(res)}" for name, n, res in named) + f" = {_fmt(total)}"


def _fmt(resources: dict[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(resources.items())) + "}"
