"""LearnerGroup: the data-parallel ranks of one policy, hosted by cluster.Group.

The driver hands over a whole TrainBatch; the group computes the global loss normaliser from it (no
collective needed), scatters contiguous shards, and merges the ranks' metric sums into per-policy means.
"""

from __future__ import annotations

from typing import Any

from cluster.collective import init_collective
from cluster.group import Group, MemberOptions, Pending
from learners.batch import TrainBatch
from learners.learner import Learner
from learners.losses import local_normalizer


class UpdateResult:
    """An update in flight; `result()` waits (with the group's deadline) and returns its metrics."""

    def __init__(self, pending: Pending, policy_id: str, timeout: float, extra: dict[str, float]):
        self._pending, self.policy_id, self._timeout, self._extra = pending, policy_id, timeout, extra

    def result(self) -> dict[str, float]:
        return {**merge_rank_metrics(self._pending.result(self._timeout), self.policy_id), **self._extra}


class LearnerGroup:
    """`learner.ranks` ranks (0 = one in-process learner) training policy `policy_id`."""

    def __init__(self, policy_id: str, model_path: str, model: Any, learner: Any, algo: Any,
                 temperature: float, total_steps: int, seed: int, run_name: str):
        self.policy_id, self.algo_agg = policy_id, algo.loss_agg
        # Without a KL term a zero-advantage row contributes exactly zero gradient: drop it before the
        # forward pass (the normaliser still counts it, so the update is unchanged).
        self.drop_zero_advantage = algo.kl_coef == 0
        self.timeout = learner.update_timeout_s
        threads = learner.torch_threads
        self.group = Group(
            Learner, learner.ranks, name=f"{run_name}:learner:{policy_id}",
            args=(policy_id, model_path, model, learner, algo, temperature, total_steps, seed),
            options=MemberOptions(num_cpus=learner.rank_num_cpus, env={"OMP_NUM_THREADS": str(threads)}),
            per_member_kwargs=[{"rank": r} for r in range(max(learner.ranks, 1))],
        )
        init_collective(self.group, "gloo", self.timeout)

    def submit_update(self, batch: TrainBatch) -> UpdateResult:
        normalizer = local_normalizer(batch.loss_mask[:, 1:], self.algo_agg)
        rows = len(batch)
        if self.drop_zero_advantage:
            batch = batch.select(batch.advantages != 0)
        shards = [(batch.shard(r, self.group.size).to_dict(), normalizer) for r in range(self.group.size)]
        pending = self.group.submit_each("update", shards)
        return UpdateResult(pending, self.policy_id, self.timeout, {f"batch/dropped_zero_adv/{self.policy_id}":
                                                                    float(rows - len(batch))})

    def update(self, batch: TrainBatch) -> dict[str, float]:
        return self.submit_update(batch).result()

    def export(self, out_dir: str) -> str:
        return self.group.call("export", out_dir, indices=[0], timeout=self.timeout)[0]

    def shutdown(self) -> None:
        self.group.shutdown()


def merge_rank_metrics(per_rank: list[dict[str, float]], policy_id: str) -> dict[str, float]:
    """Sum the ranks' sums; grad norm and lr are identical on every rank, so rank 0's are taken."""
    total: dict[str, float] = {}
    for m in per_rank:
        for k, v in m.items():
            total[k] = total.get(k, 0.0) + v
    out = {f"loss/{policy_id}": total["loss"], f"grad/norm/{policy_id}": per_rank[0]["grad_norm"],
           f"lr/{policy_id}": per_rank[0]["lr"],
           f"clip_frac/{policy_id}": total["clip_frac_sum"] / max(total["tokens"], 1.0)}
    for key, value in total.items():
        if key.startswith(("entropy_sum/", "logprob_diff_sum/", "kl_sum/")):
            metric, role = key.split("_sum/")
            out[f"{_METRIC_NAMES[metric]}/{role}"] = value / max(total.get(f"tokens/{role}", 0.0), 1.0)
    return out


_METRIC_NAMES = {"entropy": "entropy", "logprob_diff": "rollout/logprob_diff", "kl": "kl"}
