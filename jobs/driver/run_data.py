"""The run's data: the train and eval tasks its config names, chosen with the run's seed, held out from each
other, and summarised (one start-up line and the `data/*` metrics of step 0).

- Listing sources (files, gsm8k, humaneval) give every row, or `data.*_size` rows chosen by a seeded shuffle;
  generated sources (reasoning_gym:*, digit, code_synthetic) generate exactly that many from the seed.
- Eval draws with seed + EVAL_SEED_OFFSET: reasoning-gym item i of seed s is generated from s + i, so eval at
  seed + 1 would replay training items 1, 2, ... exactly; the offset keeps the two ranges apart.
- Overlap: eval tasks whose normalised prompt (marl.tasks.overlap) is also a train prompt. Above
  `data.max_overlap` (a fraction of the eval tasks) a generated train set drops those prompts (a small
  procedural prompt space repeats prompts whatever the seeds); any other train source is an input error
  naming both sources, since silently editing a user's split would hide it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from jobs.config.schema import TrainConfig
from marl.tasks import TASKS
from marl.tasks.overlap import prompt_set, shared_tasks, without_prompts
from marl.types import Task

EVAL_SEED_OFFSET = 1_000_000_000  # larger than any train_size: eval's generator seeds never meet train's


@dataclass
class DataSplits:
    """The run's train, eval and full-eval tasks, from which `prepare` builds its RunAssets; `metrics` go into
    step 0's metrics, `summary` is the start-up line."""

    train: list[Task]
    eval: list[Task]
    metrics: dict[str, float]
    summary: str
    full_eval: list[Task]  # every row of data.eval with data.eval_full, else none


def load_run_data(cfg: TrainConfig) -> DataSplits:
    """Train and eval tasks for `cfg.data` with `cfg.seed`. Raises ValueError naming the data sources."""
    d, family = cfg.data, TASKS[cfg.data.task]
    eval_spec = family.eval_source(d.eval)
    # The eval draw does not follow the run's seed: every seed of a study evaluates the same held-out tasks.
    eval_tasks = family.load(eval_spec, d.eval_size, d.eval_seed + EVAL_SEED_OFFSET) if d.eval_size else []
    train = family.load(d.train, d.train_size or None, cfg.seed)
    train, dropped = hold_out(train, eval_tasks, d.train, eval_spec, d.max_overlap, family.generated)
    prompts = len(prompt_set(train))
    shared = len(shared_tasks(train, eval_tasks))
    seen = cfg.steps * cfg.rollout.prompts_per_step
    metrics = {"data/train_tasks": float(len(train)), "data/train_prompts": float(prompts),
               "data/train_dropped": float(dropped), "data/eval_tasks": float(len(eval_tasks)),
               "data/overlap": float(shared), "data/epochs": seen / prompts}
    summary = (
        f"data: train {d.train}: {len(train)} tasks, {prompts} unique prompts"
        f"{f' ({dropped} dropped: eval prompts)' if dropped else ''}; "
        f"eval {eval_spec if eval_tasks else '-'}: "
        f"{len(eval_tasks)} tasks, {shared} also in train; {cfg.steps} steps x "
        f"{cfg.rollout.prompts_per_step} prompts = {seen / prompts:.2f} epochs"
    )
    full = family.load(eval_spec, None, d.eval_seed + EVAL_SEED_OFFSET) if d.eval_full else []
    if full:
        summary += f"; the whole eval split ({len(full)} tasks) at the end"
    return DataSplits(train, eval_tasks, metrics, summary, full)


def hold_out(train: list[Task], eval_tasks: list[Task], train_spec: str, eval_spec: str,
             max_overlap: float, generated: Callable[[str], bool]) -> tuple[list[Task], int]:
    """`train` with at most `max_overlap` of the eval tasks' prompts in it, and how many tasks it dropped.

    Within the limit `train` is kept as is; above it a train set that `generated` (the family's) says is
    generated loses every eval prompt, any other is a ValueError naming both sources."""
    shared = shared_tasks(train, eval_tasks)
    if not shared or len(shared) / len(eval_tasks) <= max_overlap:
        return train, 0
    if generated(train_spec):
        kept = without_prompts(train, prompt_set(shared))
        if not kept:
            raise ValueError(
                f"data.train={train_spec}: every generated prompt is also a prompt of "
                f"data.eval={eval_spec}; draw eval from another generator or raise data.max_overlap"
            )
        return kept, len(train) - len(kept)
    raise ValueError(
        f"data.eval={eval_spec} shares {len(shared)} of its {len(eval_tasks)} prompts with "
        f"data.train={train_spec} "
        f"(compared lowercased, whitespace collapsed; e.g. {shared[0].prompt[:80]!r}); data.max_overlap="
        f"{max_overlap} allows a fraction {max_overlap} of the eval prompts: split train and eval apart "
        "(python -m jobs.prepare_data) or raise data.max_overlap"
    )
