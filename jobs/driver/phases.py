"""The colocated layout's phase calls (rollout.layout=colocated, the paper's hybrid engine): engines and
learner ranks take turns on the same GPUs, so around the update the engines release their memory and the
learners take back their optimizer states, and around the rollout the reverse. The order is the driver's
step's (jobs/driver/step.py: rollout → sleep → reload → update → offload → sync → wake); this module only
makes each call, on every engine group and learner group of the run, and counts what it moved. Under the
separate layout every call is a no-op: the step is the same code either way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from learners.group import LearnerGroup
from rollout.engine_group import EngineGroup

# Level 1 keeps the engines' weights in host memory while they sleep: a multi-LoRA sync ships adapters only,
# so the base must come back as it was (level 2 would drop it and need the whole model re-sent).
SLEEP_LEVEL = 1


class Phases:
    """The phase calls of one run: `active` under rollout.layout=colocated, no-ops otherwise."""

    def __init__(self, engines: Sequence[EngineGroup], learners: Mapping[str, LearnerGroup], active: bool):
        self.engines, self.learners, self.active = list(engines), dict(learners), active

    def sleep_engines(self) -> dict[str, float]:
        """Every engine releases its weights (to host memory) and KV cache for the update."""
        return self._engines("sleep", lambda g: g.sleep(SLEEP_LEVEL))

    def wake_engines(self, tags: tuple[str, ...]) -> dict[str, float]:
        """Every engine takes back what `tags` name: "weights" before the sync loads into them, then
        "kv_cache" before the next rollout."""
        return self._engines(f"wake_{'_'.join(tags)}", lambda g: g.wake_up(tags))

    def reload_learners(self) -> dict[str, float]:
        """Every learner's optimizer states back on its device for the update."""
        if not self.active:
            return {}
        return {k: v for group in self._learner_groups() for k, v in group.reload_states().items()}

    def offload_learners(self) -> dict[str, float]:
        """Every learner's optimizer states off its device for the rollout."""
        if not self.active:
            return {}
        return {k: v for group in self._learner_groups() for k, v in group.offload_states().items()}

    def _learner_groups(self) -> list[LearnerGroup]:
        return list(self.learners.values())

    def _engines(self, what: str, call: Callable[[EngineGroup], dict[str, float]]) -> dict[str, float]:
        if not self.active:
            return {}
        out: dict[str, float] = {}
        for group in self.engines:
            for key, value in call(group).items():
                out[f"colocate/{what}/{key}/{group.key}"] = value
        return out
