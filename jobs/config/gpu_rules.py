"""The GPU layouts a config may ask for, checked at load (each problem names its key; the loader raises it as
a ConfigError, exit 2, before anything starts):

- an engine of more than one GPU: an engine is one vLLM process on one device (the `uni` executor, tensor
  parallel size 1); the other GPUs of its bundle would sit idle, so it is refused until tensor parallelism
  exists;
- `sync.transport=nccl` where it cannot work: NCCL is CUDA-only, so learner rank 0 and every engine must be
  actors that hold GPUs (a member without one would build gloo against the others' NCCL and the channel would
  hang until its timeout), and no two members of one channel may share a device (NCCL refuses two ranks of one
  communicator on one GPU; Ray's fractional GPUs give no guarantee that fractional members land apart).

The weight channel's c10d backend is decided here once (`channel_backend`) and handed to both ends.
Whether the cluster has GPUs at all is a fact of the cluster, checked once the driver is connected
(jobs/plan/cluster_check.py).
"""

from __future__ import annotations

from jobs.config.schema import TrainConfig
from marl.policy_map import PolicyMap


def gpu_problem(cfg: TrainConfig, policy_map: PolicyMap) -> str | None:
    """What is wrong with `cfg`'s GPU layout (a message naming the key), or None."""
    gpus = cfg.rollout.engine_num_gpus
    if gpus > 1:
        return (f"rollout.engine_num_gpus={gpus:g}: an engine is one vLLM process on one GPU (tensor "
                "parallelism is not implemented, so every GPU but one would sit idle); set it to at most 1 "
                "and raise rollout.engines_per_role for more engines")
    if cfg.sync.transport == "nccl":
        return nccl_problem(cfg, policy_map)
    return None


def nccl_problem(cfg: TrainConfig, policy_map: PolicyMap) -> str | None:
    """sync.transport=nccl: learner rank 0 and its engines must be actors on GPUs of their own."""
    r, lr = cfg.rollout, cfg.learner
    if r.engines_per_role == 0 or lr.ranks == 0:
        return ("sync.transport=nccl joins actors on GPUs of their own; in-process members "
                f"(rollout.engines_per_role={r.engines_per_role}, learner.ranks={lr.ranks}) share the "
                "driver's device: set both >= 1 or use sync.transport=object_store")
    if r.engine_num_gpus <= 0 or lr.rank_num_gpus <= 0:
        return ("sync.transport=nccl needs a GPU on both ends (NCCL is CUDA-only; a member without one "
                "would build gloo and the channel would hang): "
                f"rollout.engine_num_gpus={r.engine_num_gpus:g}, "
                f"learner.rank_num_gpus={lr.rank_num_gpus:g}; give both > 0 or use "
                "sync.transport=object_store")
    fractional = _fractional_members(cfg, policy_map)
    if fractional >= 2:
        return ("sync.transport=nccl between members that may share one GPU: "
                f"rollout.engine_num_gpus={r.engine_num_gpus:g} and learner.rank_num_gpus="
                f"{lr.rank_num_gpus:g} put {fractional} members of one weight channel on GPU fractions, "
                "which Ray may place on one device, where NCCL refuses two ranks; give them whole GPUs "
                "or use sync.transport=object_store")
    return None


def _fractional_members(cfg: TrainConfig, policy_map: PolicyMap) -> int:
    """The most members of one policy's channel (rank 0 and its engines) that hold a GPU fraction."""
    r, lr = cfg.rollout, cfg.learner
    groups = 1 if r.engine_scope == "policy" or r.lora_serving == "multi" else max(
        len(policy_map.roles_of(pid)) for pid in policy_map.policies)
    engines = r.engines_per_role * groups if r.engine_num_gpus < 1 else 0
    return engines + (1 if lr.rank_num_gpus < 1 else 0)


def channel_backend(transport: str) -> str:
    """The weight channel's c10d backend, decided once from the config for both ends: nccl for
    sync.transport=nccl (every member holds a GPU: `nccl_problem`). gloo is for tests that form a
    channel by hand on CPU."""
    return "nccl" if transport == "nccl" else "gloo"
