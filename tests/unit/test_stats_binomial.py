"""The standard library's binomial probabilities (vnetbench.stats.binomial) against scipy.stats, which they
stand in for in `run` and `show` (scipy.stats takes a second of each to import), and Theil-Sen's slope of the
path check's packet trains against scipy.stats.theilslopes."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from vnetbench.runner.pathcheck import theil_sen_slope
from vnetbench.stats import binomial, median_ci_ranks

# the path check's counts (a probe's echo requests: tens to a few hundred), trials of a run, and the edges
CASES = [(n, p) for n in (1, 2, 5, 6, 20, 100, 400, 1000) for p in (0.01, 0.2, 0.5, 0.8, 0.99, 0.999)]


@pytest.mark.parametrize("n,p", CASES)
def test_pmf_and_cdf_are_scipys(n, p):
    k = np.arange(-1, n + 2)
    assert [binomial.pmf(int(i), n, p) for i in k] == pytest.approx(stats.binom.pmf(k, n, p), rel=1e-9, abs=1e-300)
    assert [binomial.cdf(int(i), n, p) for i in k] == pytest.approx(stats.binom.cdf(k, n, p), rel=1e-9, abs=1e-14)


@pytest.mark.parametrize("n,p", CASES)
def test_the_two_sided_test_is_scipys_binomtest(n, p):
    for k in sorted({0, 1, n // 3, n // 2, int(n * p), int(n * p) + 1, n - 1, n} & set(range(n + 1))):
        assert binomial.two_sided_p(k, n, p) == pytest.approx(stats.binomtest(k, n, p).pvalue, rel=1e-9, abs=1e-14), k


def test_certain_outcomes_and_a_count_outside_the_trials():
    assert binomial.pmf(0, 10, 0.0) == 1.0 and binomial.pmf(10, 10, 1.0) == 1.0 and binomial.pmf(3, 10, 1.0) == 0.0
    assert binomial.two_sided_p(10, 10, 1.0) == 1.0 and binomial.two_sided_p(9, 10, 1.0) == 0.0
    with pytest.raises(ValueError, match="not between 0 and n"):
        binomial.two_sided_p(11, 10, 0.5)


def test_the_path_checks_judgement_of_a_lossless_probe_is_scipys():
    # 99 % delivery held against 100 requests: 98 answered passes, 90 does not (scipy: p = 0.26 and 3.6e-6)
    assert binomial.two_sided_p(98, 100, 0.99) > 0.05 > binomial.two_sided_p(90, 100, 0.99)
    assert binomial.two_sided_p(90, 100, 0.99) == pytest.approx(stats.binomtest(90, 100, 0.99).pvalue, rel=1e-9)


def test_median_intervals_keep_their_ranks_and_coverage():
    # the exact interval's ranks from scipy's binomial CDF, as summary.median_ci_ranks computed them before
    for n in range(1, 300):
        tail = 0.025
        l = next((k for k in range(n + 1) if stats.binom.cdf(k, n, 0.5) > tail), None)
        got = median_ci_ranks(n)
        if l is None or l < 1 or n + 1 - l < l:
            assert got is None, n
        else:
            assert got[:2] == (l, n + 1 - l), n
            assert got[2] == pytest.approx(1 - 2 * stats.binom.cdf(l - 1, n, 0.5), rel=1e-12), n


@pytest.mark.parametrize("seed", range(5))
def test_theil_sen_slope_is_scipys(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 400))
    # a queue's arrivals: one frame time apart, jittered, with a few late outliers
    y = np.sort(np.arange(n) * 1.2e-4 + rng.normal(0, 2e-5, n) + (rng.random(n) < 0.05) * 1e-3)
    assert theil_sen_slope(y) == pytest.approx(stats.theilslopes(y, np.arange(n, dtype=float)).slope, rel=1e-12)
