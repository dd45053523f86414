"""A learner's optimizer states off the device while engines roll out on its GPU (rollout.layout=colocated),
and back for the update.

`OptimizerStash` moves a torch optimizer's state tensors (AdamW's moments and step counters) to host memory
and back (the torch backend's; DeepSpeed has its own `engine.offload_states`, learners/gradients/
deepspeed_backend.py): each state tensor is replaced by an empty one while away, so its device storage is
really freed, and the copy that comes back holds the same bits. On GPU the host copies are pinned.
`Offloads` is the learner's bookkeeping around either: whether the states are away, the calls, and a scope
in which they are resident (a checkpoint saves the real states, never the placeholders).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch


class OptimizerStash:
    """A torch optimizer's state tensors in host memory while offloaded."""

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.optimizer = optimizer
        # (a parameter's state dict, key, host copy, the device it came from)
        self._held: list[tuple[dict, str, torch.Tensor, torch.device]] = []

    def offload(self) -> float:
        """Every state tensor to the host; returns the bytes moved."""
        moved = 0
        for state in self.optimizer.state.values():
            for key, value in state.items():
                if not isinstance(value, torch.Tensor) or value.numel() == 0:
                    continue
                host = value.detach().to("cpu", copy=True)
                if value.is_cuda:
                    host = host.pin_memory()
                self._held.append((state, key, host, value.device))
                moved += value.numel() * value.element_size()
                # The placeholder frees the device storage; a step taken while offloaded fails on its shape.
                state[key] = torch.empty(0, dtype=value.dtype, device=value.device)
        return float(moved)

    def reload(self) -> float:
        """Every state tensor back where it was; returns the bytes moved."""
        moved = 0
        for state, key, host, device in self._held:
            state[key] = host.to(device, copy=True)
            moved += host.numel() * host.element_size()
        self._held = []
        return float(moved)


class Offloads:
    """Whether a learner's states are offloaded, and how often they were moved."""

    def __init__(self, offload: Callable[[], float], reload: Callable[[], float]):
        self._offload, self._reload = offload, reload
        self.away = False
        self.offloads = 0
        self.reloads = 0

    def offload(self) -> dict[str, float]:
        """{"bytes": moved, "offloads": calls so far}; nothing moves when the states are away already."""
        moved = 0.0
        if not self.away:
            moved, self.away = self._offload(), True
            self.offloads += 1
        return {"bytes": moved, "offloads": float(self.offloads)}

    def reload(self) -> dict[str, float]:
        moved = 0.0
        if self.away:
            moved, self.away = self._reload(), False
            self.reloads += 1
        return {"bytes": moved, "reloads": float(self.reloads)}

    def check_resident(self, what: str) -> None:
        if self.away:
            raise RuntimeError(f"learner: {what} with its optimizer states offloaded; reload_states first")

    @contextlib.contextmanager
    def resident(self) -> Iterator[None]:
        """The states on the device inside, as they were (offloaded or not) after: checkpoints and exports
        between phases see the real states. Not counted as phase calls."""
        away = self.away
        if away:
            self._reload()
            self.away = False
        try:
            yield
        finally:
            if away:
                self._offload()
                self.away = True
