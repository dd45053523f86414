"""What the cluster's GPUs refuse of a run's layout, checked once the driver is connected and the layout read
the cluster's nodes (cluster/gpus.py), before any actor starts: a transport that needs GPUs on a cluster
without any, and a plan that does not fit the GPUs the nodes have. Raised as a ConfigError (exit 2)."""

from __future__ import annotations

from jobs.config import ConfigError
from jobs.plan.planner import refuse_unfit
from jobs.plan.run_layout_record import RunLayout


def cluster_problem(layout: RunLayout) -> str | None:
    """What `layout.gpus` (the cluster's GPUs) cannot hold of `layout`, or None."""
    if layout.cfg.sync.transport == "nccl" and layout.gpus.total <= 0:
        return ("sync.transport=nccl needs GPUs, and the cluster's nodes have none (Ray reports no GPU "
                "resource on any alive node); use sync.transport=object_store")
    return None


def refuse_on_cluster(layout: RunLayout) -> None:
    """ConfigError naming the key when the cluster's GPUs refuse `layout` (`cluster_problem`), or its plan
    does not fit them (jobs/plan/planner.refuse_unfit)."""
    problem = cluster_problem(layout)
    if problem:
        raise ConfigError(f"config: {problem}")
    try:
        refuse_unfit(layout)
    except ValueError as e:  # PlanError, or a model the planner cannot size
        raise ConfigError(f"config: {e}") from None
