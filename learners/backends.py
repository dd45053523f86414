"""Learner backends by name (`learner.backend`): the class a LearnerGroup hosts as its ranks.

Every backend exposes the Learner interface (update, get_weights, get_adapter, export, save_state, load_state,
rendezvous_address, join). The deepspeed module imports deepspeed only when a rank builds its engine, so
resolving the class works on a machine without it.
"""

from __future__ import annotations

BACKENDS = ("torch", "deepspeed")


def rank_class(backend: str) -> type:
    if backend == "torch":
        from learners.learner import Learner

        return Learner
    if backend == "deepspeed":
        from learners.deepspeed_backend import DeepSpeedLearner

        return DeepSpeedLearner
    raise ValueError(f"learner.backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
