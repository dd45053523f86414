"""The driver's logging and collective-network choices, as the environment every member actor starts with.

An actor's process inherits the raylet's environment, not that of the process that created it: a sweep's
trial driver (or a driver attached to a running cluster) sets `DS_ACCELERATOR` and the log levels in its own
environment (jobs/train.quiet_logs), and without this its learners print DeepSpeed's "Setting accelerator to
CPU" warning and torch's C++ advisories to the console anyway.
"""

from __future__ import annotations

import os

LOG_LEVELS = ("TORCH_CPP_LOG_LEVEL", "PYTHONWARNINGS")
ACCELERATOR = "DS_ACCELERATOR"
# The collectives' own settings (NCCL_SOCKET_IFNAME, NCCL_IB_DISABLE, NCCL_DEBUG, GLOO_SOCKET_IFNAME,
# TORCH_NCCL_ASYNC_ERROR_HANDLING, ...): the network a multi-node run's process groups take is the user's
# choice, made where they launch the driver, and must reach the members that build those groups.
COLLECTIVE_PREFIXES = ("NCCL_", "GLOO_", "TORCH_NCCL_")


def driver_env(cpu_only: bool) -> dict[str, str]:
    """The log settings the creating process has set, its collectives' settings (COLLECTIVE_PREFIXES), and
    its DeepSpeed accelerator for a member without GPUs only: a GPU member detects its own, whatever a
    driver on a CPU-only head node chose for itself."""
    keys = (*LOG_LEVELS, ACCELERATOR) if cpu_only else LOG_LEVELS
    collective = {k: v for k, v in os.environ.items() if k.startswith(COLLECTIVE_PREFIXES)}
    return {**collective, **{k: os.environ[k] for k in keys if k in os.environ}}
