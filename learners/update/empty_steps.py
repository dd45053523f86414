"""Which optimizer steps of a training step carry no gradient (`algo.skip_empty_optimizer_steps`).

A mini-batch none of whose rows carries a non-zero advantage (with no KL term) has an exactly zero
policy gradient, yet AdamW still moves the weights on it: its momentum keeps stepping ("coasting") on
what earlier mini-batches taught. Skipping such a step removes that. The decision is made per
optimizer step (a mini-batch), not per training step, since a training step with one live mini-batch
among empty ones coasts on the others;
it is made once, by the group, from the whole batch before it is scattered, so every data-parallel rank of a
policy skips the same steps and none waits in a collective another rank never enters (DeepSpeed included).
"""

from __future__ import annotations

from torch import Tensor


def empty_steps(live: Tensor, rows: list[list[int]], steps: list[list[list[int]]]) -> list[bool]:
    """Per optimizer step: True when no rank's rows of that step carry a gradient.

    live [B] bool over the policy's global rows; rows[r] the global rows rank r receives (in
    order); steps[r][i] the indices into rows[r] of rank r's share of optimizer step i (every rank
    lists the same number of steps).
    Rows a rank never receives (dropped zero-advantage rows) carry no gradient, so they need not be listed."""
    count = len(steps[0]) if steps else 0
    return [
        not any(bool(live[rows[r][j]]) for r in range(len(rows)) for j in steps[r][i]) for i in range(count)
    ]
