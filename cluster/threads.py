"""How many threads a member's numeric libraries use: as many as the CPUs it was given, set in its environment
before torch (or OpenMP, MKL, OpenBLAS) loads in the actor process.

An actor whose thread pools are sized by the machine's core count instead competes with every other actor on
the node for the same cores; OpenMP threads that spin while idle (the default wait policy) keep taking cores
from the members of the next phase (engines spin while learners update), so waits are passive.
"""

from __future__ import annotations

import math


def threads_for(num_cpus: float, configured: int = 0) -> int:
    """`configured` threads when > 0, else the member's whole CPUs (at least one)."""
    return configured if configured > 0 else max(1, math.floor(num_cpus))


def thread_env(threads: int) -> dict[str, str]:
    """The environment that sizes every numeric thread pool of a fresh process to `threads`."""
    n = str(threads)
    return {
        "OMP_NUM_THREADS": n,
        "MKL_NUM_THREADS": n,
        "OPENBLAS_NUM_THREADS": n,
        "OMP_WAIT_POLICY": "PASSIVE",
    }
