"""The run's memory plan, from the config alone: every engine and learner rank it places on GPUs, what each
holds at its peak (learners/compute/memory.py, jobs/plan/rollout_estimate.py), which GPU it shares with which,
and whether every GPU fits within `FIT_FRACTION` of the memory declared (`ray.gpu_memory_gb`, or detected).
The run layout (jobs/plan/layout.py) resolves `learner.gradient_checkpointing=auto` with it
(`resolve_checkpointing`), and `python -m jobs.train` and `jobs.sweep` refuse a plan that does not fit
(`refuse_unfit`) before anything starts; `python -m jobs.train --plan` and `python -m jobs.sweep --dry-run`
print it (jobs/plan/report.py).

GPU sharing follows Ray's fractional GPUs: members of one trial take their GPU fractions first-fit, in the
order the run creates them (engines, then learner ranks), a member of one GPU or more takes whole GPUs. Under
rollout.layout=colocated GPU i holds engine i and rank i of every learner group, and its peak is the larger of
its rollout and update phases (jobs/plan/phases.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from omegaconf import OmegaConf

from jobs.config.schema import TrainConfig, as_node
from jobs.models.shape import shape_of
from jobs.plan.phases import GpuPhases, colocated_gpus, gpu_phases, switch_seconds
from jobs.plan.rollout_estimate import (
    ENGINE_RESERVE,
    EXPECTED_FILL,
    EngineMemory,
    RolloutWork,
    engine_memory,
    rollout_seconds,
)
from jobs.plan.run_layout_record import RunLayout
from learners.compute.memory import (
    GIB,
    LearnerMemory,
    LearnerSetup,
    ModelShape,
    colocated_memory,
    learner_memory,
)
from learners.gradients.backends import capabilities
from marl.policy_map import PolicyMap
from marl.workflows import turn_shape, workflow_options
from rollout.config import kv_cache_bytes

FIT_FRACTION = 0.9  # headroom for the allocator's fragmentation and what the estimates leave out
# The memory rises checkpointing, ZeRO, LoRA, the token budget, the engine's share,
# packing and padding_free move.
FIT_KEYS = (
    "learner.max_tokens_per_micro_batch",
    "learner.gradient_checkpointing",
    "learner.deepspeed.zero_stage",
    "model.lora.enabled",
    "rollout.vllm.gpu_memory_utilization",
    "rollout.engine_num_gpus",
    "learner.rank_num_gpus",
    "learner.logits_chunk_tokens",
    "learner.padding_free",
    "rollout.layout",
)
# The learner's measured rate (benchmarks/results/2026-12-04-gpu-check-h200.md: this learner on one H200 at
# prime-rl's four single-GPU baselines, bf16 DeepSpeed ZeRO-2, checkpointing on, 16,384-65,536 tokens per
# sequence, Qwen3-0.6B and 4B, full and LoRA): 0.253-0.291 of the dense bf16 peak in the baselines' FLOP count
# (train_flops_per_token), the median of the four. The H100 has the H200's dense bf16 peak.
LEARNER_MFU = 0.261
BF16_PEAK_FLOPS = 989e12


class PlanError(ValueError):
    """A plan that cannot run: the message names the keys that change it."""


@dataclass(frozen=True)
class Member:
    """One engine or learner rank on the GPUs: its GPU request and its peak bytes."""

    name: str
    gpus: float
    peak: float
    policy: str | None = None  # a learner rank's policy
    learner: LearnerMemory | None = None
    engine: EngineMemory | None = None


@dataclass(frozen=True)
class Plan:
    memory: float  # bytes per GPU; 0 = none declared or detected: nothing is checked
    members: list[Member]
    gpus: list[list[Member]]  # members per GPU
    checkpointing: dict[str, bool]  # policy -> resolved learner.gradient_checkpointing
    # policy -> its rank with checkpointing (on, off)
    either_way: dict[str, tuple[LearnerMemory, LearnerMemory]]
    times: dict[str, float] = field(default_factory=dict)  # rollout_s, update_s, ... per step (estimates)
    # rollout.layout=colocated: each GPU's rollout and update phases (jobs/plan/phases.py); None: separate,
    # every member resident at its peak at once
    phases: list[GpuPhases] | None = None

    def gpu_bytes(self) -> list[float]:
        if self.phases is not None:
            return [p.peak for p in self.phases]
        return [sum(m.peak * member_share(m) for m in members) for members in self.gpus]

    def fits(self) -> bool:
        return not self.memory or all(b <= FIT_FRACTION * self.memory for b in self.gpu_bytes())


def member_share(m: Member) -> float:
    """The part of a member's peak on each GPU it takes (a member of several GPUs spreads over them)."""
    return 1.0 / m.gpus if m.gpus > 1 else 1.0


def gpu_memory(layout: RunLayout) -> float:
    """Bytes per GPU: `ray.gpu_memory_gb`, else the cluster's nodes' (the smallest of their GPUs, by device or
    accelerator type: cluster/gpus.py), 0 when unknown or when the run asks for no GPU (a CPU run is never
    checked)."""
    cfg = layout.cfg
    if not _uses_gpus(layout):
        return 0.0
    declared = OmegaConf.select(as_node(cfg), "ray.gpu_memory_gb", default=0.0)
    if declared:
        return float(declared) * GIB
    return layout.gpus.memory_per_gpu()


def _uses_gpus(layout: RunLayout) -> bool:
    return any(c.learner.rank_num_gpus > 0 or c.rollout.engine_num_gpus > 0
               for c in [layout.cfg, *layout.configs.values()])


def make_plan(layout: RunLayout, memory: float | None = None, checkpointing: dict[str, bool] | None = None,
              times: bool = True) -> Plan:
    """The plan of a run's layout; `checkpointing` (policy -> on) in place of the layout's; `times`: with the
    step-time estimates (what the fit check does not need)."""
    memory = gpu_memory(layout) if memory is None else memory
    cfg, policy_map, configs = layout.cfg, layout.policy_map, layout.configs
    ckpt = dict(layout.checkpointing) | (checkpointing or {})
    members = _engine_members(layout, memory)
    either_way = {}
    for pid, pc in configs.items():
        shape, roles = shape_of(pc.model.path), policy_map.roles_of(pid)
        mem = learner_memory(shape, learner_setup(pc, len(roles), ckpt[pid]))
        either_way[pid] = (learner_memory(shape, learner_setup(pc, len(roles), True)),
                           learner_memory(shape, learner_setup(pc, len(roles), False)))
        if not layout.colocated:
            members += [Member(f"learner:{pid}#{r}", pc.learner.rank_num_gpus, mem.total(), pid, learner=mem)
                        for r in range(max(pc.learner.ranks, 1))]
    if layout.colocated:
        colocated, either_way[policy_map.policies[0]] = _colocated_members(cfg, configs, policy_map, ckpt)
        members += colocated
    on_gpu = times and any(m.gpus > 0 and m.engine is not None for m in members)  # the time model is a GPU's
    times_ = step_times(layout, members) if on_gpu else {}
    if cfg.rollout.layout != "colocated":
        return Plan(memory, members, pack(members), ckpt, either_way, times_)
    if times_:  # the phase switches: engine weights and learner states to host memory and back
        times_["switch_s"] = switch_seconds(members)
        times_["step_s"] += times_["switch_s"]
        times_["step_s_at_caps"] += times_["switch_s"]
    gpus = colocated_gpus(members)
    return Plan(memory, members, gpus, ckpt, either_way, times_, [gpu_phases(g) for g in gpus])


def _colocated_members(cfg: TrainConfig, configs: Mapping[str, TrainConfig], policy_map: PolicyMap,
                       ckpt: dict[str, bool]) -> tuple[list[Member], tuple[LearnerMemory, LearnerMemory]]:
    """learner.lora_colocate: one base and every policy's adapter on each rank of one group (named
    after the first policy in the plan's per-policy tables, whose base and ranks every policy shares).
    Returns the group's members and a rank's memory with checkpointing on and off (the first policy's
    entry of `Plan.either_way`)."""
    first, shape = policy_map.policies[0], shape_of(cfg.model.path)

    def rank(on: bool) -> LearnerMemory:
        return colocated_memory(shape, [learner_setup(pc, len(policy_map.roles_of(pid)), on)
                                        for pid, pc in configs.items()])
    mem = rank(ckpt[first])
    members = [Member(f"learner:colocated#{r}", cfg.learner.rank_num_gpus, mem.total(), first, learner=mem)
               for r in range(max(cfg.learner.ranks, 1))]
    return members, (rank(True), rank(False))


def learner_setup(pc: TrainConfig, roles: int, checkpointing: bool) -> LearnerSetup:
    """A policy's learner rank as the memory model sees it: the token budget (or rows × algo.max_len without
    one), padded or packed alike; packing changes the attention masks
    (learners.compute.memory.mask_entries)."""
    lr = pc.learner
    tokens = lr.max_tokens_per_micro_batch or lr.micro_batch_size * pc.algo.max_len
    return LearnerSetup(
        tokens=tokens,
        lora_rank=pc.model.lora.rank if pc.model.lora.enabled else 0,
        zero_stage=capabilities(lr.backend).zero_stage(lr.deepspeed.zero_stage), ranks=max(lr.ranks, 1),
        checkpointing=checkpointing, logits_chunk=lr.logits_chunk_tokens,
        role_rows=roles if lr.role_grad_diagnostics else 0, device="gpu" if lr.rank_num_gpus > 0 else "cpu",
        padding_free=lr.padding_free, longest_row=pc.algo.max_len,
        sync_bucket_bytes=pc.sync.bucket_mb << 20 if pc.sync.transport in ("nccl", "ipc") else 0)


def longest_sequence(cfg: TrainConfig) -> int:
    """A cell's longest sequence in an engine: prompt cap + response cap
    (algo.max_len without a prompt cap)."""
    r = cfg.rollout
    return r.max_prompt_tokens + r.sampling.max_new_tokens if r.max_prompt_tokens else cfg.algo.max_len


def _engine_members(layout: RunLayout, memory: float) -> list[Member]:
    """Every engine of every engine group, on its share of a GPU (or, on CPU, its KV cache plus weights)."""
    out = []
    for spec in layout.engine_map.groups:
        pc = layout.engine_config(spec.policy)
        shape, r = shape_of(pc.model.path), pc.rollout
        adapters = len(spec.policies) if spec.multi_lora else 0
        share = engine_share(r.vllm.kv_cache_gb, r.vllm.gpu_memory_utilization, r.engine_num_gpus > 0, shape,
                             memory)
        mem = engine_memory(shape, share, pc.model.lora.rank, adapters, longest_sequence(pc))
        out += [Member(f"engine:{spec.key}#{i}", r.engine_num_gpus, mem.share, engine=mem)
                for i in range(max(r.engines_per_role, 1))]
    return out


def engine_share(kv_cache_gb: float | None, utilization: float, on_gpu: bool, shape: ModelShape,
                 memory: float) -> float:
    """An engine's bytes as the engine sizes itself (rollout.config.kv_cache_bytes, which the engine reads
    too): a set KV cache plus weights and the reserve, else `utilization` of the GPU's `memory`."""
    kv = kv_cache_bytes(kv_cache_gb, on_gpu)
    if kv is None:
        return utilization * memory
    return kv + 2.0 * shape.params() + ENGINE_RESERVE


def pack(members: list[Member]) -> list[list[Member]]:
    """Members onto GPUs: fractions first-fit in creation order, whole GPUs for a member of one or more."""
    gpus: list[list[Member]] = []
    free: list[float] = []
    for m in members:
        if m.gpus <= 0:
            continue
        if m.gpus >= 1:
            for _ in range(math.ceil(m.gpus)):
                gpus.append([m])
                free.append(0.0)
            continue
        i = next((i for i, f in enumerate(free) if f + 1e-9 >= m.gpus), None)
        if i is None:
            gpus.append([])
            free.append(1.0)
            i = len(gpus) - 1
        gpus[i].append(m)
        free[i] -= m.gpus
    return gpus


def role_turns(layout: RunLayout) -> tuple[dict[str, int], int]:
    """(role -> its turns in one episode at the caps, how many turns run one after another), as the run's
    workflow declares them for its options (marl/workflows/turns.py)."""
    m = layout.cfg.marl
    shape = turn_shape(m.workflow, workflow_options(m.workflow, m, m.options))
    return dict(shape.per_role), shape.sequential


def step_times(layout: RunLayout, members: list[Member]) -> dict[str, float]:
    """Estimated seconds per step: at EXPECTED_FILL of the caps, and (`*_at_caps`)
    with every turn at its caps."""
    return {**_step_times(layout, members, EXPECTED_FILL),
            **{f"{k}_at_caps": v for k, v in _step_times(layout, members, 1.0).items() if "/" not in k}}


def step_seconds_at(layout: RunLayout, members: list[Member], fill: float) -> float:
    """One step's estimated seconds with each turn's prompt and response at `fill` of their caps."""
    return _step_times(layout, members, fill)["step_s"]


def _step_times(layout: RunLayout, members: list[Member], fill: float) -> dict[str, float]:
    """Rollout (jobs/plan/rollout_estimate.py) and every policy's update at the measured learner rate
    scaled by FLOPs, each turn's prompt and response at `fill` of their caps; policies update at once:
    the step waits the longest."""
    per_role, sequential = role_turns(layout)
    cfg, policy_map = layout.cfg, layout.policy_map
    r = cfg.rollout
    prompt = (r.max_prompt_tokens or cfg.algo.max_len - r.sampling.max_new_tokens) * fill
    work = RolloutWork(r.prompts_per_step * r.samples_per_prompt, sum(per_role.values()), sequential, prompt,
                       r.sampling.max_new_tokens * fill)
    engines = [m.engine for m in members if m.engine is not None]
    kv = min(e.kv for e in engines) if engines else 0.0
    out = rollout_seconds(shape_of(cfg.model.path), work, max(len(engines), 1), kv)
    for pid, pc in layout.configs.items():
        rows = work.episodes * sum(per_role.get(role, 1) for role in policy_map.roles_of(pid))
        tokens = rows * (work.prompt_tokens + work.response_tokens)
        sequence = work.prompt_tokens + work.response_tokens
        out[f"update_s/{pid}"] = update_seconds(shape_of(pc.model.path), pc, tokens, sequence,
                                                layout.checkpointing[pid])
    out["update_s"] = max(v for k, v in out.items() if k.startswith("update_s/"))
    out["step_s"] = out["rollout_s"] + out["update_s"]
    return out


def update_seconds(shape: ModelShape, pc: TrainConfig, tokens: float, sequence: float,
                   checkpointing: bool) -> float:
    """One step's update of `tokens` trained tokens in rows of `sequence` tokens on the policy's ranks."""
    return learner_seconds(shape, tokens, sequence, pc.model.lora.enabled, checkpointing,
                           pc.algo.old_logprobs == "recompute", pc.learner.ranks)


def train_flops_per_token(shape: ModelShape, sequence: float) -> float:
    """A trained token's FLOPs as the measured rate counts them (prime-rl's MFU count): 6 per weight (forward
    and backward, the LM head included) plus causal attention's 6·L·n_q·d·T in a row of T tokens (QKᵀ and AV,
    forward and backward, half of T² causal)."""
    return 3.0 * shape.flops_per_token() + 6.0 * shape.layers * shape.heads * shape.head_dim * sequence


def learner_seconds(shape: ModelShape, tokens: float, sequence: float, lora: bool, checkpointing: bool,
                    recompute: bool, ranks: int) -> float:
    """Seconds of `tokens` trained tokens (rows of `sequence` tokens) on `ranks` ranks at LEARNER_MFU,
    measured with checkpointing and no recomputed old log-probs; other settings scale by their passes (a LoRA
    backward skips the weight gradients: forward + backward 2 forwards' work, full fine-tuning 3;
    checkpointing and the recomputed old log-probs one forward each)."""
    base = 2.0 if lora else 3.0
    passes = (base + checkpointing * 1.0 + recompute * 1.0) / (base + 1.0)
    flops = tokens * train_flops_per_token(shape, sequence) * passes
    return flops / (LEARNER_MFU * BF16_PEAK_FLOPS * max(ranks, 1))


def resolve_checkpointing(layout: RunLayout) -> dict[str, bool]:
    """Each policy's `learner.gradient_checkpointing`, `auto` resolved (the layout's own values are the
    configured ones, auto as off): on where its GPU would not fit without it, off where it would and on runs
    with no GPU memory to plan against. Policies that take the top level's learner settings share one
    resolution, as they share those settings (on if any of them needs it). ValueError: a model the planner
    cannot size."""
    auto = [pid for pid, pc in layout.configs.items() if pc.learner.gradient_checkpointing is None]
    memory = gpu_memory(layout)
    on: set[str] = set()
    if memory and auto:
        plan = make_plan(layout, memory, dict.fromkeys(auto, False), times=False)
        while (pid := _next_to_checkpoint(plan, auto, on)) is not None:
            on.add(pid)
            plan = make_plan(layout, memory, {p: p in on for p in auto}, times=False)
    inheriting = [pid for pid in auto if pid not in layout.cfg.marl.policies]
    shared = any(pid in on for pid in inheriting)
    return dict(layout.checkpointing) | {pid: shared if pid in inheriting else pid in on for pid in auto}


def refuse_unfit(layout: RunLayout) -> None:
    """PlanError unless the layout's plan fits its GPUs (a run with no GPU memory to plan against is never
    refused), or when the planner cannot size its model."""
    try:
        memory = gpu_memory(layout)
        if memory:
            check(make_plan(layout, memory, times=False))
    except PlanError:
        raise
    except ValueError as e:
        raise PlanError(str(e)) from None


def _next_to_checkpoint(plan: Plan, auto: list[str], on: set[str]) -> str | None:
    """On an overfull GPU, the auto policy not yet checkpointing whose learner
    checkpointing saves the most."""
    candidates = {
        m.policy: plan.either_way[m.policy][1].total() - m.peak
        for gpu in overfull(plan)
        for m in gpu
        if m.policy in auto and m.policy not in on
    }
    return max(candidates, key=lambda p: candidates[p]) if candidates else None


def overfull(plan: Plan) -> list[list[Member]]:
    return [gpu for gpu, b in zip(plan.gpus, plan.gpu_bytes(), strict=True) if b > FIT_FRACTION * plan.memory]


def check(plan: Plan) -> None:
    """PlanError unless every GPU holds at most FIT_FRACTION of its memory and
    every engine one whole sequence."""
    for m in plan.members:
        if m.engine is not None and m.gpus > 0 and m.engine.kv_sequences < 1:
            raise PlanError(
                f"{m.name}: its share ({m.engine.share / GIB:.1f} GiB) leaves {m.engine.kv / GIB:.1f} GiB "
                "of KV cache, less than one sequence of the longest prompt and response: raise "
                "rollout.vllm.gpu_memory_utilization or lower rollout.max_prompt_tokens"
            )
    for gpu, used in zip(plan.gpus, plan.gpu_bytes(), strict=True):
        if used <= FIT_FRACTION * plan.memory:
            continue
        held = " + ".join(f"{m.name} {m.peak * member_share(m) / GIB:.1f}" for m in gpu)
        if plan.phases is not None:  # colocated: the larger phase
            phase = plan.phases[plan.gpus.index(gpu)]
            held = (f"rollout phase {phase.rollout / GIB:.1f}, update phase {phase.update / GIB:.1f} "
                    f"(of {held})")
        raise PlanError(
            f"the plan does not fit {plan.memory / GIB:g} GiB GPUs (ray.gpu_memory_gb; at most "
            f"{FIT_FRACTION:.0%} of it planned): one GPU holds {held} GiB = {used / GIB:.1f} GiB; change "
            f"{', '.join(FIT_KEYS)} (`python -m jobs.train --plan` shows every term)"
        )
