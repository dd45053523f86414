"""The choices of config keys that several learner modules name, as Enums, in a leaf module:
learners/config.py types the config with them, and the modules that implement them (the schedules) import them
too, so neither imports the other for a name."""

from __future__ import annotations

from enum import StrEnum


class Schedule(StrEnum):
    """`learner.optim.schedule`: the names of SCHEDULES (the config schema's type for the key)."""

    cosine = "cosine"
    constant = "constant"


class ScheduleUnit(StrEnum):
    """`learner.optim.schedule_unit`: what a schedule's position counts (schedule_position)."""

    step = "step"
    optimizer_step = "optimizer_step"
    update_call = "update_call"
