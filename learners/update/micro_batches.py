"""Which rows of a mini-batch share a micro-batch: by row count (`learner.micro_batch_size`) or by token
budget (`learner.max_tokens_per_micro_batch`).

A micro-batch is padded to its longest row, so what it costs in memory is rows × that width: the budget
caps exactly that. Rows are taken longest first and cut into consecutive groups under the hard cap,
which gives the fewest micro-batches for this cost (a group's width is its first row's, so shorter rows
only ever join groups of rows as long or longer); then the cap is lowered to the least that keeps that
count, which evens the groups out.
Neighbours in length share a group, so padding stays small. Pure functions on row lengths; the learner selects
the rows. The loss is a sum over rows under one global normaliser, so the grouping changes no update.
"""

from __future__ import annotations

BUDGET_KEY = "learner.max_tokens_per_micro_batch"


def micro_batch_rows(lengths: list[int], size: int, budget: int, packed: bool = False) -> list[list[int]]:
    """Row positions per micro-batch: lengths [B] (attended tokens per row, in the caller's order).

    budget = 0: consecutive chunks of `size` rows, in the given order. budget > 0: groups of rows, longest
    first, each with len(group) × its longest row ≤ budget (`size` is then unused), or Σ its lengths
    when the rows run `packed` (learner.padding_free: no padding); a row longer than the budget
    raises ValueError naming the key."""
    if budget <= 0:
        return [list(range(i, min(i + size, len(lengths)))) for i in range(0, len(lengths), size)]
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    if order and lengths[order[0]] > budget:
        raise ValueError(
            f"{BUDGET_KEY}={budget} is below a row of {lengths[order[0]]} tokens; it must hold the "
            "longest row (algo.max_len)"
        )
    widths = [lengths[i] for i in order]
    count = len(_groups(widths, budget, packed))
    low, high = max(widths, default=0), budget  # the least cap giving `count` groups lies in [low, high]
    while low < high:
        mid = (low + high) // 2
        low, high = (low, mid) if len(_groups(widths, mid, packed)) <= count else (mid + 1, high)
    return [[order[i] for i in group] for group in _groups(widths, high, packed)]


def _groups(widths: list[int], cap: int, packed: bool) -> list[range]:
    """Consecutive groups of `widths` (non-increasing) costing ≤ cap each (len(group) × group[0], or Σ group
    when packed), each as long as the cap lets it: positions into `widths`."""
    out, start = [], 0
    while start < len(widths):
        end, total = start + 1, widths[start]
        while (
            end < len(widths)
            and (total + widths[end] if packed else (end + 1 - start) * widths[start]) <= cap
        ):
            total, end = total + widths[end], end + 1
        out.append(range(start, end))
        start = end
    return out


def padding(lengths: list[int]) -> tuple[int, int]:
    """(padded positions, positions) of one right-padded micro-batch of rows with these lengths."""
    positions = len(lengths) * max(lengths, default=0)
    return positions - sum(lengths), positions
