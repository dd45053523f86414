"""Study 4's paired tests, declared with the design (README, "Analysis") before any cell ran: pure functions
over per-seed values.

- `sign_flip_p`: the exact two-sided sign-flip permutation test of the mean paired difference (every one of
  the 2^n assignments of signs to the n per-seed differences; the primary test).
- `wilcoxon_p`: Wilcoxon's signed-rank test, exact by the same enumeration over the midranks (zero
  differences dropped, Wilcoxon's convention; ties share a midrank).
- `holm`: Holm's step-down adjustment over the family of p-values the study reports.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

# Two statistics closer than this are equal: the per-seed accuracies are multiples of 1/64, and float sums
# of them differ in the last bits by the order of addition.
_TIE = 1e-9


def differences(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """a - b, seed by seed (both in seed order, the same seeds)."""
    if len(a) != len(b):
        raise ValueError(f"paired values need the same seeds: {len(a)} against {len(b)}")
    return [x - y for x, y in zip(a, b, strict=True)]


def _flip_sums(values: Sequence[float]) -> list[float]:
    """The sum of `values` under every assignment of signs (2^n of them)."""
    return [sum(s * v for s, v in zip(signs, values, strict=True))
            for signs in itertools.product((1, -1), repeat=len(values))]


def sign_flip_p(d: Sequence[float]) -> float:
    """Exact two-sided p of the mean of the paired differences `d` [n]: the share of sign assignments whose
    |sum| reaches the observed |sum|. 1.0 for no differences at all."""
    if not d:
        return 1.0
    observed = abs(sum(d))
    sums = _flip_sums(d)
    return sum(abs(s) >= observed - _TIE for s in sums) / len(sums)


def midranks(values: Sequence[float]) -> list[float]:
    """Ranks 1..n of `values` [n], tied values sharing the mean of their ranks."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and abs(values[order[j + 1]] - values[order[i]]) <= _TIE:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def wilcoxon_p(d: Sequence[float]) -> float:
    """Exact two-sided p of Wilcoxon's signed-rank statistic over the nonzero differences of `d` [n]: the
    signed-rank sum's distribution under every sign assignment of the midranks of |d|."""
    nonzero = [x for x in d if abs(x) > _TIE]
    if not nonzero:
        return 1.0
    ranks = midranks([abs(x) for x in nonzero])
    observed = abs(sum(r if x > 0 else -r for r, x in zip(ranks, nonzero, strict=True)))
    sums = _flip_sums(ranks)
    return sum(abs(s) >= observed - _TIE for s in sums) / len(sums)


def holm(ps: Sequence[float]) -> list[float]:
    """Holm's adjusted p-values [m], in the input's order: the k-th smallest times (m - k + 1), kept
    non-decreasing, capped at 1."""
    m = len(ps)
    order = sorted(range(m), key=lambda i: ps[i])
    adjusted = [0.0] * m
    running = 0.0
    for k, i in enumerate(order):
        running = max(running, min(1.0, (m - k) * ps[i]))
        adjusted[i] = running
    return adjusted


def sign_flip_interval(d: Sequence[float], alpha: float = 0.05, step: float = 1 / 640) -> tuple[float, float]:
    """The (1 - alpha) interval of the mean paired difference by inverting the sign-flip test: every shift
    delta on a grid of `step` (a tenth of one task in 64) for which d - delta is not rejected at `alpha`.
    (-inf, inf) when too few seeds can reject anything at `alpha` (the smallest p, 2 / 2^n, above it)."""
    if not d or 2 / 2 ** len(d) > alpha:
        return (float("-inf"), float("inf"))
    span = max(abs(x) for x in d) + step
    grid = [k * step for k in range(-round(span / step), round(span / step) + 1)]
    kept = [delta for delta in grid if sign_flip_p([x - delta for x in d]) > alpha]
    return (min(kept), max(kept))
