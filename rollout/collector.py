"""The Collector: runs many workflow episodes concurrently and routes their turns to each role's EngineGroup,
streamed (each turn sent as its episode reaches it) or in lockstep (each role's turns batched per round); the
two clients are in rollout.clients, the collection's engine metrics in rollout.rollout_stats."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import NamedTuple

from marl.episode import run_episode
from marl.rewards import RewardShaping
from marl.tasks.base import TaskFamily
from marl.types import Episode, Task
from marl.workflows.common import WorkflowOptions
from rollout.clients import CLIENTS, Engines, EpisodeClient, RolloutMode, TurnClient
from rollout.engine import Sampling


class Collected(NamedTuple):
    """A collection's episodes, the wall time during which at least one engine call was in flight, and the
    engine metrics (rollout.rollout_stats)."""

    episodes: list[Episode]
    generate_s: float
    metrics: dict[str, float]


class Collector:
    """Runs `samples_per_prompt` episodes of `workflow` for each task and returns them scored."""

    def __init__(self, engines: Mapping[str, Engines], workflow: str, family: TaskFamily,
                 options: WorkflowOptions, shaping: RewardShaping | None = None,
                 mode: RolloutMode | str = RolloutMode.streaming):
        if mode not in CLIENTS:
            raise ValueError(f"rollout.mode must be one of {', '.join(CLIENTS)}, got {mode!r}")
        self.engines, self.workflow, self.family = engines, workflow, family
        self.options, self.shaping, self.mode = options, shaping, RolloutMode(mode)

    def collect(self, tasks: list[Task], samples_per_prompt: int, sampling: Sampling,
                on_episode: Callable[[int, int], None] | None = None) -> Collected:
        """The episodes and the collection's metrics. `on_episode(done, total)` is told each time an episode
        finishes (progress display)."""
        return asyncio.run(self._collect(tasks, samples_per_prompt, sampling, on_episode))

    async def _collect(self, tasks: list[Task], n: int, sampling: Sampling,
                       on_episode: Callable[[int, int], None] | None) -> Collected:
        client: TurnClient = CLIENTS[self.mode](self.engines, sampling)
        total, done = len(tasks) * n, 0

        async def tracked(t: int, task: Task, i: int) -> Episode:
            nonlocal done
            episode = await run_episode(self.workflow, task, EpisodeClient(client, (t, i)), self.family,
                                        self.options, i, self.shaping)
            done += 1
            if on_episode is not None:
                on_episode(done, total)
            return episode

        episodes = await asyncio.gather(
            *(tracked(t, task, i) for t, task in enumerate(tasks) for i in range(n))
        )
        return Collected(list(episodes), client.clock.generate_s, client.clock.metrics())
