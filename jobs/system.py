"""Builds the running system for one config: a LearnerGroup per policy, the EngineGroups (one per role, one
per policy, or one multi-LoRA group for all), the Collector, and the weight sync between them. Nothing here
branches on shared vs isolated: the policy map alone decides which learner feeds which engines."""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from omegaconf import OmegaConf

from cluster.fingerprint import fingerprint
from cluster.nccl import broadcast_nccl, connect
from cluster.placement import RunPlacement
from cluster.transport import broadcast
from jobs.policies import engine_map_of, model_paths, policy_configs
from jobs.resources import build_placement
from learners.group import LearnerGroup
from marl.engine_map import EngineMap, group_name
from marl.policy_map import PolicyMap
from marl.rewards import load_shaping
from marl.workflows import get_workflow, roles_of
from marl.workflows.common import WorkflowOptions
from rollout.collector import Collector
from rollout.engine_group import EngineGroup
from rollout.lora import adapter_fingerprint, merged_fingerprint


@dataclass
class System:
    policy_map: PolicyMap
    learners: dict[str, LearnerGroup]
    engines: dict[str, EngineGroup]
    collector: Collector
    sync_timeout_s: float
    placement: RunPlacement | None = None  # the run's placement group; released after its members
    transport: str = "object_store"  # sync.transport
    bucket_bytes: int = 256 << 20  # sync.bucket_mb, for nccl
    version: int = 0  # the weight version the engines serve (what a replaced engine is caught up to)
    channels_ready: bool = False  # nccl: channels are formed on the first sync and after a replacement
    # LoRA policies served merged whose syncs ship adapters, each engine merging them (sync.lora_delta)
    lora_deltas: set[str] = field(default_factory=set)

    def engine_groups(self, policy_id: str | None = None) -> list[EngineGroup]:
        """Distinct engine groups (of one policy's roles): a group serving several roles counts once."""
        roles = self.policy_map.roles_of(policy_id) if policy_id is not None else self.policy_map.roles
        return list({id(self.engines[r]): self.engines[r] for r in roles}.values())

    def sync(self, version: int) -> dict[str, float]:
        """Push every policy's weights (or LoRA adapter) once to each engine group serving its roles; every
        engine confirms `version` and the fingerprint of the weights it now serves."""
        if self.transport == "nccl" and not self.channels_ready:
            for pid, learner in self.learners.items():
                connect(learner.group, [e.group for e in self.engine_groups(pid)], self.sync_timeout_s)
            self.channels_ready = True
        # Policies sync concurrently: each one's engines wait for their own weights only, not for the other
        # policies' broadcasts (a multi-LoRA group takes its adapters one call at a time, as ever).
        t0 = time.perf_counter()
        pids = list(self.learners)
        with ThreadPoolExecutor(max_workers=len(pids), thread_name_prefix="sync") as pool:
            outs = list(pool.map(lambda pid: self._sync_policy(pid, self.engine_groups(pid), version), pids))
        self.version = version
        out = {"time/sync_s": time.perf_counter() - t0, "sync/bytes": float(sum(o["bytes"] for o in outs)),
               "sync/verified": float(sum(o["verified"] for o in outs))}
        for pid in pids:  # merged serving: how much of each LoRA update the serving dtype kept
            if not self.engine_groups(pid)[0].multi_lora:
                out.update(self.learners[pid].sync_metrics())
        return out

    def _sync_policy(self, pid: str, engines: list[EngineGroup], version: int,
                     indices: list[int] | None = None) -> dict[str, float]:
        src, dsts, timeout = self.learners[pid].group, [e.group for e in engines], self.sync_timeout_s
        if engines[0].multi_lora:  # adapters are small: always through the object store
            return broadcast(src, "get_adapter", dsts, "load_adapter", version, timeout,
                             fingerprint=adapter_fingerprint, indices=indices)
        if self.transport == "nccl" and indices is None:
            return broadcast_nccl(src, dsts, version, timeout, fingerprint, self.bucket_bytes)
        if pid in self.lora_deltas and self.transport == "object_store":
            # Merged serving of a LoRA policy: the adapter travels, each engine merges it into its own base.
            return broadcast(src, "get_lora_delta", dsts, "load_lora_delta", version, timeout,
                             fingerprint=merged_fingerprint, indices=indices)
        return broadcast(src, "get_packed_weights", dsts, "load_weights", version, timeout, fingerprint=fingerprint,
                         indices=indices)

    def resync_member(self, engines: EngineGroup, index: int) -> None:
        """Catch a replaced engine up to the current version (object store, fingerprint-checked)."""
        for pid in engines.policies:
            self._sync_policy(pid, [engines], self.version, indices=[index])
        self.channels_ready = False  # an NCCL channel's members are fixed: form them anew before the next sync

    def shutdown(self) -> None:
        for group in [*self.engine_groups(), *self.learners.values()]:
            group.shutdown()
        if self.placement is not None:
            self.placement.release()


def build_system(cfg: Any, model_path: str | Mapping[str, str], policy_map: PolicyMap, family: Any) -> System:
    """`model_path`: each policy's model folder, or one folder for the policies on the top-level `model.path`
    (others, set in marl.policies, are resolved here)."""
    paths = dict(model_path) if isinstance(model_path, Mapping) else model_paths(cfg, policy_map, model_path)
    placement = build_placement(cfg, policy_map)  # all bundles reserved before any member starts
    try:
        return _build_groups(cfg, paths, policy_map, family, placement)
    except BaseException:
        if placement is not None:
            placement.release()  # also ends the members already started in it
        raise


def _build_groups(cfg: Any, paths: dict[str, str], policy_map: PolicyMap, family: Any,
                  placement: RunPlacement | None) -> System:
    def bundles(name: str):
        return placement.group(name) if placement is not None else None

    temperature = cfg.rollout.sampling.temperature
    configs = policy_configs(cfg, policy_map)  # each policy's own model, learner and engine settings
    learners = {
        pid: LearnerGroup(pid, paths[pid], pc.model, pc.learner, cfg.algo, temperature, cfg.steps, cfg.seed,
                          cfg.run_name, placement=bundles(group_name(cfg.run_name, "learner", pid)))
        for pid, pc in configs.items()
    }
    engines = _engine_groups(cfg, configs, paths, engine_map_of(cfg, policy_map), bundles)
    get_workflow(cfg.marl.workflow)  # fail before any rollout on an unknown workflow
    options = WorkflowOptions(num_generators=cfg.marl.num_generators, max_rounds=cfg.marl.max_rounds,
                              max_strategies=cfg.marl.max_strategies, prompts=cfg.marl.prompts)
    shaping = load_shaping(cfg.marl.reward_shaping, roles_of(cfg.marl.workflow))
    collector = Collector(engines, cfg.marl.workflow, family, options, shaping)
    system = System(policy_map, learners, engines, collector, cfg.sync_timeout_s, placement, cfg.sync.transport,
                    cfg.sync.bucket_mb << 20, lora_deltas=_lora_delta_policies(cfg, configs))
    for group in system.engine_groups():
        group.resync = functools.partial(system.resync_member, group)
    return system


def _lora_delta_policies(cfg: Any, configs: dict[str, Any]) -> set[str]:
    return {pid for pid, pc in configs.items() if pc.model.lora.enabled and cfg.sync.lora_delta}


def _engine_groups(cfg: Any, configs: dict[str, Any], paths: dict[str, str], engine_map: EngineMap,
                   bundles: Any) -> dict[str, EngineGroup]:
    """role -> its EngineGroup; roles of one group (engine_scope=policy, multi-LoRA) share the object. Each group
    serves its policy's model with that policy's engine settings; the multi-LoRA group the top-level model."""
    out: dict[str, EngineGroup] = {}
    slot = 0
    for spec in engine_map.groups:
        if spec.policy is None:  # multi-LoRA: every role, one base model, adapters up to the largest rank
            pc, path = cfg, paths[spec.policies[0]]
            lora_rank = max(c.model.lora.rank for c in configs.values())
        else:
            pc, path, lora_rank = configs[spec.policy], paths[spec.policy], configs[spec.policy].model.lora.rank
        group = EngineGroup(spec, path, pc.rollout, pc.model.dtype, first_slot=slot, placement=bundles(spec.name),
                            lora_rank=lora_rank, weight_channel=cfg.sync.transport == "nccl",
                            # plain values: they travel to Ray actors
                            chat_template_kwargs=OmegaConf.to_container(pc.model.chat_template_kwargs))
        slot += max(pc.rollout.engines_per_role, 1)
        out.update(dict.fromkeys(spec.roles, group))
    return out
