"""Learner: one data-parallel rank owning a policy's model, its forward passes and its optimizer-step loop.

One `update` call = one training step = the optimizer steps of an `UpdatePlan` (PPO mini-batches × epochs,
learners/update/ppo_plan.py). In each optimizer step gradients accumulate over micro-batches, every
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
import math
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any, cast

import torch

from cluster import collective
from cluster.packing import PackedTensors
from cluster.payloads import AdapterPayload, LoraDelta
from learners.batch import TrainBatch
from learners.compute.padding_free import attention_implementation
from learners.diagnostic_sample import sample_size
from learners.gradients.backends import BACKENDS, GradientBackend, LearnerParts
from learners.gradients.offload import Offloads
from learners.member import LearnerSpec
from learners.passes import PolicyPasses
from learners.policy_move import PolicyMove
from learners.rank_metrics import RankMetrics, StepMetrics, TokenSums
from learners.role_grads import flat_autograd, role_grad_metrics
from learners.schedule import lr_lambda
from learners.state.weight_server import WeightServer
from learners.state.weights import PolicyModel, is_lora, load_policy_model
from learners.update.micro_batches import padding
from learners.update.policy_loss import policy_loss
from learners.update.ppo_plan import UpdatePlan, mean_and_last


class Learner:
    """A rank of policy `spec.policy_id` (learners.member.LearnerMember), its
    gradients applied by `backend`."""

    def __init__(self, spec: LearnerSpec, rank: int = 0, module: PolicyModel | None = None):
        """`module`: the policy module to train instead of one loaded from `spec.model_path` (a colocated LoRA
        policy's adapter bound on a base other policies share: learners/colocated_group.py)."""
        model, learner, algo = spec.model, spec.learner, spec.algo
        if learner.torch_threads:
            torch.set_num_threads(learner.torch_threads)
        torch.manual_seed(spec.seed)
        self.policy_id = spec.policy_id
        self.model_path = spec.model_path
        self.dtype = model.dtype
        self.cfg, self.algo, self.rank = learner, algo, rank
        backend = BACKENDS[learner.backend]
        bf16 = backend.capabilities.autocast_bf16 and model.dtype == "bfloat16"
        autocast = torch.bfloat16 if bf16 else None
        # Trained weights are fp32 masters under autocast; a LoRA policy's frozen base stays
        # in the serving dtype (peft keeps adapters in fp32), so its merge rounds W0 + ΔW from
        # the very base the engines hold.
        self.master_dtype = "float32" if autocast and not model.lora.enabled else model.dtype
        attention = attention_implementation(learner.padding_free)
        self.model = _policy_module(spec, self.master_dtype, attention, module)
        self.params, opt = [p for p in self.model.parameters() if p.requires_grad], learner.optim
        beta1, beta2 = opt.betas  # two, checked at config load
        self.optimizer = torch.optim.AdamW(self.params, lr=opt.lr, betas=(beta1, beta2),
                                           weight_decay=opt.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(opt, spec.total_steps, spec.num_policies, spec.policy_index))
        # A LoRA policy's reference is its base with the adapter disabled: no second copy in memory.
        self.reference = (
            load_policy_model(self.model_path, self.master_dtype, model.lora, attention)
            .eval()
            .requires_grad_(False)
            if algo.uses_kl and not is_lora(self.model)
            else None
        )
        self.backend: GradientBackend = backend(LearnerParts(
            spec=spec, rank=rank, model=self.model, params=self.params, optimizer=self.optimizer,
            scheduler=self.scheduler, reference=self.reference))
        self.passes = PolicyPasses(
            self.model,
            self.reference,
            self.backend,
            learner,
            algo,
            temperature=spec.temperature if spec.temperature > 0 else 1.0,
            autocast=autocast,
            model_path=spec.model_path,
        )
        self.move = PolicyMove(learner.policy_move and sample_size(learner.diagnostics.sample_rows) != 0)
        self.step = 0
        # Optimizer steps that left the weights as they were (a non-finite gradient): this training step's,
        # and the run of consecutive ones across training steps (the driver stops the run on a long one).
        self.nonfinite_steps, self.nonfinite_run = 0, 0
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
        self.offloads.check_resident("update")
        self.model.train()
        self.nonfinite_steps = 0
        data = self.passes.with_old_logprobs(self.backend.prepare(batch), plan)
        if plan.move_weights is not None:  # the policy movement's sample (learners/diagnostic_sample.py)
            weights = torch.tensor(plan.move_weights, device=data.advantages.device)
            data = dataclasses.replace(data, move_weights=weights)
        sums = TokenSums()
        if plan.metric_rows is not None:
            sums = sums.plus(self.passes.skipped_row_metrics(data, plan.metric_rows, plan.metric_weights))
        per_step, lr = [], float(self.optimizer.param_groups[0]["lr"])
        taken = [i for i in range(len(plan.steps)) if not (plan.skip and plan.skip[i])]
        self.move.start()
        for i in taken:
            mb = data.select(data.longest_first(plan.steps[i]))
            if i == 0 and self.algo.old_logprobs == "recompute":
                mb = dataclasses.replace(mb, old_logprobs=None)  # nothing moved yet: old = current, detached
            metrics, sums = self._optimizer_step(mb, plan.normalizers[i], plan.roles, sums)
            per_step.append(metrics)
            self.move.stop_capture()  # the first step's forward alone ran on the weights of before the update
            if self.cfg.optim.schedule_unit == "optimizer_step":
                self.scheduler.step()
        if self.cfg.optim.schedule_unit != "optimizer_step":  # step, update_call: learners.schedule
            with warnings.catch_warnings():
                # An update that took no optimizer step (no row carried an advantage) still advances a
                # per-step schedule, so the lr follows the training step; torch's order check reads that
                # as a mistake and warns.
                warnings.filterwarnings("ignore", r"Detected call of `lr_scheduler\.step\(\)` before",
                                        UserWarning)
                self.scheduler.step()
        move = self._measure_move(data, plan, taken)
        if move is not None:
            sums = dataclasses.replace(sums, move=move[0], move_tokens=move[1])
        self.step += 1
        self.backend.after_update()
        sums = dataclasses.replace(sums, loss=sums.loss / len(plan.steps))
        # No step taken: no gradient, reported as a zero norm at the lr the step would have used.
        means = mean_and_last(per_step or [{"lr": lr, "grad_norm": 0.0}])
        step = StepMetrics(grad_norm=means.pop("grad_norm"), last_grad_norm=means.pop("last/grad_norm"),
                           lr=means.pop("lr"), last_lr=means.pop("last/lr"), optimizer_steps=len(taken),
                           skipped_steps=len(plan.steps) - len(taken), role_grads=means,
                           nonfinite_steps=self.nonfinite_steps, nonfinite_run=self.nonfinite_run)
        return RankMetrics(sums, step)

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

    def _optimizer_step(self, mb: TrainBatch, normalizer: float, roles: list[str] | None,
                        sums: TokenSums) -> tuple[dict[str, float], TokenSums]:
        """One optimizer step on mini-batch `mb`: its gradient summed over ranks, clipping, the step.
        Returns (the step's metrics: lr, grad norm and the per-role gradient metrics, if taken; `sums` plus
        its micro-batches' metric sums).

        With `roles` (and a backend holding whole weights outside forward) each role's gradient is taken apart
        and the step uses their sum, which is the plain gradient. Otherwise the backend runs one backward per
        micro-batch, and idle ones up to the passes it matches across ranks."""
        metrics: dict[str, float] = {}
        if roles and self.backend.per_role_gradients:
            role_grads, total = self._role_gradients(mb, normalizer, roles, sums)
            self.backend.apply_gradient(role_grads.sum(0))
            metrics = role_grad_metrics(role_grads, roles, self.policy_id)
        else:
            total = self._backward(mb, normalizer, sums)
        lr, norm, applied = self.backend.step()
        metrics["lr"], metrics["grad_norm"] = lr, norm
        self._count_applied(applied and math.isfinite(norm))
        return metrics, total

    def _count_applied(self, applied: bool) -> None:
        """A step that did not apply (the backend skipped it, or its gradient norm is inf or NaN) counts in
        this training step's `nonfinite_steps` and in the run of consecutive ones; an applied step ends
        that run."""
        self.nonfinite_steps += not applied
        self.nonfinite_run = 0 if applied else self.nonfinite_run + 1

    def _backward(self, data: TrainBatch, normalizer: float, sums: TokenSums) -> TokenSums:
        """The backend's backward through each micro-batch's loss, built as the backend consumes it
        (one graph alive at a time), then idle ones; returns `sums` plus the micro-batches' metric
        sums, in the order they ran."""
        total = sums

        def losses() -> Iterator[torch.Tensor]:
            nonlocal total
            micro = self.passes.micro_batches(data)
            for i in range(max(self.backend.matched_passes(len(micro)), self.backend.min_backward_passes)):
                if i >= len(micro):
                    yield self.passes.idle_loss()
                    continue
                loss, metrics = self._micro_step(micro[i], normalizer)
                total = total.plus(metrics)
                yield loss

        self.backend.backward(losses())
        return total

    def _role_gradients(self, data: TrainBatch, normalizer: float, roles: list[str],
                        sums: TokenSums) -> tuple[torch.Tensor, TokenSums]:
        """([R, P] summed over ranks: row r is the gradient of role r's rows' share of the mini-batch's loss;
        `sums` plus the micro-batches' metric sums).

        Taken with torch.autograd.grad through the plain module, outside any engine's reduction hooks."""
        out = torch.zeros(len(roles), sum(p.numel() for p in self.params), device=self.backend.device)
        total = sums
        for r, role in enumerate(roles):
            rows = [i for i, x in enumerate(data.roles) if x == role]
            for mb in self.passes.micro_batches(data.select(rows)) if rows else []:
                loss, metrics = self._micro_step(mb, normalizer, plain=True)
                total = total.plus(metrics)
                out[r] += flat_autograd(
                    torch.autograd.grad(loss, self.params, allow_unused=True), self.params
                )
        collective.all_reduce_sum(out)
        return out, total

    def _micro_step(self, mb: TrainBatch, normalizer: float,
                    plain: bool = False) -> tuple[torch.Tensor, TokenSums]:
        """(One micro-batch's loss (learners.update.policy_loss, normalised by the global `normalizer`), its
            metric sums:
        padded_positions, positions and policy_loss's). The PPO ratio is taken against `mb.old_logprobs` (the
        behaviour policy), or against the current log-probs, detached, when there are none (the first
        optimizer step of a recomputed plan)."""
        lp, entropy = self.passes.logprobs(mb, plain, entropy=True)
        entropy = cast(torch.Tensor, entropy)  # asked for, so present
        self.move.capture(mb, lp)
        padded, positions = padding(mb.attention_mask.sum(-1).tolist())
        algo = self.algo
        reference = self.passes.reference_logprobs(mb) if algo.uses_kl else None
        old = mb.old_logprobs[:, 1:] if mb.old_logprobs is not None else None
        loss, sums = policy_loss(lp, old, mb.rollout_logprobs[:, 1:], mb.advantages, mb.loss_mask[:, 1:],
                                    mb.roles, ref_logprobs=reference, entropy=entropy, algo=algo,
                                    normalizer=normalizer)
        return loss, dataclasses.replace(sums, padded_positions=float(padded), positions=float(positions))

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

    def nccl_join(self, host: str, port: int, rank: int, world_size: int, timeout_s: float,
                  backend: str) -> None:
        self.weights.nccl_join(host, port, rank, world_size, timeout_s, backend)

    def nccl_send(self, version: int, bucket_bytes: int,
                  fingerprint: Callable[[Mapping[str, Any]], float]) -> dict[str, float]:
        return self.weights.nccl_send(version, bucket_bytes, fingerprint)

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


def _policy_module(spec: LearnerSpec, dtype: str, attention: str | None,
                   module: PolicyModel | None) -> PolicyModel:
    """The module a rank trains: `module` when given, else the policy loaded
    from `spec.model_path` in `dtype`;
    with gradient checkpointing where the run layout turned it on (LearnerSpec.gradient_checkpointing).
    Non-reentrant: per-role gradients use torch.autograd.grad."""
    model = (
        module
        if module is not None
        else load_policy_model(spec.model_path, dtype, spec.model.lora, attention)
    )
    resolved = spec.gradient_checkpointing
    if resolved if resolved is not None else bool(spec.learner.gradient_checkpointing):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model
