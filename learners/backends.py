"""Learner backends by name (`learner.backend`): the class a LearnerGroup hosts as its ranks.

Every backend implements learners.member.LearnerMember. The deepspeed module imports deepspeed only when a rank
builds its engine, so resolving the class works on a machine without it.
"""

from __future__ import annotations

from typing import Literal, get_args

from learners.member import LearnerMember

LearnerBackend = Literal["torch", "deepspeed"]
BACKENDS: tuple[LearnerBackend, ...] = get_args(LearnerBackend)


def rank_class(backend: str) -> type[LearnerMember]:
    if backend == "torch":
        from learners.learner import Learner

        return Learner
    if backend == "deepspeed":
        from learners.deepspeed_backend import DeepSpeedLearner

        return DeepSpeedLearner
    raise ValueError(f"learner.backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
