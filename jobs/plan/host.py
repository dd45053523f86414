"""The host's memory on a run whose members all live on one machine (the embedded local cluster, or a
one-node cluster whose node is this machine): the CPU members' planned peaks plus what Ray and the driver
hold, against the machine's memory. Ray's memory monitor kills a worker once the host's memory passes
MONITOR_FRACTION, so a run planned close to it dies when anything else runs beside it: the plan says so, and
`jobs.train` prints it at start. A warning, not a refusal: a CPU learner is planned at its worst case
(every micro-batch of `learner.micro_batch_size` rows at `algo.max_len`), which short rollouts never reach.

GPU members are not counted here: their memory is the GPUs' (jobs/plan/planner.py). The host memory that
colocated phases offload to (engine weights, learner states) is not planned yet.
"""

from __future__ import annotations

import os
import sys

from jobs.config.schema import TrainConfig
from jobs.plan.planner import Plan, make_plan
from jobs.plan.run_layout_record import RunLayout
from learners.compute.memory import GIB

# Ray's daemons (GCS, raylet, dashboard, log monitor: ~0.8 GiB) and the driver (the trial's ~1.5 GiB, the
# sweep's 0.4), as their resident sizes summed on a 2-core CPU run of one engine and one learner.
HOST_OVERHEAD = 2.0 * GIB
# Ray's memory monitor's default threshold (RAY_memory_usage_threshold): above it, it kills a worker.
MONITOR_FRACTION = 0.95
WARN_FRACTION = 0.8
# What lowers a CPU run's memory, most first.
HOST_KEYS = ("rollout.vllm.kv_cache_gb", "learner.gradient_checkpointing",
             "learner.max_tokens_per_micro_batch", "learner.micro_batch_size")


def host_planned(plan: Plan) -> float:
    """Bytes the host holds: every CPU member's peak, plus HOST_OVERHEAD (0 with no CPU member)."""
    cpu = [m.peak for m in plan.members if m.gpus <= 0]
    return sum(cpu) + HOST_OVERHEAD if cpu else 0.0


def this_host_memory(address: str | None) -> float:
    """This machine's memory in bytes when the run's members all live on it, else 0 (not checked): Ray
    connected to one alive node that is this machine, or not connected and no cluster address given (the run
    will start an embedded cluster here)."""
    import psutil  # Ray's own dependency

    ray = sys.modules.get("ray")  # not imported for a plan that never connects
    if ray is not None and ray.is_initialized():
        alive = [n for n in ray.nodes() if n.get("Alive")]
        if len(alive) != 1 or alive[0].get("NodeManagerAddress") != ray.util.get_node_ip_address():
            return 0.0
    elif address or os.environ.get("RAY_ADDRESS"):
        return 0.0
    return float(psutil.virtual_memory().total)


def host_line(planned: float, total: float) -> str:
    """The plan's host-memory line ("" with no CPU member); a warning above WARN_FRACTION of `total`, naming
    what lowers it; `total` 0: not checked."""
    if not planned:
        return ""
    if not total:
        return f"host: {planned / GIB:.1f} GiB planned; not checked (the members may spread over nodes)"
    share = planned / total
    line = (f"host: {planned / GIB:.1f} GiB planned (the CPU members, and Ray and the driver "
            f"{HOST_OVERHEAD / GIB:.1f}) of this machine's {total / GIB:.1f} GiB ({share:.0%})")
    if share <= WARN_FRACTION:
        return line
    risk = ("over the" if share > MONITOR_FRACTION else "close to the")
    return (f"{line}: WARNING, {risk} {MONITOR_FRACTION:.0%} at which Ray's memory monitor kills a worker; "
            f"run nothing else beside it, or lower it with {', '.join(HOST_KEYS)}")


def host_warning(plan: Plan, total: float) -> str | None:
    """`host_line` when it warns (the plan above WARN_FRACTION of `total`), else None."""
    planned = host_planned(plan)
    return host_line(planned, total) if total and planned > WARN_FRACTION * total else None


def warn_host(cfg: TrainConfig, layout: RunLayout) -> None:
    """At a run's start, once connected (Ray knows the nodes): prints `host_warning`, if any."""
    try:
        plan = make_plan(layout, times=False)
    except ValueError:  # a model the planner cannot size: on GPUs refuse_unfit has said so already
        return
    if warning := host_warning(plan, this_host_memory(cfg.ray.address)):
        print(f"[{cfg.run_name}] {warning}", flush=True)
