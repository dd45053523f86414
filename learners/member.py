"""The contract between a LearnerGroup and the ranks it hosts: `LearnerSpec`, what every rank is
built from (one keyword dataclass crosses to the Ray actors), and `LearnerMember`, the methods the
group and the weight sync call on a rank (learners/learner.py, whatever its gradient backend), named
as `LearnerMember.<method>`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from cluster.collective import CollectiveMember
from cluster.weight_transfer import WeightSender
from learners.config import AlgoConfig, LearnerConfig, ModelConfig, as_section

if TYPE_CHECKING:  # the contract itself needs no torch or model code to import
    from torch import Tensor

    from cluster.packing import PackedTensors
    from cluster.payloads import AdapterPayload, LoraDelta
    from learners.batch import TrainBatch
    from learners.rank_metrics import RankMetrics
    from learners.update.ppo_plan import UpdatePlan


@dataclass(frozen=True, kw_only=True)
class LearnerSpec:
    """One policy's learner: its model folder and the config sections its ranks read (plain values and
    the sections as instances of their classes, learners/config.py, so it pickles to the rank actors and the
    sections' derived properties are at hand)."""

    policy_id: str
    model_path: str
    model: ModelConfig  # the policy's `model` config section (dtype, lora)
    learner: LearnerConfig  # its `learner` section (optim, micro-batch, backend, ...)
    algo: AlgoConfig  # the `algo` section (clipping, KL, loss aggregation, ...)
    # the rollout sampling temperature (logprobs are of the temperature-scaled distribution)
    temperature: float
    total_steps: int  # training steps of the run (the LR schedule's length)
    seed: int
    # The run's number of policies and this one's position among them (the policy map's order): under
    # learner.optim.schedule_unit=update_call every policy's update call advances one shared schedule.
    num_policies: int = 1
    policy_index: int = 0
    # learner.gradient_checkpointing as the run layout resolved it (jobs/plan/layout.py); None: the learner
    # section's own value, auto as off (a spec built without a layout: tests, benchmarks).
    gradient_checkpointing: bool | None = None

    def __post_init__(self) -> None:
        # A loaded config's sections are DictConfigs shaped by these classes: the ranks get the classes.
        for name, cls in (("model", ModelConfig), ("learner", LearnerConfig), ("algo", AlgoConfig)):
            object.__setattr__(self, name, as_section(getattr(self, name), cls))


class LearnerMember(CollectiveMember, WeightSender, Protocol):
    """One data-parallel rank of a policy: trains on its shard, hands out weights (its WeightServer,
    learners/state/weight_server.py; rank 0 also over the weight channel: WeightSender), saves and restores
    state; ranks form a process group (CollectiveMember)."""

    def __init__(self, spec: LearnerSpec, rank: int = 0) -> None: ...

    def update(self, batch: TrainBatch, plan: UpdatePlan) -> RankMetrics:
        """The optimizer steps of one training step on this rank's shard; returns its sums and step metrics
        (learners.rank_metrics)."""
        ...

    def get_weights(self) -> dict[str, Tensor]:
        """The weights engines serve (LoRA merged), as host tensors under HF names."""
        ...

    def get_packed_weights(self) -> PackedTensors:
        """`get_weights` as the wire format's buffers (cluster.packing): the object-store sync payload."""
        ...

    def get_adapter(self) -> AdapterPayload:
        """The LoRA adapter alone (rollout.lora payload): multi-LoRA serving."""
        ...

    def get_lora_delta(self) -> LoraDelta:
        """The adapter and the names of the served weights: adapter-only syncs of merged serving."""
        ...

    def merged_sketch(self) -> PackedTensors:
        """The probe sketch (cluster.sketch) of the merged weights each engine must
        serve from the adapter alone."""
        ...

    def sync_metrics(self) -> dict[str, float]:
        """What the weights last handed out lost to the serving dtype (`sync/merge_rounding/<policy>`)."""
        ...

    def export(self, out_dir: str) -> str:
        """An HF model folder of the current weights (and the adapter, for LoRA); returns the folder."""
        ...

    def save_state(self, path: str) -> None:
        """This rank's part of the policy's state (learners/state/state_io.py)."""
        ...

    def load_state(self, path: str) -> None: ...

    def offload_states(self) -> dict[str, float]:
        """The optimizer's states off the device for the rollout (rollout.layout=colocated);
        {"bytes", "offloads"}."""
        ...

    def reload_states(self) -> dict[str, float]:
        """The states back, bit for bit, for the update; {"bytes", "reloads"}."""
        ...
