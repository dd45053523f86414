"""Study 3's seed-level tests as small pure functions: an exact permutation test of the
difference of two arms' mean per-seed values, and Welch's t beside it (its p from Student's t by
the regularized incomplete beta).

Seeds, not tasks, are the unit: most of the variance in final accuracy is between seeds (study
2: SD 0.115 over seeds against 0.058 binomial at 64 tasks), so a test that pools tasks across
seeds overstates the evidence.
"""

from __future__ import annotations

import itertools
import math
import statistics

# Relative tolerance when counting splits at least as extreme as the observed one (float ties).
_TIES = 1e-12


def permutation_p(a: list[float], b: list[float]) -> float:
    """Two-sided exact p of the difference of means: the share of all C(n_a + n_b, n_a) relabelings of
    the pooled values whose |mean difference| is at least the observed one (the observed split included).
    NaN when either side is empty."""
    if not a or not b:
        return math.nan
    pooled, n = [*a, *b], len(a)
    total = sum(pooled)
    observed = abs(statistics.fmean(a) - statistics.fmean(b))

    def diff(first: tuple[int, ...]) -> float:
        s = sum(pooled[i] for i in first)
        return abs(s / n - (total - s) / (len(pooled) - n))

    splits = list(itertools.combinations(range(len(pooled)), n))
    return sum(diff(s) >= observed - _TIES for s in splits) / len(splits)


def welch(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """(t, Welch–Satterthwaite degrees of freedom, two-sided p) of mean(a) - mean(b); NaNs with fewer than two
    values a side or no variance at all."""
    if len(a) < 2 or len(b) < 2:
        return math.nan, math.nan, math.nan
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    if va + vb == 0:
        return math.nan, math.nan, math.nan
    t = (statistics.fmean(a) - statistics.fmean(b)) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return t, df, student_two_sided(t, df)


def student_two_sided(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with `df` degrees of freedom: I_{df / (df + t^2)}(df / 2, 1 / 2)."""
    return incomplete_beta(df / (df + t * t), df / 2, 0.5)


def incomplete_beta(x: float, a: float, b: float) -> float:
    """The regularized incomplete beta function I_x(a, b), by its continued fraction (Lentz's method), on the
    side where it converges fast."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1) / (a + b + 2):
        return math.exp(log_front) * _beta_fraction(x, a, b) / a
    return 1 - math.exp(log_front) * _beta_fraction(1 - x, b, a) / b


def _beta_fraction(x: float, a: float, b: float, tiny: float = 1e-300, eps: float = 1e-15) -> float:
    # The continued fraction 1 / (1 + d1 / (1 + d2 / ...)) of I_x(a, b), terms
    # d_{2m+1} and d_{2m} alternating.
    c, d = 1.0, 1 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1 + num * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + num / c
            c = c if abs(c) > tiny else tiny
            h *= c * d
        if abs(c * d - 1) < eps:
            break
    return h
