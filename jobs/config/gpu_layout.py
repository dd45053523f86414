"""`rollout.layout=colocated` (the paper's hybrid engine) as the config sees it: which combinations can take
turns on one set of GPUs, and why the others cannot (each refusal names its key).

The layout puts engine i and rank i of every learner group on GPU i of the run (one placement bundle each,
jobs/plan/layout.py), and the driver's step alternates them (jobs/driver/phases.py). So it needs one engine
group (every role served by the same engines), as many ranks in each learner group as there are engines,
GPU shares that add up to one whole GPU per bundle, and a weight sync that works between two processes on
one device.
"""

from __future__ import annotations

from jobs.config.colocation import colocated
from jobs.config.policies import engine_map_of, policy_configs, policy_map_of
from jobs.config.schema import TrainConfig
from learners.gradients.backends import capabilities

# The seam to the weight-transfer engines: under sync.transport=ipc the sync calls cluster.weight_transfer.
# <IPC_SENDER>(learner group, engine groups, version, timeout_s, bucket_bytes) -> its report
IPC_SENDER = "broadcast_ipc"


def is_colocated(cfg: TrainConfig) -> bool:
    return cfg.rollout.layout == "colocated"


def learner_ranks(cfg: TrainConfig) -> list[tuple[str, int, float]]:
    """(the key that sets it, ranks, GPUs per rank) of every learner group: one with learner.lora_colocate,
    else one per policy (a policy's own settings named under marl.policies)."""
    if colocated(cfg):
        return [("learner.ranks", cfg.learner.ranks, cfg.learner.rank_num_gpus)]
    configs = policy_configs(cfg, policy_map_of(cfg))
    out = []
    for pid, pc in configs.items():
        own = pc.learner.ranks != cfg.learner.ranks
        out.append((f"marl.policies.{pid}.learner.ranks" if own else "learner.ranks", pc.learner.ranks,
                    pc.learner.rank_num_gpus))
    return out


def layout_problem(cfg: TrainConfig) -> str | None:
    """Why `rollout.layout=colocated` cannot run this config (None: it can, or the layout is separate)."""
    if not is_colocated(cfg):
        return None
    r = cfg.rollout
    groups = engine_map_of(cfg, policy_map_of(cfg)).groups
    if len(groups) != 1:
        return ("rollout.layout=colocated needs one engine group serving every role (one engine per GPU): "
                f"this config has {len(groups)}; set rollout.lora_serving=multi (LoRA policies) or "
                "marl.sharing=shared with rollout.engine_scope=policy")
    if r.one_step_off_policy:
        return ("rollout.one_step_off_policy needs rollout.layout=separate: colocated engines sleep while "
                "the learners update, so nothing can roll out during the update")
    if r.backend == "vllm" and r.engine_num_gpus <= 0:
        return ("rollout.layout=colocated with rollout.backend=vllm needs rollout.engine_num_gpus > 0: "
                "vLLM's sleep mode is CUDA-only (is_sleep_mode_available); on CPU use rollout.backend=hf")
    if cfg.learner.deepspeed.offload_param or cfg.learner.deepspeed.offload_optimizer:
        key = "offload_param" if cfg.learner.deepspeed.offload_param else "offload_optimizer"
        return (f"learner.deepspeed.{key}: under rollout.layout=colocated the learner moves its states off "
                "the GPU itself between phases (DeepSpeed's offload_states refuses ZeRO-offloaded ones)")
    return _shares_problem(cfg)


def transport_problem(cfg: TrainConfig) -> str | None:
    """Which `sync.transport` can carry weights in this layout (None: this one can). Colocated, learner rank i
    and engine i share a GPU: NCCL refuses two ranks on one device, so there the sync is CUDA IPC (vLLM's IPC
    weight-transfer engine, sync.transport=ipc) on GPUs or the object store (any machine, the CPU path). IPC
    hands a device tensor's handle to another process on the same GPU, so it needs the colocated layout with
    vLLM engines on GPUs."""
    t, r = cfg.sync.transport, cfg.rollout
    if t == "nccl" and is_colocated(cfg):
        return ("sync.transport=nccl cannot run under rollout.layout=colocated: NCCL refuses two ranks on "
                "one GPU (learner rank i and engine i share it); use sync.transport=ipc on GPUs or "
                "object_store")
    if t != "ipc":
        return None
    if not is_colocated(cfg):
        return ("sync.transport=ipc hands CUDA memory to a process on the same GPU: it needs "
                "rollout.layout=colocated (engines on other GPUs: sync.transport=nccl)")
    if r.backend != "vllm" or r.engine_num_gpus <= 0:
        return ("sync.transport=ipc needs rollout.backend=vllm engines on GPUs "
                "(rollout.engine_num_gpus > 0); on CPU use sync.transport=object_store")
    if not ipc_available():
        return ("sync.transport=ipc needs vLLM's IPC weight-transfer engine (cluster.weight_transfer."
                f"{IPC_SENDER}), which this installation lacks; use sync.transport=object_store")
    return _ipc_ranks_problem(cfg)


def _ipc_ranks_problem(cfg: TrainConfig) -> str | None:
    """Every learner rank hands whole weights to the engine on its GPU; a ZeRO-3 rank but rank 0 holds a
    partition (rank 0 keeps the gathered snapshot: learners/gradients/deepspeed_backend.py)."""
    ranks = max(n for _, n, _ in learner_ranks(cfg))
    stage = capabilities(cfg.learner.backend).zero_stage(cfg.learner.deepspeed.zero_stage)
    if stage == 3 and ranks > 1:
        return (f"sync.transport=ipc with learner.deepspeed.zero_stage=3 and {ranks} learner ranks: each "
                "rank hands the engine on its GPU whole weights, and under ZeRO-3 only rank 0 keeps them "
                "gathered; use learner.deepspeed.zero_stage=2 (or one rank)")
    return None


def ipc_available() -> bool:
    """Whether the IPC sender that sync.transport=ipc calls exists (jobs/driver/weight_sync.py)."""
    import importlib

    try:
        module = importlib.import_module("cluster.weight_transfer")
    except ImportError:
        return False
    return callable(getattr(module, IPC_SENDER, None))


def _shares_problem(cfg: TrainConfig) -> str | None:
    """Every learner group's ranks = the engines, and each GPU's members one whole GPU together."""
    r = cfg.rollout
    ranks = learner_ranks(cfg)
    for key, n, _ in ranks:
        if n != r.engines_per_role:
            return (f"{key}={n}: rollout.layout=colocated puts learner rank i on engine i's GPU, so every "
                    f"learner group needs rollout.engines_per_role={r.engines_per_role} ranks")
    gpus = r.engine_num_gpus + sum(g for _, _, g in ranks)
    on_gpu = [r.engine_num_gpus > 0, *(g > 0 for _, _, g in ranks)]
    if any(on_gpu) and not all(on_gpu):
        return ("rollout.engine_num_gpus and learner.rank_num_gpus: under rollout.layout=colocated engines "
                "and learner ranks share GPUs, so both must be > 0 (or both 0 on CPU)")
    if any(on_gpu) and abs(gpus - 1.0) > 1e-9:
        return (f"rollout.engine_num_gpus + learner.rank_num_gpus of every learner group = {gpus:g}: under "
                "rollout.layout=colocated one GPU holds engine i and rank i of each group, so they must add "
                "up to 1 (a whole GPU, which no member of another run may take; memory is shared by turns, "
                "jobs/plan/phases.py)")
    return None
