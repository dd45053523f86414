"""Leaving the process group that in-process learners joined, for test modules that run them."""

from __future__ import annotations

import sys

import torch.distributed as dist


def leave_process_group() -> None:
    """Destroy this process's process group, if it has one. Where DeepSpeed set up its communication on it,
    through DeepSpeed, which then also drops the groups it cached of it (a clone of the world group): a later
    module's in-process DeepSpeed engines would otherwise ask the destroyed group for its ranks ("Group ... is
    not registered"). DeepSpeed is looked up, never imported, here."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    deepspeed_comm = sys.modules.get("deepspeed.comm")
    if deepspeed_comm is not None and deepspeed_comm.is_initialized():
        deepspeed_comm.destroy_process_group()
    else:
        dist.destroy_process_group()
