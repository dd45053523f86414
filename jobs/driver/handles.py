"""The run's handles, built from its layout (jobs/plan/layout.py): a LearnerGroup per policy, the EngineGroups
(one per role, one per policy, or one multi-LoRA group for all), the Collector, and the weight sync between
them, in the run's placement group. Nothing here branches on shared vs isolated: the policy map alone decides
which learner feeds which engines."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import cast

from omegaconf import DictConfig, OmegaConf

from cluster.placement import GroupPlacement, RunPlacement
from jobs.config.gpu_rules import channel_backend
from jobs.config.schema import TrainConfig
from jobs.driver.phases import Phases
from jobs.driver.resources import build_placement
from jobs.driver.weight_sync import WeightSync, resync_through, sync_all
from jobs.models.resolve import resolve_model
from jobs.plan.layout import RunLayout
from learners.colocated_group import colocated_groups
from learners.group import LearnerGroup
from learners.member import LearnerSpec
from marl.policy_map import PolicyMap
from marl.rewards import load_shaping
from marl.tasks import TaskFamily
from marl.workflows import roles_of, workflow_options
from rollout.collector import Collector
from rollout.engine_group import EngineGroup, Resync


@dataclass
class RunHandles:
    """What a run holds while it runs: its groups, the collector over them, the syncs
    between them; shut down once."""

    policy_map: PolicyMap  # the layout's own
    learners: dict[str, LearnerGroup]
    engines: dict[str, EngineGroup]
    collector: Collector
    syncs: dict[str, WeightSync]  # policy -> its learner's sync to the engines serving its roles
    placement: RunPlacement | None = None  # the run's placement group; released after its members
    # rollout.layout=colocated: the step's sleep / reload / offload / wake calls (no-ops when separate)
    phases: Phases = field(default_factory=lambda: Phases([], {}, active=False))

    def engine_groups(self, policy_id: str | None = None) -> list[EngineGroup]:
        """Distinct engine groups (of one policy's roles): a group serving several roles counts once."""
        return _distinct_groups(self.engines, self.policy_map, policy_id)

    def sync(self, version: int) -> dict[str, float]:
        """Push every policy's weights (or LoRA adapter) once to each engine group serving its roles; every
        engine confirms `version` and the fingerprint of the weights it now serves
        (jobs/driver/weight_sync.py)."""
        return sync_all(self.syncs, version)

    def weight_versions(self) -> dict[str, int]:
        """policy -> the version its engines serve (the last sync's)."""
        return {pid: sync.version for pid, sync in self.syncs.items()}

    def shutdown(self) -> None:
        groups: list[EngineGroup | LearnerGroup] = [*self.engine_groups(), *self.learners.values()]
        for group in groups:
            group.shutdown()
        if self.placement is not None:
            self.placement.release()


def build_handles(layout: RunLayout, model_path: str | Mapping[str, str], family: TaskFamily) -> RunHandles:
    """`model_path`: each policy's model folder, or one folder for the policies on the top-level `model.path`
    (others, set in marl.policies, are resolved here)."""
    paths = dict(model_path) if isinstance(model_path, Mapping) else model_paths(layout, model_path)
    placement = build_placement(layout)  # all bundles reserved before any member starts
    try:
        handles = _build_groups(layout, paths, family, placement)
        handles.phases.offload_learners()  # colocated: the first rollout runs with the states away
        return handles
    except BaseException:
        if placement is not None:
            placement.release()  # also ends the members already started in it
        raise


def model_paths(layout: RunLayout, default: str | None = None) -> dict[str, str]:
    """policy -> its local model folder. Policies on the top-level `model.path` get `default` when given
    (already resolved); others are resolved here (built-ins are built once and cached). ValueError/OSError
    name the policy's key."""
    cfg, out = layout.cfg, {}
    for pid, pc in layout.configs.items():
        if default is not None and pc.model.path == cfg.model.path:
            out[pid] = default
            continue
        try:
            out[pid] = resolve_model(pc.model.path)
        except (ValueError, OSError) as e:
            key = "model.path" if pc.model.path == cfg.model.path else f"marl.policies.{pid}.model.path"
            raise type(e)(f"{key}: {e}") from None
    return out


def _build_groups(layout: RunLayout, paths: dict[str, str], family: TaskFamily,
                  placement: RunPlacement | None) -> RunHandles:
    def bundles(name: str) -> GroupPlacement | None:
        return placement.group(name) if placement is not None else None

    cfg, policy_map, configs = layout.cfg, layout.policy_map, layout.configs
    learners = _learner_groups(layout, paths, bundles)
    syncs: dict[str, WeightSync] = {}  # read by the engines' resync; filled once the engine groups exist
    engines = _engine_groups(layout, paths, bundles, resync_through(syncs))
    syncs.update({
        pid: WeightSync(learners[pid], _distinct_groups(engines, policy_map, pid), cfg.sync.transport,
                        cfg.sync.bucket_mb << 20, cfg.sync_timeout_s,
                        lora_delta=pc.model.lora.enabled and cfg.sync.lora_delta,
                        channel_backend=channel_backend(cfg.sync.transport))
        for pid, pc in configs.items()
    })
    # Fails before any rollout on an unknown workflow or a bad option.
    options = workflow_options(cfg.marl.workflow, cfg.marl, cfg.marl.options)
    shaping = load_shaping(cfg.marl.reward_shaping, roles_of(cfg.marl.workflow))
    collector = Collector(engines, cfg.marl.workflow, family, options, shaping, mode=cfg.rollout.mode)
    phases = Phases(_distinct_groups(engines, policy_map), learners, active=cfg.rollout.layout == "colocated")
    return RunHandles(policy_map, learners, engines, collector, syncs, placement, phases)


def _learner_groups(layout: RunLayout, paths: dict[str, str],
                    bundles: Callable[[str], GroupPlacement | None]) -> dict[str, LearnerGroup]:
    """policy -> its LearnerGroup: each on ranks of its own, or all on one colocated
    base (learner.lora_colocate)."""
    cfg = layout.cfg
    specs = [_learner_spec(layout, pid, paths[pid], pc) for pid, pc in layout.configs.items()]
    if layout.colocated:  # every policy names the one shared group
        name = layout.learner_groups[layout.policy_map.policies[0]]
        return colocated_groups(specs, cfg.run_name, name, placement=bundles(name))
    return {s.policy_id: LearnerGroup(s, cfg.run_name, placement=bundles(layout.learner_groups[s.policy_id]))
            for s in specs}


def _distinct_groups(engines: Mapping[str, EngineGroup], policy_map: PolicyMap,
                     policy_id: str | None = None) -> list[EngineGroup]:
    roles = policy_map.roles_of(policy_id) if policy_id is not None else policy_map.roles
    return list({id(engines[r]): engines[r] for r in roles}.values())


def _plain(section: Mapping[str, object]) -> dict[str, object]:
    """A mapping section as plain values: they travel to Ray actors."""
    return cast(dict[str, object], OmegaConf.to_container(cast(DictConfig, section)))


def _learner_spec(layout: RunLayout, pid: str, model_path: str, pc: TrainConfig) -> LearnerSpec:
    """Policy `pid`'s learner, from its own config `pc` (model and learner sections), the run's, and what the
    layout resolved for it."""
    cfg, policy_map = layout.cfg, layout.policy_map
    return LearnerSpec(
        policy_id=pid,
        model_path=model_path,
        model=pc.model,
        learner=pc.learner,
        algo=cfg.algo,
        temperature=cfg.rollout.sampling.temperature,
        total_steps=cfg.steps,
        seed=cfg.seed,
        num_policies=len(policy_map.policies),
        policy_index=policy_map.policies.index(pid),
        gradient_checkpointing=layout.checkpointing[pid],
    )


def _engine_groups(layout: RunLayout, paths: dict[str, str], bundles: Callable[[str], GroupPlacement | None],
                   resync: Resync) -> dict[str, EngineGroup]:
    """role -> its EngineGroup; roles of one group (engine_scope=policy, multi-LoRA) share the
    object. Each group serves its policy's model with that policy's engine settings; the
    multi-LoRA group the top-level model."""
    cfg, configs = layout.cfg, layout.configs
    out: dict[str, EngineGroup] = {}
    slot = 0
    for spec in layout.engine_map.groups:
        if spec.policy is None:  # multi-LoRA: every role, one base model, adapters up to the largest rank
            pc, path = cfg, paths[spec.policies[0]]
            lora_rank = max(c.model.lora.rank for c in configs.values())
        else:
            pc, path, lora_rank = (
                configs[spec.policy],
                paths[spec.policy],
                configs[spec.policy].model.lora.rank,
            )
        group = EngineGroup(
            spec,
            path,
            pc.rollout,
            str(pc.model.dtype),
            first_slot=slot,
            placement=bundles(spec.name),
            lora_rank=lora_rank,
            weight_channel=cfg.sync.transport if cfg.sync.transport in ("nccl", "ipc") else "",
            resync=resync,
            chat_template_kwargs=_plain(pc.model.chat_template_kwargs),
        )
        slot += max(pc.rollout.engines_per_role, 1)
        out.update(dict.fromkeys(spec.roles, group))
    return out
