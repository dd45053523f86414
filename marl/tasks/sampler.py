"""The epoch-shuffled, resumable PromptSampler that feeds training steps their tasks."""

from __future__ import annotations

import random
from collections.abc import Sequence

from marl.types import Task


class PromptSampler:
    """Deterministic sampler: each epoch is a fresh seeded shuffle; resumable via state()/load_state()."""

    def __init__(self, tasks: Sequence[Task], seed: int) -> None:
        if not tasks:
            raise ValueError("PromptSampler needs at least one task")
        self._tasks = list(tasks)
        self._seed = seed
        self._epoch = 0
        self._position = 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        # A string seed is hashed with sha512, so the order is the same in every process.
        order = list(range(len(self._tasks)))
        random.Random(f"{self._seed}:{epoch}").shuffle(order)
        return order

    @property
    def epoch(self) -> int:
        return self._epoch

    def next(self, k: int) -> list[Task]:
        """The next `k` tasks, crossing into new epochs as needed."""
        if k < 0:
            raise ValueError(f"PromptSampler.next needs k >= 0, got {k}")
        out: list[Task] = []
        while len(out) < k:
            if self._position == len(self._tasks):
                self._epoch = self._epoch + 1
                self._position = 0
                self._order = self._permutation(self._epoch)
            take = min(k - len(out), len(self._tasks) - self._position)
            out.extend(self._tasks[i] for i in self._order[self._position : self._position + take])
            self._position += take
        return out

    def state(self) -> dict[str, int]:
        n = len(self._tasks)
        return {"epoch": self._epoch, "position": self._position, "seed": self._seed, "num_tasks": n}

    def load_state(self, state: dict[str, int]) -> None:
        """Resume where state() was taken; the task list and seed must be the same as then."""
        n = len(self._tasks)
        if state.get("num_tasks", n) != n or state.get("seed", self._seed) != self._seed:
            raise ValueError(
                f"sampler state is for {state.get('num_tasks')} tasks / seed {state.get('seed')}, "
                f"this sampler has {n} tasks / seed {self._seed}"
            )
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position <= n:
            raise ValueError(f"sampler state out of range: {state}")
        self._epoch, self._position = epoch, position
        self._order = self._permutation(epoch)
