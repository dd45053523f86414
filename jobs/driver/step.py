"""One training step: where its episodes come from (RolloutSource), what each phase took (PhaseTimer), and the
step itself (train_step): episodes → advantages → batches → update every policy → sync → metrics.

With rollout.one_step_off_policy the source collects step t+1's episodes while step t's update runs, by the
weights of before that update (a knob of the source, not a second loop).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from jobs.config.guards import role_guards, run_guards
from jobs.config.schema import TrainConfig
from jobs.driver.handles import RunHandles
from jobs.driver.served import check_served
from jobs.driver.updates import run_concurrently, update_all
from learners.batch import TrainBatch, build_batches, check_role_drops, flat_rewards
from learners.role_grads import step_role_shares
from learners.update.advantages import ADVANTAGE_ESTIMATORS, group_keys, keys_to_ids
from marl.episode_metrics import episode_metrics
from marl.guard_grammar import at_budget
from marl.guards import guard_metrics
from marl.seeds import derive_seed
from marl.tasks.sampler import PromptSampler
from marl.types import Episode, Task
from rollout.config import RolloutConfig
from rollout.engine import Sampling
from rollout.storage import write_episodes

# A step's phases, each reported as time/<phase>_s (0 when it did not run in this step): rollout = generation
# and scoring (overlapped per episode), generate = the part of it with an engine call in flight (both 0 when
# the episodes were collected during the previous step's update), store = the step's Parquet file, advantage =
# advantages and batch building, update = every policy's optimizer step, with prefetch = the next step's
# rollout run meanwhile. The sync reports its own time/sync_s.
# Under rollout.layout=colocated (jobs/driver/phases.py) also: sleep = the engines releasing their memory and
# the learners reloading their optimizer states, offload = the reverse after the update (with the engines'
# weights back for the sync), wake = the engines' KV caches back.
PHASES = ("rollout", "generate", "prefetch", "store", "advantage", "sleep", "update", "offload", "wake")


class PhaseTimer:
    """Wall time per phase of one step, as `time/<phase>_s` metrics, and the whole step's as `time/step_s`."""

    def __init__(self, phases: tuple[str, ...] = PHASES):
        self.seconds = dict.fromkeys(phases, 0.0)
        self._start = time.perf_counter()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t0)

    def add(self, name: str, seconds: float) -> None:
        """Count `seconds` measured elsewhere (an engine's busy time, a callback's duration) to `name`."""
        self.seconds[name] += seconds

    def metrics(self) -> dict[str, float]:
        return {
            **{f"time/{k}_s": v for k, v in self.seconds.items()},
            "time/step_s": time.perf_counter() - self._start,
        }


@dataclass
class StepRollout:
    """One step's scored episodes and the wall time their collection took (`generate_s` of it with an engine
    call in flight), whenever it ran."""

    episodes: list[Episode]
    rollout_s: float
    generate_s: float
    # rollout.rollout_stats: busy share, latency
    engine_metrics: dict[str, float] = field(default_factory=dict)
    # policy -> the weight version its engines served when the collection began (jobs/driver/served.py)
    versions: dict[str, int] = field(default_factory=dict)


def role_caps(rollout: RolloutConfig) -> tuple[tuple[str, int], ...]:
    """rollout.role_max_new_tokens as Sampling.role_caps (sorted: the same value
    in every run of one config)."""
    return tuple(sorted((str(role), int(cap)) for role, cap in rollout.role_max_new_tokens.items()))


class RolloutSource:
    """Each step's episodes for the next `rollout.prompts_per_step` prompts of `sampler`, sampled with the
    step's own seed whenever they are collected.

    Synchronous by default: a step collects its episodes when it takes them. With rollout.one_step_off_policy,
    step t+1's are collected during step t's update (`during_update`). `sampler_state` is the sampler once the
    last taken step's prompts were drawn: what that step's checkpoint records, so prefetched episodes are
    never saved and a resumed run draws their prompts again."""

    def __init__(self, handles: RunHandles, cfg: TrainConfig, sampler: PromptSampler,
                 on_episode: Callable[[int, int], None] | None = None):
        """`on_episode(done, total)` follows a synchronous collection (progress display)."""
        self.handles, self.cfg, self.sampler, self.on_episode = handles, cfg, sampler, on_episode
        self.prefetching = bool(cfg.rollout.one_step_off_policy)
        self.sampler_state = sampler.state()
        self._prefetched: StepRollout | None = None

    def sampling(self, step: int) -> Sampling:
        s = self.cfg.rollout.sampling
        return Sampling(
            s.temperature,
            s.top_p,
            s.max_new_tokens,
            seed=derive_seed(self.cfg.seed, "rollout", step),
            role_caps=role_caps(self.cfg.rollout),
            role_guards=role_guards(self.cfg),
        )

    def collect(self, tasks: list[Task], step: int,
                on_episode: Callable[[int, int], None] | None = None) -> StepRollout:
        t0 = time.perf_counter()
        versions = self.handles.weight_versions()
        collected = self.handles.collector.collect(tasks, self.cfg.rollout.samples_per_prompt,
                                                   self.sampling(step), on_episode)
        return StepRollout(collected.episodes, time.perf_counter() - t0, collected.generate_s,
                           collected.metrics, versions)

    def take(self, step: int, timer: PhaseTimer) -> StepRollout:
        """Step `step`'s episodes: prefetched during the previous update, or
        collected now (timed in `timer`)."""
        rollout, self._prefetched = self._prefetched, None
        if rollout is None:
            with timer.phase("rollout"):
                rollout = self.collect(
                    self.sampler.next(self.cfg.rollout.prompts_per_step), step, self.on_episode
                )
            timer.add("generate", rollout.generate_s)
        self.sampler_state = self.sampler.state()
        return rollout

    def during_update(self, step: int) -> Callable[[], None] | None:
        """What runs in the driver while step `step`'s update runs: collecting step
        + 1's episodes, or nothing."""
        if not self.prefetching or step + 1 >= self.cfg.steps:
            return None

        def prefetch() -> None:
            self._prefetched = self.collect(self.sampler.next(self.cfg.rollout.prompts_per_step), step + 1)

        return prefetch

    def rewind(self, sampler_state: dict) -> None:
        """Drop prefetched episodes and draw their prompts again from `sampler_state` (a rollback: the weights
        that collected them are gone)."""
        self._prefetched = None
        self.sampler.load_state(sampler_state)


def train_step(
    handles: RunHandles,
    cfg: TrainConfig,
    source: RolloutSource,
    step: int,
    pad_ids: Mapping[str, int],
    run_dir: Path,
    version: int | None = None,
    before_update: Callable[[], None] | None = None,
) -> dict:
    """One step; the engines serve weight `version` (default step + 1) afterwards. `pad_ids`: policy -> its
    tokenizer's pad id (policies on different base models have their own). `before_update` runs once the
    batches passed their checks, just before any learner changes."""
    timer, phases = PhaseTimer(), handles.phases  # phases: no-ops unless rollout.layout=colocated
    rollout = source.take(step, timer)
    check_served(rollout.episodes, handles.policy_map, rollout.versions, step)
    with timer.phase("store"):
        write_episodes(rollout.episodes, step, run_dir / "rollouts" / f"step_{step:06d}.parquet")
    with timer.phase("advantage"):
        batches, batch_stats = step_batches(handles, cfg, rollout.episodes, step, pad_ids)
        if before_update is not None:
            before_update()
    with timer.phase("sleep"):
        moved = {**phases.sleep_engines(), **phases.reload_learners()}
    with timer.phase("update"):
        concurrent = run_concurrently(cfg.learner, len(handles.learners))
        updated, prefetch_s = update_all(handles.learners, batches, step, pad_ids, concurrent,
                                         source.during_update(step))
    timer.add("prefetch", prefetch_s)
    with timer.phase("offload"):
        moved |= {**phases.offload_learners(), **phases.wake_engines(("weights",))}
    version = step + 1 if version is None else version
    synced = handles.sync(version=version)
    with timer.phase("wake"):
        moved |= phases.wake_engines(("kv_cache",))
    shares = step_role_shares(updated, handles.policy_map.roles)
    guarded = guard_metrics(rollout.episodes, run_guards(cfg), at_budget)
    return {**rollout_metrics(rollout, handles.policy_map.roles, version), **guarded, **updated, **shares,
            **synced, **{k: float(v) for k, v in batch_stats.items()}, **moved, **timer.metrics()}


def step_batches(handles: RunHandles, cfg: TrainConfig, episodes: list[Episode], step: int,
                 pad_ids: Mapping[str, int]) -> tuple[dict[str, TrainBatch], dict[str, int]]:
    """Advantages (grouped per algo.group_by) and each policy's TrainBatch, checked for rows lost to length
    caps before any update trains on the rest."""
    keys = keys_to_ids(group_keys(episodes, cfg.algo.group_by))
    advantages = ADVANTAGE_ESTIMATORS[cfg.algo.advantage](
        flat_rewards(episodes), keys, norm_std=cfg.algo.norm_std, singleton=cfg.algo.singleton_advantage
    )
    batches, batch_stats = build_batches(
        episodes,
        handles.policy_map,
        advantages,
        pad_ids,
        cfg.algo.max_len,
        cfg.rollout.max_prompt_tokens or None,
        balance_ranks=balance_ranks(cfg),
        guards=dict(role_guards(cfg)),
    )
    check_role_drops(batch_stats, step, cfg.algo.max_role_drop_frac)
    return batches, batch_stats


def balance_ranks(cfg: TrainConfig) -> int:
    """The ranks verl's balanced order partitions the step's rows over (algo.minibatch_ranks, else the
    learners' own), or 0 when the rows keep the episodes' order."""
    if cfg.algo.minibatch_order != "verl_balanced":
        return 0
    return cfg.algo.minibatch_ranks or max(cfg.learner.ranks, 1)


def rollout_metrics(rollout: StepRollout, roles: list[str], version: int) -> dict[str, float]:
    """Per-role episode metrics, throughput over the collection's own duration (also when it ran during the
    previous step) and how far the episodes' weights lag the learner that trains on them."""
    out = episode_metrics(rollout.episodes, roles)
    if rollout.rollout_s > 0:
        out["rollout/tokens_per_s"] = out.get("rollout/tokens", 0.0) / rollout.rollout_s
    out["rollout/off_policy_steps"] = float(off_policy_steps(rollout.episodes, learner_version=version - 1))
    return {**out, **rollout.engine_metrics}


def off_policy_steps(episodes: list[Episode], learner_version: int) -> int:
    """How many weight versions the oldest turn's engine weights lag the learner that trains on them."""
    return learner_version - min(
        (t.completion.version for e in episodes for t in e.turns), default=learner_version
    )
