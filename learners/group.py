"""LearnerGroup: the data-parallel ranks of one policy, hosted by cluster.Group.

The driver hands over a whole TrainBatch; the group computes the global loss normaliser from it (no
collective needed), scatters contiguous shards, and merges the ranks' metric sums into per-policy means. Ranks
are built from one LearnerSpec and called through learners.member.LearnerMember.
"""

from __future__ import annotations

import dataclasses

import torch

from cluster.collective import init_collective
from cluster.group import Group, MemberOptions, Pending
from cluster.member import Call
from cluster.placement import GroupPlacement
from cluster.threads import thread_env
from learners.batch import TrainBatch
from learners.diagnostic_sample import SampledRows, sample_diagnostics, sample_size
from learners.member import LearnerMember, LearnerSpec
from learners.rank_metrics import RankMetrics, TokenSums, merge_rank_metrics
from learners.role_grads import advantage_mass
from learners.update.empty_steps import empty_steps
from learners.update.mitigations import parallel_agent_weights, role_balance_weights
from learners.update.ppo_plan import Cut, UpdatePlan, effective_mini_batch_size, plan_update
from marl.names import group_name
from marl.seeds import derive_seed


class UpdateResult:
    """An update in flight; `result()` waits (with the group's deadline) and returns its metrics."""

    def __init__(self, pending: Pending[RankMetrics], policy_id: str, timeout: float,
                 extra: dict[str, float], unmeasured: TokenSums | None = None):
        """`unmeasured`: sums no rank holds (the tokens of skipped rows the diagnostics' sample left out),
        added to the ranks' before the means are taken."""
        self._pending, self.policy_id, self._timeout, self._extra = pending, policy_id, timeout, extra
        self._unmeasured = unmeasured

    def result(self) -> dict[str, float]:
        per_rank = self._pending.result(self._timeout)
        return {**merge_rank_metrics(per_rank, self.policy_id, self._unmeasured), **self._extra}


class LearnerGroup:
    """`spec.learner.ranks` ranks (0 = one in-process learner) training policy `spec.policy_id`."""

    def __init__(self, spec: LearnerSpec, run_name: str, placement: GroupPlacement | None = None,
                 group: Group[LearnerMember] | None = None):
        """`group`: ranks already built and joined (a colocated policy's view of the shared ranks,
        learners/colocated_group.py); else this policy's own are started here."""
        policy_id, learner, algo, seed = spec.policy_id, spec.learner, spec.algo, spec.seed
        self.policy_id = policy_id
        self.algo_agg = algo.loss_agg
        # Without a KL term a zero-advantage row contributes exactly zero gradient: drop it before the
        # forward pass (the normaliser still counts it, so the update is unchanged).
        self.drop_zero_advantage = algo.skip_zero_advantage and not algo.uses_kl
        self.algo = algo
        self.diagnostics = learner.role_grad_diagnostics
        self.seed = seed
        # With a KL term a zero-advantage row still has a gradient: no step is empty.
        self.skip_empty = algo.skip_empty_optimizer_steps and not algo.uses_kl
        self.timeout = learner.update_timeout_s
        self.sample_rows = sample_size(learner.diagnostics.sample_rows)
        self.policy_move = learner.policy_move
        threads = learner.torch_threads
        if group is not None:
            self.group: Group[LearnerMember] = group
            return
        # here: importing this module (jobs, the config) loads no model code
        from learners.learner import Learner

        self.group = Group(
            Learner, learner.ranks, name=group_name(run_name, "learner", policy_id), args=(spec,),
            options=MemberOptions(num_cpus=learner.rank_num_cpus, env=thread_env(threads) if threads else {}),
            per_member_kwargs=[{"rank": r} for r in range(max(learner.ranks, 1))], placement=placement,
        )
        init_collective(self.group, "gloo", self.timeout)

    def submit_update(self, batch: TrainBatch, step: int = 0) -> UpdateResult:
        """Weights the advantages (mitigations), plans training step `step`'s optimizer steps (PPO
        mini-batches, learners/update/ppo_plan.py), scatters each rank its rows and plan, and starts them."""
        tokens = batch.loss_mask[:, 1:].sum(-1)
        weights = self._mitigation_weights(batch, tokens)
        # A weighted copy: the caller's batch is left as it was handed in.
        batch = dataclasses.replace(batch, advantages=batch.advantages * weights)
        extra = advantage_mass(batch.roles, batch.advantages, tokens)
        mini = self.algo.ppo_mini_batch_size
        if self.algo.parallel_agent_norm:
            mini = effective_mini_batch_size(mini, parallel_agent_weights(batch.roles, batch.agents))
        keep = batch.advantages != 0 if self.drop_zero_advantage else torch.ones(len(batch), dtype=torch.bool)
        extra[f"batch/dropped_zero_adv/{self.policy_id}"] = float((~keep).sum())
        roles = sorted(set(batch.roles)) if self.diagnostics else None
        cut = Cut(self.algo.minibatch_ranks, self.algo.minibatch_chunks == "fixed",
                  self.algo.loss_normalizer == "nominal")
        rows, plans = plan_update(batch.loss_mask[:, 1:], keep, self.group.size, mini, self.algo.ppo_epochs,
                                  self.algo_agg, derive_seed(self.seed, "ppo", step), roles,
                                  shuffle=self.algo.minibatch_shuffle, cut=cut)
        if self.skip_empty:  # decided here, from the whole batch, so that every rank skips the same steps
            skip = tuple(empty_steps(batch.advantages != 0, rows, [p.steps for p in plans]))
            plans = [dataclasses.replace(p, skip=skip) for p in plans]
        sample = self._sample(batch, tokens, rows, plans, step)
        extra[f"update/diag_rows/{self.policy_id}"] = sample.counts["diag"]
        if self.policy_move and self.sample_rows != 0:
            extra[f"update/policy_move_rows/{self.policy_id}"] = sample.counts["move"]
        shards = [Call(LearnerMember.update, batch.select(r), plan)
                  for r, plan in zip(sample.rows, sample.plans, strict=True)]
        return UpdateResult(self.group.submit_each(shards), self.policy_id, self.timeout, extra,
                            sample.unmeasured)

    def _sample(self, batch: TrainBatch, tokens: torch.Tensor, rows: list[list[int]],
                plans: list[UpdatePlan], step: int) -> SampledRows:
        """The rows the no-grad diagnostics measure this step (learners/diagnostic_sample.py), drawn here from
        the whole batch with seeds of (run seed, policy, step): every rank agrees, a rerun draws the same."""
        seeds = (derive_seed(self.seed, "diagnostics", self.policy_id, step, "skipped"),
                 derive_seed(self.seed, "diagnostics", self.policy_id, step, "move"))
        return sample_diagnostics(batch.roles, tokens, rows, plans, self.sample_rows, seeds,
                                  recompute=self.algo.old_logprobs == "recompute")

    def _mitigation_weights(self, batch: TrainBatch, tokens: torch.Tensor) -> torch.Tensor:
        weights = torch.ones(len(batch))
        if self.algo.role_balance:
            weights = weights * role_balance_weights(batch.roles, tokens)
        if self.algo.parallel_agent_norm:
            weights = weights * parallel_agent_weights(batch.roles, batch.agents)
        return weights

    def update(self, batch: TrainBatch, step: int = 0) -> dict[str, float]:
        return self.submit_update(batch, step).result()

    def sync_metrics(self) -> dict[str, float]:
        """Rank 0's measurements of the weights it last handed out for sync (Learner.sync_metrics)."""
        return self.group.submit_to([0], LearnerMember.sync_metrics).result(self.timeout)[0]

    def export(self, out_dir: str) -> str:
        return self.group.submit_to([0], LearnerMember.export, out_dir).result(self.timeout)[0]

    def save(self, path: str) -> None:
        """Every rank writes its part of the policy's state into `path` (learners/state/state_io.py)."""
        self.group.submit(LearnerMember.save_state, path).result(self.timeout)

    def load(self, path: str) -> None:
        """Every rank restores the policy's state from `path`."""
        self.group.submit(LearnerMember.load_state, path).result(self.timeout)

    def offload_states(self) -> dict[str, float]:
        """Every rank's optimizer states off its device (rollout.layout=colocated, during the rollout)."""
        return self._moved(self.group.submit(LearnerMember.offload_states).result(self.timeout), "offload")

    def reload_states(self) -> dict[str, float]:
        """Every rank's states back for the update."""
        return self._moved(self.group.submit(LearnerMember.reload_states).result(self.timeout), "reload")

    def _moved(self, per_rank: list[dict[str, float]], what: str) -> dict[str, float]:
        calls = f"{what}s"
        return {f"{what}/bytes/{self.policy_id}": sum(r["bytes"] for r in per_rank),
                f"{what}/calls/{self.policy_id}": max(r[calls] for r in per_rank)}

    def shutdown(self) -> None:
        self.group.shutdown()

