"""Colocated LoRA policies (`learner.lora_colocate`, learners/colocated_group.py) as the run sees them:
when the option applies, what the policies must share, and the name of the one learner group that replaces
their separate ones."""

from __future__ import annotations

from jobs.config.policies import override_keys
from jobs.config.schema import TrainConfig
from learners.gradients.backends import capabilities
from marl.names import group_name

COLOCATED = "colocated"  # the shared learner group's key: `<run>:learner:colocated` (no role has this name)

# What colocated policies share, so none may set it for itself: the base model and its LoRA shape (one module,
# every adapter bound into the same slots) and the ranks that hold it.
SHARED_KEYS = ("model.", "learner.ranks", "learner.rank_num_cpus", "learner.rank_num_gpus",
               "learner.rank_resources.", "learner.gradient_checkpointing", "learner.padding_free")


def colocated(cfg: TrainConfig) -> bool:
    return bool(cfg.learner.lora_colocate)


def colocate_problem(cfg: TrainConfig) -> str | None:
    """Why `learner.lora_colocate` cannot hold this config's policies on one
    base (None: it can, or it is off).
    Refused: full weights (no base to share), shared and custom maps (shared: one
    policy already holds one base;
    custom groupings are left out), DeepSpeed ZeRO-3 (it partitions the module over the ranks inside each
    engine, which several engines over one module cannot share; ZeRO-2 keeps weights whole: one engine per
    policy), and per-policy values of what the policies share (SHARED_KEYS)."""
    if not colocated(cfg):
        return None
    if not cfg.model.lora.enabled:
        return "learner.lora_colocate shares one base among LoRA adapters; set model.lora.enabled=true"
    if cfg.marl.sharing != "isolated":
        return f"learner.lora_colocate needs marl.sharing=isolated; got {cfg.marl.sharing}"
    caps = capabilities(cfg.learner.backend)
    if not caps.lora_colocate:
        return f"learner.backend={cfg.learner.backend} cannot hold learner.lora_colocate policies"
    if caps.zero_stage(cfg.learner.deepspeed.zero_stage) == 3:
        return (
            "learner.deepspeed.zero_stage=3 cannot hold learner.lora_colocate policies: ZeRO-3 partitions "
            "the "
            "shared base inside one engine, and each policy has its own; use learner.deepspeed.zero_stage=2"
        )
    return _shared_override(cfg)


def _shared_override(cfg: TrainConfig) -> str | None:
    """The first per-policy override of a key colocated policies share (SHARED_KEYS; a key ending in "." names
    its whole section), as a refusal; None when there is none."""
    for pid in cfg.marl.policies:
        for key in override_keys(cfg, pid):
            if any(key == k or (k.endswith(".") and key.startswith(k)) for k in SHARED_KEYS):
                return (
                    f"marl.policies.{pid}.{key}: learner.lora_colocate policies share the base model and the "
                    "learner ranks; set it at the top level"
                )
    return None


def colocated_name(cfg: TrainConfig) -> str:
    return group_name(cfg.run_name, "learner", COLOCATED)

