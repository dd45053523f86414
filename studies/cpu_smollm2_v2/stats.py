"""The second CPU study's statistics as small pure functions: the cliff rule, Fisher's exact test between two
arms' cliff counts, McNemar's exact test on paired per-task results, mean and standard deviation over seeds.

Exact tests only: at 3-5 seeds per arm and ~128 held-out tasks no large-sample approximation is safe.
"""

from __future__ import annotations

import math
import statistics

# Relative tolerance when collecting the tables at least as extreme as the observed one (float ties).
_TIES = 1 + 1e-9


def fisher_exact(a: int, b: int, c: int, d: int) -> float:
    """Two-sided p of Fisher's exact test on the 2x2 table [[a, b], [c, d]] (rows: arms;
    columns: with / without a cliff): the probability, under fixed margins, of every table no
    more likely than the observed one."""
    row1, col1, n = a + b, a + c, a + b + c + d

    def prob(x: int) -> float:
        return math.comb(row1, x) * math.comb(n - row1, col1 - x) / math.comb(n, col1)

    observed = prob(a)
    support = range(max(0, col1 - (n - row1)), min(row1, col1) + 1)
    return min(1.0, sum(p for x in support if (p := prob(x)) <= observed * _TIES))


def binomial_two_sided(k: int, n: int) -> float:
    """Two-sided p of k successes in n fair coin flips (the exact sign test): 2 P(X
    <= min(k, n-k)), capped at 1."""
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(k, n - k) + 1)) / 2**n
    return min(1.0, 2 * tail)


def mcnemar_exact(only_a: int, only_b: int) -> float:
    """Two-sided p of McNemar's exact test: `only_a` pairs right under arm A alone, `only_b` under B alone
    (the concordant pairs carry no information); a sign test on the discordant pairs."""
    return binomial_two_sided(only_a, only_a + only_b)


def mean_sd(values: list[float]) -> tuple[float, float]:
    """(mean, sample standard deviation); SD is NaN below two values, both NaN with none."""
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else math.nan


def diff_se(p: float, q: float, n: int) -> float:
    """Standard error of the difference of two accuracies, each over n independent tasks."""
    return math.sqrt((p * (1 - p) + q * (1 - q)) / n)


def is_cliff(curve: list[float], n_tasks: int, drop: float) -> bool:
    """The study's cliff rule, on one run's held-out accuracies in order (base first, final last): the final
    evaluation is at least `drop` AND more than 2 standard errors of a difference below the running peak of
    the evaluations before it. A dip that recovered by the end is no cliff; no hand labels."""
    if len(curve) < 2 or n_tasks <= 0:
        return False
    peak, final = max(curve[:-1]), curve[-1]
    gap = peak - final
    return gap >= drop and gap > 2 * diff_se(peak, final, n_tasks)


def last_mean(curve: list[float], k: int = 3) -> float:
    """Mean of the last k evaluations (the final one included): a final value
    less at the mercy of one eval."""
    return statistics.fmean(curve[-k:]) if curve else math.nan
