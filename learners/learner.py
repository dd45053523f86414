"""Learner: one data-parallel rank owning a policy's model, its forward passes and its optimizer-step loop.

One `update` call = one training step = the optimizer steps of an `UpdatePlan` (PPO mini-batches × epochs,
learners/update/ppo_plan.py), each run by the rank's `stepper` (learners/optimizer_step.py; its parts are
built by learners/build.py). In each optimizer step gradients accumulate over micro-batches, every
micro-batch's loss (learners.update.policy_loss) is normalised by the mini-batch's GLOBAL normaliser handed in
by the caller (so ranks and micro-batches sum to the mini-batch loss), gradients are summed across ranks,
clipped, and the optimizer steps: how, is the rank's `backend` (learners/gradients/backends.py: plain torch or
DeepSpeed, by `learner.backend`). The PPO ratio is taken against the old log-probs: a no-grad pass before the
first step (`algo.old_logprobs=recompute`; the first mini-batch uses its current log-probs, detached, which
are the same) or the engines' (`rollout`). The LR schedule advances once per training step or once per
optimizer step (`learner.optim.schedule_unit`; learners/schedule.py maps update_call's shared schedule onto
the training step). Handing the weights out (sync payloads, the NCCL channel, export) is its `weights`, a
learners.state.weight_server.WeightServer; the learner's remote methods for them delegate to it. Its forward
passes (micro-batches, log-probs through the chunked head, the reference, the no-grad passes before the first
step, idle passes) are its `passes`, a learners.passes.PolicyPasses.

bfloat16 (`model.dtype`) on the torch backend is mixed precision: fp32 master weights and fp32 AdamW
state (LoRA: fp32 adapters on the frozen bf16 base), every forward under
`torch.autocast("cpu", bfloat16)` (matmuls in bf16, reductions and the loss in fp32), and the weights
rounded to bf16 once per sync, as the engines serve them.
(DeepSpeed keeps its own bf16 scheme.)
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import torch

from cluster import collective
from cluster.packing import PackedTensors
from cluster.payloads import AdapterPayload, LoraDelta
from cluster.weight_transfer import Layout
from learners.batch import TrainBatch
from learners.build import build_parts, precision
from learners.diagnostic_sample import sample_size
from learners.gradients.backends import BACKENDS, GradientBackend
from learners.gradients.offload import Offloads
from learners.member import LearnerSpec
from learners.optimizer_step import OptimizerStep
from learners.passes import PolicyPasses
from learners.policy_move import PolicyMove
from learners.rank_metrics import RankMetrics, StepMetrics, TokenSums
from learners.state.weight_server import WeightServer
from learners.state.weights import PolicyModel
from learners.update.ppo_plan import UpdatePlan, mean_and_last


class Learner:
    """A rank of policy `spec.policy_id` (learners.member.LearnerMember), its
    gradients applied by `backend`."""

    def __init__(self, spec: LearnerSpec, rank: int = 0, module: PolicyModel | None = None):
        """`module`: the policy module to train instead of one loaded from `spec.model_path` (a colocated LoRA
        policy's adapter bound on a base other policies share: learners/colocated_group.py)."""
        learner = spec.learner
        if learner.torch_threads:
            torch.set_num_threads(learner.torch_threads)
        torch.manual_seed(spec.seed)
        self.policy_id, self.model_path, self.dtype = spec.policy_id, spec.model_path, spec.model.dtype
        self.cfg, self.algo, self.rank = learner, spec.algo, rank
        backend = BACKENDS[learner.backend]
        autocast, self.master_dtype = precision(spec, backend)
        parts = build_parts(spec, rank, self.master_dtype, module)
        self.model: PolicyModel = parts.model  # the module itself, its HF methods in reach
        self.params, self.optimizer, self.scheduler = parts.params, parts.optimizer, parts.scheduler
        self.reference = parts.reference
        self.backend: GradientBackend = backend(parts)
        self.passes = PolicyPasses(self.model, self.reference, self.backend, learner, spec.algo,
                                   temperature=spec.temperature if spec.temperature > 0 else 1.0,
                                   autocast=autocast, model_path=spec.model_path)
        self.move = PolicyMove(learner.policy_move and sample_size(learner.diagnostics.sample_rows) != 0)
        self.stepper = OptimizerStep(self.passes, self.backend, self.move, self.params, spec.algo,
                                     self.policy_id)
        self.step = 0
        self.weights = WeightServer(self.model, self.policy_id, self.model_path, self.dtype, self.backend)
        self.offloads = Offloads(self.backend.offload_states, self.backend.reload_states)

    # -- collective membership (delegated to cluster) --
    def rendezvous_address(self) -> tuple[str, int]:
        return collective.rendezvous_address()

    def join(self, backend: str, host: str, port: int, rank: int, world: int, timeout_s: float) -> None:
        self.backend.join(backend, host, port, rank, world, timeout_s)

    def update(self, batch: TrainBatch, plan: UpdatePlan) -> RankMetrics:
        """The optimizer steps of one training step on this rank's shard (learners/update/ppo_plan.py).
        Returns its sums (loss: the mean over optimizer steps; the policy's movement, learners/policy_move.py)
        and step metrics: the steps taken and skipped (`plan.skip`: neither the optimizer nor an
        optimizer-step schedule advances), the taken steps' mean and last grad norm, lr and (with
        `plan.roles`) per-role gradient metrics (the step uses their sum)."""
        data, sums = self._prepare(batch, plan)
        lr = float(self.optimizer.param_groups[0]["lr"])
        taken = [i for i in range(len(plan.steps)) if not (plan.skip and plan.skip[i])]
        per_step, sums = self._optimizer_steps(data, plan, taken, sums)
        if self.cfg.optim.schedule_unit != "optimizer_step":  # step, update_call: learners.schedule
            _advance(self.scheduler)
        move = self._measure_move(data, plan, taken)
        if move is not None:
            sums = dataclasses.replace(sums, move=move[0], move_tokens=move[1])
        self.step += 1
        self.backend.after_update()
        sums = dataclasses.replace(sums, loss=sums.loss / len(plan.steps))
        return RankMetrics(sums, _step_metrics(per_step, lr, len(taken), len(plan.steps) - len(taken),
                                               self.stepper.nonfinite_steps, self.stepper.nonfinite_run))

    def _prepare(self, batch: TrainBatch, plan: UpdatePlan) -> tuple[TrainBatch, TokenSums]:
        """The rank's shard on its device with the old log-probs the plan needs and the movement's sample
        weights; the sums start with the no-grad pass over the rows no step trains on (`plan.metric_rows`)."""
        self.offloads.check_resident("update")
        self.model.train()
        self.stepper.nonfinite_steps = 0
        data = self.passes.with_old_logprobs(self.backend.prepare(batch), plan)
        if plan.move_weights is not None:  # the policy movement's sample (learners/diagnostic_sample.py)
            weights = torch.tensor(plan.move_weights, device=data.advantages.device)
            data = dataclasses.replace(data, move_weights=weights)
        sums = TokenSums()
        if plan.metric_rows is not None:
            sums = sums.plus(self.passes.skipped_row_metrics(data, plan.metric_rows, plan.metric_weights))
        return data, sums

    def _optimizer_steps(self, data: TrainBatch, plan: UpdatePlan, taken: list[int],
                         sums: TokenSums) -> tuple[list[dict[str, float]], TokenSums]:
        """The plan's `taken` optimizer steps in order: (each one's metrics, `sums` plus theirs). The policy
        movement captures the first step's forward, the only one on the weights of before the update."""
        per_step = []
        self.move.start()
        for i in taken:
            mb = data.select(data.longest_first(plan.steps[i]))
            if i == 0 and self.algo.old_logprobs == "recompute":
                mb = dataclasses.replace(mb, old_logprobs=None)  # nothing moved yet: old = current, detached
            metrics, sums = self.stepper.run(mb, plan.normalizers[i], plan.roles, sums)
            per_step.append(metrics)
            self.move.stop_capture()
            if self.cfg.optim.schedule_unit == "optimizer_step":
                self.scheduler.step()
        return per_step, sums

    def _measure_move(self, data: TrainBatch, plan: UpdatePlan,
                      taken: list[int]) -> tuple[float, float] | None:
        """The step's policy-movement sums: the first taken step's captured micro-batches and, when
        recomputed, the rows of later steps against their old log-probs (learners/policy_move.py)."""
        if self.move.enabled and taken and self.algo.old_logprobs == "recompute":
            rest = sorted({j for rows in plan.steps[1:] for j in rows} - set(plan.steps[taken[0]]))
            for mb in self.passes.micro_batches(data.select(data.longest_first(rest))) if rest else []:
                self.move.add(mb)
        return self.move.measure(self.passes.policy_logprobs, self.backend.matched_passes,
                                 self.passes.idle_loss, self.passes.micro_batches)

    def _micro_step(self, mb: TrainBatch, normalizer: float,
                    plain: bool = False) -> tuple[torch.Tensor, TokenSums]:
        """One micro-batch's loss and metric sums (OptimizerStep.micro_step)."""
        return self.stepper.micro_step(mb, normalizer, plain)

    # -- the weights handed out (learners.state.weight_server): the remote methods LearnerMember names --
    def get_weights(self) -> dict[str, torch.Tensor]:
        return self.weights.get_weights()

    def get_packed_weights(self) -> PackedTensors:
        return self.weights.get_packed_weights()

    def get_lora_delta(self) -> LoraDelta:
        return self.weights.get_lora_delta()

    def merged_sketch(self) -> PackedTensors:
        return self.weights.merged_sketch()

    def get_adapter(self) -> AdapterPayload:
        return self.weights.get_adapter()

    def sync_metrics(self) -> dict[str, float]:
        return self.weights.sync_metrics()

    def nccl_join(self, host: str, port: int, world_size: int, timeout_s: float, backend: str,
                  bucket_bytes: int) -> None:
        self.weights.nccl_join(host, port, world_size, timeout_s, backend, bucket_bytes)

    def weight_layout(self) -> Layout:
        return self.weights.weight_layout()

    def nccl_send(self, version: int) -> dict[str, float]:
        return self.weights.nccl_send(version)

    def ipc_open(self, bucket_bytes: int) -> None:
        self.weights.ipc_open(bucket_bytes)

    def ipc_next(self) -> dict[str, Any] | None:
        return self.weights.ipc_next()

    def ipc_close(self) -> dict[str, float]:
        return self.weights.ipc_close()

    def export(self, out_dir: str) -> str:
        return self.weights.export(out_dir)

    # -- checkpoint state (the contract is in learners/state/state_io.py; the layout is the backend's) --
    def save_state(self, path: str) -> None:
        with self.offloads.resident():
            self.backend.save_state(path, self.step)

    def load_state(self, path: str) -> None:
        with self.offloads.resident():
            self.step = self.backend.load_state(path)

    # -- rollout.layout=colocated (learners/gradients/offload.py) --
    def offload_states(self) -> dict[str, float]:
        return self.offloads.offload()

    def reload_states(self) -> dict[str, float]:
        return self.offloads.reload()



def _advance(scheduler: torch.optim.lr_scheduler.LRScheduler) -> None:
    """One step of a per-training-step schedule. An update that took no optimizer step (no row carried an
    advantage) still advances it, so the lr follows the training step; torch's order check reads that as a
    mistake and warns."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r"Detected call of `lr_scheduler\.step\(\)` before", UserWarning)
        scheduler.step()


def _step_metrics(per_step: list[dict[str, float]], lr: float, taken: int, skipped: int, nonfinite: int,
                  nonfinite_run: int) -> StepMetrics:
    """The step metrics of `taken` optimizer steps' `per_step` metrics (mean and last); no step taken: no
    gradient, reported as a zero norm at the lr the step would have used."""
    means = mean_and_last(per_step or [{"lr": lr, "grad_norm": 0.0}])
    return StepMetrics(grad_norm=means.pop("grad_norm"), last_grad_norm=means.pop("last/grad_norm"),
                       lr=means.pop("lr"), last_lr=means.pop("last/lr"), optimizer_steps=taken,
                       skipped_steps=skipped, role_grads=means, nonfinite_steps=nonfinite,
                       nonfinite_run=nonfinite_run)
