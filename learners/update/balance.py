"""verl's length-balanced batch order (`algo.minibatch_order=verl_balanced`), as pure functions.

The paper's stack balances the whole step's batch over its W data-parallel ranks before anything splits it per
role (verl 0.6.1 `RayPPOTrainer._balance_batch`, `trainer.balance_batch: true`):

1. each row's workload is 24576·L + L² for its L prompt + response tokens (a dense transformer block's FLOPs
   with a 4096 hidden size, up to a constant);
2. the rows are partitioned over the W ranks into equal-size parts of near-equal total workload by the
   Karmarkar–Karp largest differencing method (`largest_differencing`);
3. within a part, rows are sorted by workload (ties by row index) and re-ordered light–heavy–light: the even
   positions of the sorted list, then the odd ones reversed;
4. the parts are concatenated, rank 0's first: the order the rows then keep through the per-role split, the
   contiguous dispatch to the ranks and the in-order mini-batch split.

So each rank's rows are ordered by length, and mini-batches cut from them in order are length-stratified.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from enum import StrEnum


class MinibatchOrder(StrEnum):
    """`algo.minibatch_order`: the rows' order before the per-policy split: the
    episodes' (given), or verl's."""

    given = "given"
    verl_balanced = "verl_balanced"


def verl_workload(length: int) -> int:
    """A row's workload by its length L (prompt + response tokens): 24576·L + L²."""
    return 24576 * length + length * length


# One part of a partition: (total workload, its (row, workload) items in the order they were added). Parts
# compare as verl's: by total, then by item count, then by the items themselves.
Part = tuple[int, int, tuple[tuple[int, int], ...]]


def _part(items: tuple[tuple[int, int], ...]) -> Part:
    return sum(w for _, w in items), len(items), items


def _descending(parts: list[Part]) -> tuple[Part, ...]:
    return tuple(sorted(parts, reverse=True))


@dataclass(frozen=True)
class _State:
    """k parts, heaviest first; popped from the heap largest spread first, then heaviest first part first."""

    parts: tuple[Part, ...]

    @property
    def spread(self) -> int:
        return self.parts[0][0] - self.parts[-1][0]

    def __lt__(self, other: _State) -> bool:
        if self.spread != other.spread:
            return self.spread > other.spread
        return self.parts[0] > other.parts[0]

    def merged(self, other: _State) -> _State:
        """Part i of self joins part k−1−i of other (the heaviest with the
        lightest), reordered heaviest first."""
        k = len(self.parts)
        return _State(_descending([_part(self.parts[i][2] + other.parts[k - 1 - i][2]) for i in range(k)]))


def largest_differencing(workloads: list[int], k: int) -> list[list[int]]:
    """Equal-size k-way partition of rows 0..n−1 by the largest differencing method (n a multiple of k).

    The rows sorted by (workload, row) are taken k at a time, each group a state of k one-row parts.
    While more than one state is left, the two of largest spread (max − min part total) merge, the
    heaviest part of one with the lightest of the other. Returns the final state's parts, heaviest
    first, each its rows ascending."""
    if len(workloads) % k:
        raise ValueError(f"{len(workloads)} rows do not split into {k} equal parts")
    ranked = sorted((w, i) for i, w in enumerate(workloads))
    heap = [
        _State(_descending([_part(((i, w),)) for w, i in ranked[s : s + k]]))
        for s in range(0, len(ranked), k)
    ]
    heapq.heapify(heap)
    while len(heap) > 1:
        first, second = heapq.heappop(heap), heapq.heappop(heap)
        heapq.heappush(heap, first.merged(second))
    return [sorted(i for i, _ in part[2]) for part in heap[0].parts] if heap else [[] for _ in range(k)]


def light_heavy_light(rows: list[int], workloads: list[int]) -> list[int]:
    """`rows` sorted by (workload, row), then the even positions followed by the odd ones reversed."""
    ranked = sorted(rows, key=lambda i: (workloads[i], i))
    return ranked[::2] + ranked[1::2][::-1]


def balanced_order(lengths: list[int], ranks: int) -> list[int]:
    """verl's order of a batch of rows with `lengths` over `ranks` data-parallel
    ranks: a permutation of 0..n−1.

    verl needs n to be a multiple of the ranks (the stack pads its batch up to one); here the partition is
    padded with rows of workload 0, which are left out of the order it returns."""
    n = len(lengths)
    workloads = [verl_workload(x) for x in lengths] + [0] * (-n % ranks)
    parts = largest_differencing(workloads, ranks)
    return [i for part in parts for i in light_heavy_light(part, workloads) if i < n]
