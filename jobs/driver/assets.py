"""What a run holds before anything runs on the cluster: its layout, each policy's model folder and pad id,
the task family, the prompt sampler and the held-out tasks. `prepare` gathers them once per run; bad model
paths and data fail there, as an InputError, before any member starts."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from jobs.config.schema import TrainConfig
from jobs.driver.handles import model_paths
from jobs.driver.run_data import load_run_data
from jobs.plan.layout import RunLayout, run_layout
from marl.tasks import TaskFamily, get_family
from marl.tasks.sampler import PromptSampler
from marl.types import Task


class InputError(ValueError):
    """The model, the data or a checkpoint cannot be used (missing folder, no valid rows, corrupt, ...)."""


@dataclass
class RunAssets:
    layout: RunLayout  # built once per run: placement, the handles and the metrics all read this one
    model_paths: dict[str, str]  # policy -> its model folder (marl.policies may give a policy its own model)
    family: TaskFamily
    sampler: PromptSampler
    eval_tasks: list[Task]
    pad_ids: dict[str, int]  # policy -> its tokenizer's pad id
    data_metrics: dict[str, float] = dataclasses.field(default_factory=dict)  # data/*, logged with step 0
    full_eval_tasks: list[Task] = dataclasses.field(default_factory=list)  # the whole split (data.eval_full)


def prepare(cfg: TrainConfig) -> RunAssets:
    """Everything the loop needs that does not run on the cluster; bad model paths and data fail here."""
    try:
        return _prepare(cfg)
    except (ValueError, OSError) as e:
        raise InputError(str(e)) from e


def _prepare(cfg: TrainConfig) -> RunAssets:
    layout = run_layout(cfg)
    paths = model_paths(layout)  # each policy's own model (marl.policies), else model.path
    data = load_run_data(cfg)
    print(f"[{cfg.run_name}] {data.summary}", flush=True)
    family = get_family(cfg.data.task, cfg.data.answer_fallback, cfg.data.sandbox)
    pads = {path: _pad_id(path) for path in set(paths.values())}
    return RunAssets(layout, paths, family, PromptSampler(data.train, cfg.seed), data.eval,
                     {pid: pads[path] for pid, path in paths.items()}, data.metrics, data.full_eval)


def _pad_id(model_path: str) -> int:
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(model_path)
    except Exception as e:  # noqa: BLE001 - transformers raises many kinds for a damaged folder
        raise InputError(f"model.path={model_path!r} cannot be loaded as a tokenizer: {e}") from e
    return tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
