"""Run directory and metric sinks: metrics.jsonl (one line per step), TensorBoard, Ray dashboard metrics,
MLflow and W&B (optional, imported only when enabled), and the console (a progress bar on a terminal, else
one line per step).

Every sink is a step callback (`on_step(step, metrics, checkpoint)`) plus `close()`, so a caller can also
hand one to `jobs.train.train(cfg, callbacks)` directly.
"""

from __future__ import annotations

import importlib
import json
import math
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import IO, Any
from urllib.parse import urlparse

from omegaconf import OmegaConf

from cluster.ray_metrics import NAN_IS_A_VALUE, NONFINITE_SENTINEL  # shared with the dashboard sink
from jobs.config import ConfigError
from jobs.config.schema import TrainConfig
from marl.types import JsonRecord


class RunLog:
    """Appends each step's flat metric dict to `<run>/metrics.jsonl` and hands it to every sink."""

    def __init__(self, run_dir: Path, tensorboard: bool = True, sinks: tuple[Any, ...] = (),
                 display: StepDisplay | None = None, first_row: dict[str, Any] | None = None):
        self.run_dir = run_dir
        # non-metric fields (jobs/driver/provenance.py) for metrics.jsonl alone
        self.first_row = dict(first_row or {})
        self.path = run_dir / "metrics.jsonl"
        self.sinks = (*((TensorBoardSink(run_dir / "tb"),) if tensorboard else ()), *sinks)
        self.display = display

    @classmethod
    def for_run(cls, run_dir: Path, cfg: TrainConfig, roles: list[str],
                first_row: dict[str, Any] | None = None) -> RunLog:
        """The sinks `cfg.tracking` asks for; a missing optional package fails
        here, before any cluster work."""
        t = cfg.tracking
        sinks: list[Any] = []
        if t.ray_metrics:
            from jobs.telemetry.dashboard import dashboard_sink

            sinks.append(dashboard_sink(cfg))
        if t.mlflow.enabled:
            sinks.append(MlflowSink(t.mlflow.uri, t.mlflow.experiment, t.mlflow.run_name or cfg.run_name,
                                    flat_config(cfg)))
        if t.wandb.enabled:
            sinks.append(
                WandbSink(
                    t.wandb.project,
                    t.wandb.run_name or cfg.run_name,
                    str(t.wandb.mode),
                    run_dir,
                    flat_config(cfg),
                )
            )
        return cls(run_dir, t.tensorboard, tuple(sinks), StepDisplay(cfg.steps, roles, t.progress), first_row)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        row = {**metrics, **derived_metrics(metrics)}
        row |= nonfinite_flags(row)
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, **self.first_row, **row}) + "\n")
        self.first_row = {}
        for sink in self.sinks:
            sink.on_step(step, row, None)

    def progress(self, step: int, metrics: dict[str, float]) -> None:
        """The console after a finished step (kept apart from `log`, which also takes the final eval row)."""
        if self.display is not None:
            self.display.step_done(step, metrics)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
        if self.display is not None:
            self.display.close()


def derived_metrics(m: dict[str, float]) -> dict[str, float]:
    """Rates the step reports only as parts: rollout/tokens_per_s = rollout/tokens / time/rollout_s."""
    if "rollout/tokens_per_s" not in m and m.get("time/rollout_s", 0) > 0 and "rollout/tokens" in m:
        return {"rollout/tokens_per_s": m["rollout/tokens"] / m["time/rollout_s"]}
    return {}


# An inf metric (the grad norm of a step that overflowed) is neither dropped nor sent as is (sinks differ in
# what they accept): every sink gets it as ±NONFINITE_SENTINEL and, from RunLog.log, `<key>/nonfinite` = 1
# beside it; metrics.jsonl keeps the value itself (Infinity). NaN also stands for "undefined this step"
# (eval/accuracy without an eval, a ratio of empty counts) and is dropped as such, except under
# NAN_IS_A_VALUE, where it is a gradient gone non-finite: sent as +NONFINITE_SENTINEL, flagged 2.


def _nonfinite_flag(key: str, v: Any) -> float | None:
    """1.0 for an infinite number, 2.0 for a NaN that is a value (NAN_IS_A_VALUE), else None."""
    if not _number(v) or math.isfinite(v):
        return None
    if math.isinf(v):
        return 1.0
    return 2.0 if key.startswith(NAN_IS_A_VALUE) else None


def nonfinite_flags(metrics: Mapping[str, Any]) -> dict[str, float]:
    """`<key>/nonfinite` (`_nonfinite_flag`) for every flagged number of `metrics`."""
    return {f"{k}/nonfinite": flag for k, v in metrics.items() if (flag := _nonfinite_flag(k, v)) is not None}


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """The numbers of `metrics` as a sink takes them: finite ones as they are, flagged ones
    (`_nonfinite_flag`) as the sentinel of their sign, undefined NaNs left out."""
    out = {}
    for k, v in metrics.items():
        if _number(v) and math.isfinite(v):
            out[k] = float(v)
        elif _nonfinite_flag(k, v) is not None:
            out[k] = -NONFINITE_SENTINEL if v < 0 else NONFINITE_SENTINEL
    return out


def flat_config(cfg: TrainConfig) -> dict[str, str]:
    """The resolved config as `a.b.c -> value` strings (run parameters for MLflow and W&B)."""
    out: dict[str, str] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict) and node:
            for k, v in node.items():
                walk(v, f"{prefix}{k}.")
        else:
            out[prefix[:-1]] = str(node)

    walk(OmegaConf.to_container(cfg, resolve=True), "")
    return out


def require(module: str, key: str) -> ModuleType:
    """Imports an optional tracking package, or fails naming the config key that asked for it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(f"config: {key}=true needs the `{module}` package, which is not installed "
                          f"(pip install -e '.[tracking]')") from e


class TensorBoardSink:
    def __init__(self, log_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(str(log_dir))

    def on_step(self, step: int, metrics: dict[str, float], checkpoint: Path | None = None) -> None:
        for k, v in _scalars(metrics).items():
            self._writer.add_scalar(k, v, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class MlflowSink:
    """One MLflow run per training run, through an explicit client (no process-global active run, so
    several runs in one process, as Tune trials are, stay apart).

    A file store (file:// or a plain path) keeps each metric in a file named by its key, where
    `reward/mean` (a file) and `reward/mean/<role>` (a folder) cannot coexist: there keys use `.` for `/`."""

    _BATCH = 100  # MLflow's per-request limit on params (metrics allow more; one batch per step suffices)

    def __init__(self, uri: str, experiment: str, run_name: str, params: dict[str, str]):
        mlflow = require("mlflow", "tracking.mlflow.enabled")
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self._client = MlflowClient(tracking_uri=uri or None)
        resolved = uri or mlflow.get_tracking_uri()
        self._flat_keys = urlparse(resolved).scheme in ("", "file")
        self.run_id = self._client.create_run(self._experiment_id(experiment), run_name=run_name).info.run_id
        items = [Param(k, v[:6000]) for k, v in params.items()]  # 6000: MLflow's longest param value
        for i in range(0, len(items), self._BATCH):
            self._client.log_batch(self.run_id, params=items[i:i + self._BATCH])

    def _experiment_id(self, name: str) -> str:
        exp = self._client.get_experiment_by_name(name)
        if exp is not None:
            return exp.experiment_id
        try:
            return self._client.create_experiment(name)
        except Exception:  # noqa: BLE001 - another run (a parallel trial) created it first
            exp = self._client.get_experiment_by_name(name)
            if exp is None:
                raise
            return exp.experiment_id

    def on_step(self, step: int, metrics: dict[str, float], checkpoint: Path | None = None) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k.replace("/", ".") if self._flat_keys else k, v, now, step)
                 for k, v in _scalars(metrics).items()]
        self._client.log_batch(self.run_id, metrics=batch)

    def close(self) -> None:
        self._client.set_terminated(self.run_id)


class WandbSink:
    """One W&B run per training run; `mode=offline` writes under the run dir for a later `wandb sync`."""

    def __init__(self, project: str, run_name: str, mode: str, run_dir: Path, params: dict[str, str]):
        wandb = require("wandb", "tracking.wandb.enabled")
        self.run = wandb.init(project=project, name=run_name, mode=mode, dir=str(run_dir), config=params,
                              reinit="create_new")

    def on_step(self, step: int, metrics: dict[str, float], checkpoint: Path | None = None) -> None:
        self.run.log(_scalars(metrics), step=step, commit=True)  # not held back until the next step arrives

    def close(self) -> None:
        self.run.finish()


class StepDisplay:
    """The console: on a terminal a bar over steps (and, when told, over a step's episodes), tqdm if it is
    installed; otherwise one plain line per step, which logs and `ray job logs` keep readable.

    mode: auto (bar only when `stream` is a terminal) | bar | line. Updates happen once per step and per
    finished episode, and tqdm redraws at most every `mininterval` seconds, so the loop never waits on the
    console."""

    def __init__(self, steps: int, roles: list[str], mode: str = "auto", stream: IO[str] | None = None,
                 mininterval: float = 0.5):
        self.steps = steps
        self.roles = list(roles)
        self.stream = stream or sys.stdout
        self.mininterval = mininterval
        self._tqdm: Any = _tqdm() if mode == "bar" or (mode == "auto" and self.stream.isatty()) else None
        self._bar: Any = None
        self._episodes: Any = None

    def step_done(self, step: int, metrics: dict[str, float]) -> None:
        if self._tqdm is None:
            print(progress_line(step, self.steps, metrics, self.roles), file=self.stream, flush=True)
            return
        bar = self._step_bar()
        bar.set_postfix_str(_postfix(metrics, self.roles), refresh=False)
        bar.update(step + 1 - bar.n)  # resumed runs start past 0

    def episodes(self, done: int, total: int) -> None:
        """Rollout progress within a step (episodes finished of `total`); a no-op without a bar."""
        if self._tqdm is None:
            return
        if self._episodes is None:
            self._step_bar()  # the step bar stays on top
            self._episodes = self._tqdm(
                total=total, unit="episode", leave=False, position=1, **self._bar_options()
            )
        self._episodes.update(done - self._episodes.n)
        if done >= total:
            self._episodes.close()
            self._episodes = None

    def _step_bar(self) -> Any:
        if self._bar is None:
            self._bar = self._tqdm(total=self.steps, unit="step", **self._bar_options())
        return self._bar

    def _bar_options(self) -> JsonRecord:
        # shutil falls back to 80x24 where a terminal reports a size of 0 (some CI and `script` ptys), where
        # tqdm would draw nothing (no columns; every bar "below" a 0-row screen hidden).
        size = shutil.get_terminal_size()
        return {
            "file": self.stream,
            "mininterval": self.mininterval,
            "ncols": size.columns,
            "nrows": size.lines,
        }

    def close(self) -> None:
        for bar in (self._episodes, self._bar):
            if bar is not None:
                bar.close()


def _tqdm() -> Any:
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm


def _postfix(m: dict[str, float], roles: list[str]) -> str:
    rewards = " ".join(f"{r}={m.get(f'reward/mean/{r}', float('nan')):.2f}" for r in roles)
    mean, step_s = m.get("reward/mean", float("nan")), m.get("time/step_s", float("nan"))
    return f"reward {mean:.3f} [{rewards}] {step_s:.1f}s/step"


def read_metrics(run_dir: str | Path) -> list[JsonRecord]:
    with (Path(run_dir) / "metrics.jsonl").open() as f:
        return [json.loads(line) for line in f if line.strip()]


def progress_line(step: int, steps: int, m: dict[str, float], roles: list[str]) -> str:
    nan = float("nan")
    rewards = " ".join(f"{r}={m.get(f'reward/mean/{r}', nan):.2f}" for r in roles)
    return (f"step {step + 1}/{steps}  reward {m.get('reward/mean', nan):.3f}  [{rewards}]  "
            f"rollout {m.get('time/rollout_s', nan):.1f}s update {m.get('time/update_s', nan):.1f}s "
            f"sync {m.get('time/sync_s', nan):.2f}s")
