"""The driver's logging choices, as the environment every member actor starts with.

An actor's process inherits the raylet's environment, not that of the process that created it: a sweep's
trial driver (or a driver attached to a running cluster) sets `DS_ACCELERATOR` and the log levels in its own
environment (jobs/train.quiet_logs), and without this its learners print DeepSpeed's "Setting accelerator to
CPU" warning and torch's C++ advisories to the console anyway.
"""

from __future__ import annotations

import os

LOG_LEVELS = ("TORCH_CPP_LOG_LEVEL", "PYTHONWARNINGS")
ACCELERATOR = "DS_ACCELERATOR"


def driver_env(cpu_only: bool) -> dict[str, str]:
    """The log settings the creating process has set, and its DeepSpeed accelerator for a member without GPUs
    only: a GPU member detects its own, whatever a driver on a CPU-only head node chose for itself."""
    keys = (*LOG_LEVELS, ACCELERATOR) if cpu_only else LOG_LEVELS
    return {k: os.environ[k] for k in keys if k in os.environ}
