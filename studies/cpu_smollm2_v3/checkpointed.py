"""Study 3's runner with gradient checkpointing on the voting cells' learners (the README's deviation):
`PYTHONPATH=<the pinned worktree> python <main>/studies/cpu_smollm2_v3/checkpointed.py arms ...`, with
run.py's arguments.

The voting-isolated arm does not fit this 24 GiB box without it: its first two starts were killed by Ray's
memory monitor. Checkpointing leaves the trained weights bit-identical and halves the learner's peak
(measured: README, "Deviations"), so it changes what a step costs, not what it computes. The pinned commit's
runner builds every cell's sweep; this adds one override to the voting cells' sweeps before they run. What
trains is the pinned commit's code, untouched: each run still records that commit and a clean tree.
"""

from __future__ import annotations

import sys
from typing import Any

import studies.cpu_smollm2_v3.run as run

CHECKPOINTING = "learner.gradient_checkpointing=true"
pinned_cell_sweep = run.cell_sweep


def cell_sweep(seed: int, arm: dict[str, Any], answer_cap: int, aggregator_cap: int) -> dict[str, Any]:
    """The pinned runner's sweep of one cell, checkpointing added where the workflow is voting."""
    spec: dict[str, Any] = pinned_cell_sweep(seed, arm, answer_cap, aggregator_cap)
    if arm["marl.workflow"] == "voting":
        spec["overrides"].append(CHECKPOINTING)
    return spec


def main(argv: list[str] | None = None) -> int:
    run.cell_sweep = cell_sweep
    return run.main(argv)


if __name__ == "__main__":
    sys.exit(main())
