"""What a run asks of the cluster, from its layout (jobs/plan/layout.py: one resource demand per engine
group and learner group), turned into the run's placement group (a standalone run) or a Tune trial's
resource request (a sweep). Both go through the same layout, so a trial's placement group is exactly
what the run inside it looks for;
a Tune trial adds one bundle in front for its driver.
"""

from __future__ import annotations

from cluster.bundles import bundle, layout
from cluster.placement import PlacementError, RunPlacement, place
from jobs.plan.layout import RunLayout

# The config keys a placement failure points the user to.
RESOURCE_KEYS = (
    "rollout.engines_per_role",
    "rollout.engine_num_cpus",
    "rollout.engine_num_gpus",
    "rollout.engine_resources",
    "learner.ranks",
    "learner.rank_num_cpus",
    "learner.rank_num_gpus",
    "learner.rank_resources",
    "ray.placement_strategy",
)


def build_placement(run: RunLayout) -> RunPlacement | None:
    """The run's placement group (or the enclosing Tune trial's), ready before any member starts."""
    cfg = run.cfg
    try:
        # str(): Ray gets the plain strategy name, not the config's Enum member
        return place(run.demands, str(cfg.ray.placement_strategy), cfg.ray.placement_timeout_s,
                     name=f"{cfg.run_name}:placement")
    except PlacementError as e:
        raise PlacementError(f"{e}\n  (set by {', '.join(RESOURCE_KEYS)})") from None


def trial_bundles(run: RunLayout, driver: dict[str, float]) -> list[dict[str, float]]:
    """A Tune trial's bundles: its driver's, then the run's own layout (what `build_placement` adopts)."""
    return layout(run.demands, head=driver).bundles


def arithmetic(run: RunLayout, driver: dict[str, float] | None = None) -> str:
    """The run's resource sum, group by group (what `--dry-run` prints):
    `driver 1 x {CPU: 1} + engine:generator 1 x {CPU: 2, GPU: 0.5} + ... = {CPU: 9, GPU: 2.25}`."""
    demands = [d for d in run.demands if d.n]
    named = [("driver", 1, bundle(driver))] if driver else []
    named += [(d.name.removeprefix(f"{run.cfg.run_name}:"), d.n, bundle(d.resources)) for d in demands]
    total: dict[str, float] = {}
    for _, n, res in named:
        for k, v in res.items():
            total[k] = total.get(k, 0.0) + n * v
    return " + ".join(f"{name} {n} x {_fmt(res)}" for name, n, res in named) + f" = {_fmt(total)}"


def _fmt(resources: dict[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(resources.items())) + "}"
