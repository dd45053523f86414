"""Every policy's update of one step: all learner groups at once, or one after another when concurrent CPU
updates would oversubscribe the node's cores (`learner.concurrent_updates`)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor

from cluster.threads import threads_for
from learners.batch import TrainBatch, empty_batch
from learners.config import LearnerConfig
from learners.group import LearnerGroup


def run_concurrently(learner: LearnerConfig, policies: int, cores: int | None = None) -> bool:
    """`learner.concurrent_updates`: true | false | auto (None). auto: concurrent unless the policies' CPU
    learners need more threads than the node has cores (each then waits on the others' threads and every
    update gets slower than running them in turn); GPU learners always run concurrently."""
    if learner.concurrent_updates is not None:
        return learner.concurrent_updates
    cores = cores or os.cpu_count() or 1
    if learner.rank_num_gpus > 0:
        return True
    # An in-process learner (ranks 0) uses every core of the driver's process.
    threads = threads_for(learner.rank_num_cpus, learner.torch_threads) if learner.ranks else cores
    return policies * max(learner.ranks, 1) * threads <= cores


def update_all(learners: dict[str, LearnerGroup], batches: dict[str, TrainBatch], step: int,
               pad_ids: Mapping[str, int], concurrent: bool,
               during: Callable[[], None] | None = None) -> tuple[dict[str, float], float]:
    """Runs every policy's update for training step `step` and, meanwhile in this thread, `during` (the next
    step's rollout). `pad_ids`: policy -> its tokenizer's pad id (an empty batch's). Returns (the updates'
    metrics, seconds `during` took)."""
    def batch(pid: str) -> TrainBatch:
        return batches.get(pid) or empty_batch(pid, pad_ids[pid])

    if concurrent:
        pending = [lg.submit_update(batch(pid), step) for pid, lg in learners.items()]
        prefetch_s = _timed(during)
        return {k: v for u in pending for k, v in u.result().items()}, prefetch_s
    with ThreadPoolExecutor(1, thread_name_prefix="updates") as pool:  # in turn, beside `during`
        chain = pool.submit(lambda: [lg.update(batch(pid), step) for pid, lg in learners.items()])
        prefetch_s = _timed(during)
        return {k: v for m in chain.result() for k, v in m.items()}, prefetch_s


def _timed(fn: Callable[[], None] | None) -> float:
    if fn is None:
        return 0.0
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


class SkippedStepsError(RuntimeError):
    """A policy's optimizer steps did not apply `learner.max_consecutive_skipped_steps` times in a row."""


def check_skipped_steps(metrics: Mapping[str, float], limit: int, step: int) -> None:
    """SkippedStepsError naming the policy whose run of consecutive optimizer steps that did not apply
    (`update/nonfinite_run/<policy>`, learners/rank_metrics.py) reached `limit`; 0 never stops."""
    prefix = "update/nonfinite_run/"
    for key, run in metrics.items():
        if limit and key.startswith(prefix) and run >= limit:
            pid = key[len(prefix):]
            raise SkippedStepsError(
                f"policy {pid!r}: its last {int(run)} optimizer steps did not apply (the gradient norm was "
                f"inf or NaN, grad/norm/{pid}={metrics.get(f'grad/norm/{pid}', float('nan'))}; DeepSpeed "
                f"reports these as 'OVERFLOW! Skipping step'), up to step {step}: the weights no longer "
                f"move. learner.max_consecutive_skipped_steps={limit} (0 = never stop); lower "
                "learner.optim.lr, or find what turns the gradient non-finite (model.dtype overflow, "
                "the loss's inputs)"
            )
