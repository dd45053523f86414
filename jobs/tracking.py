"""Run directory and metric sinks: metrics.jsonl (one line per step), TensorBoard, the console line."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


class RunLog:
    """Appends each step's flat metric dict to `<run>/metrics.jsonl` and TensorBoard."""

    def __init__(self, run_dir: Path, tensorboard: bool = True):
        self.run_dir = run_dir
        self.path = run_dir / "metrics.jsonl"
        self._writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(str(run_dir / "tb"))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, **metrics}) + "\n")
        if self._writer is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)) and math.isfinite(v):
                    self._writer.add_scalar(k, v, step)
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    with (Path(run_dir) / "metrics.jsonl").open() as f:
        return [json.loads(line) for line in f if line.strip()]


def progress_line(step: int, steps: int, m: dict[str, float], roles: list[str]) -> str:
    rewards = " ".join(f"{r}={m.get(f'reward/mean/{r}', float('nan')):.2f}" for r in roles)
    return (f"step {step + 1}/{steps}  reward {m.get('reward/mean', float('nan')):.3f}  [{rewards}]  "
            f"rollout {m['time/rollout_s']:.1f}s update {m['time/update_s']:.1f}s sync {m['time/sync_s']:.2f}s")
