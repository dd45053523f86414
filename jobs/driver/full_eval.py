"""The whole held-out split, evaluated at the end of a run (`data.eval_full`): the final
weights, then the peak checkpoint's.

Periodic evaluations use a fixed draw of `data.eval_size` tasks, cheap enough for every checkpoint; the
numbers a run reports as final and peak accuracy come from every row of `data.eval`, as the paper evaluates on
its whole held-out split. The peak checkpoint is the most accurate one on the draw
(jobs.driver.run_checkpoints.best); when the final weights score at least as well on the draw, they are the
peak and are not evaluated twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from jobs.driver import run_checkpoints as ckpt
from marl.types import Task

Evaluate = Callable[[list[Task]], float]  # pass@1 of the weights the engines serve now
Restore = Callable[[Path], None]  # load a checkpoint's learner state and serve it


def peak_checkpoint(root: Path, final_accuracy: float) -> Path | None:
    """The checkpoint to evaluate as the peak: the best on the draw, unless the
    final weights match or beat it."""
    folder = ckpt.best(root)
    if folder is None:
        return None
    accuracy = ckpt.read_progress(folder).eval_accuracy
    return folder if accuracy is not None and accuracy > final_accuracy else None


def full_evaluation(tasks: list[Task], evaluate: Evaluate, final_step: int, final_accuracy: float, root: Path,
                    restore: Restore) -> dict[str, float]:
    """{eval/full/accuracy, eval/full/peak_accuracy, eval/full/peak_step, eval/full/tasks, time/eval_full_s}.
    Run after the final weights are exported: evaluating the peak leaves the engines serving its weights."""
    t0 = time.perf_counter()
    final = evaluate(tasks)
    metrics = {
        "eval/full/accuracy": final,
        "eval/full/peak_accuracy": final,
        "eval/full/peak_step": float(final_step),
        "eval/full/tasks": float(len(tasks)),
    }
    folder = peak_checkpoint(root, final_accuracy)
    if folder is not None:
        restore(folder)
        metrics.update({"eval/full/peak_accuracy": evaluate(tasks),
                        "eval/full/peak_step": float(ckpt.read_progress(folder).step)})
    return {**metrics, "time/eval_full_s": time.perf_counter() - t0}
