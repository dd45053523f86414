"""A learner backend in a module of its own, outside the package: plain SGD instead of the learner's AdamW.
It registers itself by declaring `BACKEND`; `learner.backend=tests.learners.user_backend` names it, and every
process that builds a rank (the driver, a Ray actor) imports this module when it reads that key."""

from __future__ import annotations

import math

import torch

from learners.gradients.torch_backend import TorchBackend


class SgdBackend(TorchBackend):
    """The torch backend whose step is p ← p − lr·g (no moments), so its update differs from AdamW's."""

    def step(self) -> tuple[float, float, bool]:
        lr = float(self.parts.optimizer.param_groups[0]["lr"])
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.parts.params, self.grad_clip or float("inf")))
        if not math.isfinite(grad_norm):
            return lr, grad_norm, False
        with torch.no_grad():
            for p in self.parts.params:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-lr)
        return lr, grad_norm, True


BACKEND = SgdBackend
