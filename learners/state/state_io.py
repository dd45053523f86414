"""Learner-state I/O: what one rank of a policy writes into, and reads back from, a checkpoint folder.

The interface of every learner rank (Learner, through its gradient backend: the torch backend writes the files
described here, DeepSpeed its engine's layout under the same contract):

    save_state(path: str) -> None
    load_state(path: str) -> None

Both are called collectively on every rank of one policy with the same folder `path` (one per policy,
on storage every rank can reach). On `save_state`, rank 0 writes the trainable weights (the LoRA adapter
alone when the policy is LoRA), the optimizer state, the LR scheduler state and the update counter; every
rank writes its own RNG state (`rng_rank<r>.pt`: torch, python `random`, numpy). Every file is fsynced
before the call returns, so the caller may commit the folder (rename + manifest) as soon as all ranks
have returned. On `load_state`, every rank reads the weights, optimizer and scheduler written by rank 0
(data-parallel ranks hold identical copies) and its own RNG file; a missing or unreadable file raises
`StateError` naming it. The caller owns the folder's atomicity: nothing here renames or deletes.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

MODEL, OPTIMIZER, SCHEDULER = "model.pt", "optimizer.pt", "scheduler.pt"


class StateError(RuntimeError):
    """A learner-state file is missing or unreadable; the message names the file."""


def rng_file(rank: int) -> str:
    return f"rng_rank{rank}.pt"


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The parameters the optimizer updates, by name: all weights in full fine-tuning, the adapter in LoRA.
    Frozen base weights are re-read from the model folder, so a LoRA checkpoint stays adapter-sized."""
    return {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}


def save_learner_state(path: str | Path, rank: int, model: torch.nn.Module, optimizer: Any, scheduler: Any,
                       step: int) -> None:
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    if rank == 0:
        write_fsynced(folder / MODEL, {"weights": trainable_state(model), "step": step})
        write_fsynced(folder / OPTIMIZER, optimizer.state_dict())
        write_fsynced(folder / SCHEDULER, scheduler.state_dict())
    rng = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    write_fsynced(folder / rng_file(rank), rng)


def load_learner_state(path: str | Path, rank: int, model: torch.nn.Module, optimizer: Any,
                       scheduler: Any) -> int:
    """Restore one rank in place; returns the update counter stored with the weights."""
    folder = Path(path)
    saved = read_state(folder / MODEL)
    weights = saved["weights"]
    expected = trainable_state(model)
    missing = sorted(set(expected) - set(weights))
    if missing:
        raise StateError(
            f"{folder / MODEL} lacks trainable weights {missing[:3]} (another model or LoRA setting?)"
        )
    with torch.no_grad():
        for name, tensor in expected.items():
            if tensor.shape != weights[name].shape:
                raise StateError(f"{folder / MODEL}: {name} has shape {tuple(weights[name].shape)}, "
                                 f"the model has {tuple(tensor.shape)}")
            tensor.copy_(weights[name])
    optimizer.load_state_dict(read_state(folder / OPTIMIZER))
    scheduler.load_state_dict(read_state(folder / SCHEDULER))
    rng = read_state(folder / rng_file(rank))
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    return int(saved["step"])


def read_state(file: Path) -> Any:
    if not file.is_file():
        raise StateError(f"checkpoint file missing: {file}")
    try:
        # weights_only=False: the RNG and optimizer states hold plain python/numpy objects we wrote ourselves.
        return torch.load(file, map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means the file is unusable
        raise StateError(f"checkpoint file unreadable: {file}: {e}") from e


def write_fsynced(file: Path, obj: Any) -> None:
    """torch.save, then fsync: the bytes are on disk before the caller commits the folder."""
    with open(file, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
