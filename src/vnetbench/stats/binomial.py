"""The binomial distribution's probabilities, and the exact two-sided binomial test, from the standard library.

Every `vnetbench run` judges its path probes with a binomial test and prints medians with exact intervals (the
binomial CDF at p = 1/2); importing scipy.stats for those took 1.3 s of each run and of each `show` on the 2-core
VM, more than the netlink work of a whole dumbbell. The counts here are a run's echo requests and trials (at
most thousands), where the probabilities summed from log-gamma terms agree with scipy.stats.binom and
scipy.stats.binomtest to 1e-9 (tests/unit/test_stats_binomial.py holds them to it); the statistics of
`compare` (Mann-Whitney U, bootstrap) stay scipy's.
"""

from __future__ import annotations

import math

# scipy.stats.binomtest's tolerance: outcomes whose probability is within this factor of the observed one's
# count as "as extreme" (the rounding of the log-gamma sums must not split ties)
RELATIVE_TIE = 1 + 1e-7


def pmf(k: int, n: int, p: float) -> float:
    """P(B = k) for B ~ Binomial(n, p)."""
    if k < 0 or k > n:
        return 0.0
    if p <= 0.0 or p >= 1.0:
        return 1.0 if k == (0 if p <= 0.0 else n) else 0.0
    log = (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
           + k * math.log(p) + (n - k) * math.log1p(-p))
    return math.exp(log)


def cdf(k: int, n: int, p: float) -> float:
    """P(B <= k) for B ~ Binomial(n, p), summed from the nearer tail."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    if k < n * p:
        return min(1.0, math.fsum(pmf(i, n, p) for i in range(k + 1)))
    return max(0.0, 1.0 - math.fsum(pmf(i, n, p) for i in range(k + 1, n + 1)))


def two_sided_p(k: int, n: int, p: float) -> float:
    """The exact two-sided binomial test of k successes in n trials against probability p (scipy.stats.binomtest's
    "two-sided"): the probability of every outcome at most as likely as k."""
    if not 0 <= k <= n:
        raise ValueError(f"k = {k} successes is not between 0 and n = {n}")
    observed = pmf(k, n, p) * RELATIVE_TIE
    return min(1.0, math.fsum(q for q in (pmf(i, n, p) for i in range(n + 1)) if q <= observed))
