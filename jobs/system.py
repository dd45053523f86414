"""Builds the running system for one config: a LearnerGroup per policy, an EngineGroup per role, the
Collector, and the weight sync between them. Nothing here branches on shared vs isolated: the policy map
alone decides which learner feeds which engines."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cluster.fingerprint import fingerprint
from cluster.transport import broadcast
from learners.group import LearnerGroup
from marl.policy_map import PolicyMap
from marl.workflows import get_workflow
from marl.workflows.common import WorkflowOptions
from rollout.collector import Collector
from rollout.engine_group import EngineGroup


@dataclass
class System:
    policy_map: PolicyMap
    learners: dict[str, LearnerGroup]
    engines: dict[str, EngineGroup]
    collector: Collector
    sync_timeout_s: float

    def sync(self, version: int) -> dict[str, float]:
        """Push every policy's weights to the engines of its roles; every engine confirms `version` and the
        fingerprint of the weights it now serves."""
        total = {"time/sync_s": 0.0, "sync/bytes": 0.0, "sync/verified": 0.0}
        for pid, learner in self.learners.items():
            dsts = [self.engines[role].group for role in self.policy_map.roles_of(pid)]
            out = broadcast(learner.group, "get_weights", dsts, "load_weights", version, self.sync_timeout_s,
                            fingerprint=fingerprint)
            total["time/sync_s"] += out["sync_s"]
            total["sync/bytes"] += out["bytes"]
            total["sync/verified"] += out["verified"]
        return total

    def shutdown(self) -> None:
        for group in [*self.engines.values(), *self.learners.values()]:
            group.shutdown()


def build_system(cfg: Any, model_path: str, policy_map: PolicyMap, family: Any) -> System:
    temperature = cfg.rollout.sampling.temperature
    learners = {
        pid: LearnerGroup(pid, model_path, cfg.model, cfg.learner, cfg.algo, temperature, cfg.steps,
                          cfg.seed, cfg.run_name)
        for pid in policy_map.policies
    }
    per_role = max(cfg.rollout.engines_per_role, 1)
    engines = {
        role: EngineGroup(role, policy_map[role], model_path, cfg.rollout, cfg.model.dtype, cfg.run_name,
                          first_slot=k * per_role)
        for k, role in enumerate(policy_map.roles)
    }
    get_workflow(cfg.marl.workflow)  # fail before any rollout on an unknown workflow
    options = WorkflowOptions(num_generators=cfg.marl.num_generators, max_rounds=cfg.marl.max_rounds,
                              max_strategies=cfg.marl.max_strategies)
    collector = Collector(engines, cfg.marl.workflow, family, options)
    return System(policy_map, learners, engines, collector, cfg.sync_timeout_s)
