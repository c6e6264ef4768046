"""Per-metric summaries: hand-computed fields, exact median CI, vectorised path."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from vnetbench.stats.summary import (
    median_ci_ranks,
    min_n_for_median_ci,
    series_percentiles,
    summarize,
    summarize_many,
)

DERANDOMIZED = settings(derandomize=True, max_examples=150, deadline=None)


def test_n6_hand_computed():
    # sorted: 1 3 5 7 9 11
    # median = (5 + 7) / 2 = 6
    # B ~ Bin(6, 1/2): P(B <= 0) = 1/64 = 0.0156 <= 0.025 < P(B <= 1) = 7/64 = 0.109
    #   -> l = 1, u = 6 + 1 - 1 = 6: CI = [x(1), x(6)] = [1, 11], coverage 1 - 2/64 = 0.96875
    # mean 6, squares of deviations 25+9+1+1+9+25 = 70, std = sqrt(70/5) = sqrt(14)
    # linear percentiles, position (n-1)q: p5 at 0.25 -> 1 + 0.25*2 = 1.5; p95 at 4.75 -> 9 + 0.75*2 = 10.5
    # q1 at 1.25 -> 3.5; q3 at 3.75 -> 8.5; IQR 5; fences 3.5 - 7.5 = -4, 8.5 + 7.5 = 16
    s = summarize([7, 1, 3, 5, 9, 11])
    assert s.n == 6
    assert s.median == pytest.approx(6.0)
    assert s.ci == pytest.approx((1.0, 11.0))
    assert s.ci_ranks == (1, 6)
    assert s.ci_coverage == pytest.approx(0.96875, abs=1e-12)
    assert s.ci_note is None
    assert s.mean == pytest.approx(6.0)
    assert s.std == pytest.approx(math.sqrt(14.0), rel=1e-12)
    assert s.cv == pytest.approx(math.sqrt(14.0) / 6.0, rel=1e-12)
    assert s.unstable is True
    assert (s.min, s.max) == (1.0, 11.0)
    assert s.p5 == pytest.approx(1.5)
    assert s.p95 == pytest.approx(10.5)
    assert (s.q1, s.q3) == (pytest.approx(3.5), pytest.approx(8.5))
    assert (s.fence_low, s.fence_high) == (pytest.approx(-4.0), pytest.approx(16.0))
    assert (s.outliers_low, s.outliers_high) == (0, 0)


def test_n10_hand_computed_with_outliers_counted_not_removed():
    # sorted: -20 10 11 12 12 13 13 14 15 40
    # median = (12 + 13) / 2 = 12.5
    # B ~ Bin(10, 1/2): P(B <= 1) = 11/1024 = 0.0107 <= 0.025 < P(B <= 2) = 56/1024 = 0.0547
    #   -> l = 2, u = 9: CI = [x(2), x(9)] = [10, 15], coverage 1 - 22/1024 = 0.978515625
    # q1 at 9*0.25 = 2.25 -> 11 + 0.25*1 = 11.25; q3 at 6.75 -> 13 + 0.75*1 = 13.75; IQR 2.5
    # fences 11.25 - 3.75 = 7.5 and 13.75 + 3.75 = 17.5 -> one low (-20), one high (40)
    # p5 at 0.45 -> -20 + 0.45*30 = -6.5; p95 at 8.55 -> 15 + 0.55*25 = 28.75
    # mean 120/10 = 12; squared deviations sum 1828 -> std sqrt(1828/9)
    values = [13, 40, 10, 12, -20, 11, 15, 12, 14, 13]
    s = summarize(values)
    assert s.n == 10
    assert s.median == pytest.approx(12.5)
    assert s.ci == pytest.approx((10.0, 15.0))
    assert s.ci_ranks == (2, 9)
    assert s.ci_coverage == pytest.approx(1 - 22 / 1024, abs=1e-12)
    assert (s.q1, s.q3) == (pytest.approx(11.25), pytest.approx(13.75))
    assert (s.fence_low, s.fence_high) == (pytest.approx(7.5), pytest.approx(17.5))
    assert (s.outliers_low, s.outliers_high, s.outliers) == (1, 1, 2)
    assert s.p5 == pytest.approx(-6.5)
    assert s.p95 == pytest.approx(28.75)
    assert s.mean == pytest.approx(12.0)
    assert s.std == pytest.approx(math.sqrt(1828 / 9), rel=1e-12)
    # outliers are data: still in n, min, max and mean
    assert (s.min, s.max) == (-20.0, 40.0)


def test_ci_needs_six_trials():
    s = summarize([5.0, 6.0, 7.0, 8.0, 9.0])
    assert s.ci is None and s.ci_ranks is None and s.ci_coverage is None
    assert s.ci_note == "n too small (need >= 6)"
    assert s.ci_rel_width is None
    assert s.median == 7.0
    assert min_n_for_median_ci() == 6
    assert median_ci_ranks(5) is None
    assert summarize([5.0, 6.0, 7.0, 8.0, 9.0, 10.0]).ci is not None


def test_single_trial():
    s = summarize([3.5])
    assert (s.n, s.median, s.mean, s.min, s.max) == (1, 3.5, 3.5, 3.5, 3.5)
    assert s.std is None and s.cv is None and s.unstable is False


@pytest.mark.parametrize("n", range(6, 81))
def test_ci_ranks_are_the_narrowest_symmetric_pair_with_95pct(n):
    l, u, coverage = median_ci_ranks(n)
    assert u == n + 1 - l
    pmf = sps.binom.pmf(np.arange(n + 1), n, 0.5)

    def cover(lo):  # P(lo <= B <= n - lo) by summing the pmf
        return float(pmf[lo : n + 1 - lo].sum())

    assert coverage == pytest.approx(cover(l), abs=1e-12)
    assert coverage >= 0.95
    assert cover(l + 1) < 0.95  # one rank further in would fall short


def test_cv_threshold_and_zero_mean():
    # [95, 105]: std = sqrt(50) = 7.07 -> cv 0.0707 (stable); [90, 110]: cv 0.1414 (unstable)
    assert summarize([95, 105]).cv == pytest.approx(math.sqrt(50) / 100)
    assert summarize([95, 105]).unstable is False
    assert summarize([90, 110]).unstable is True
    # around the 10% threshold: [100 - d, 100 + d] has std d*sqrt(2), so cv = d*sqrt(2)/100
    for cv, unstable in ((0.0999, False), (0.1001, True)):
        d = cv * 100 / math.sqrt(2)
        s = summarize([100 - d, 100 + d])
        assert s.cv == pytest.approx(cv, rel=1e-9)
        assert s.unstable is unstable
    z = summarize([-1.0, 1.0])
    assert z.mean == 0 and z.cv is None and z.unstable is False
    c = summarize([4.0] * 8)
    assert c.std == 0 and c.cv == 0 and c.unstable is False and c.outliers == 0


def test_ci_rel_width():
    s = summarize(np.arange(100.0, 110.0))  # CI [x(2), x(9)] = [101, 108], median 104.5
    assert s.ci_rel_width == pytest.approx(7 / 104.5)


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")], [np.inf, 1.0], [[1.0, 2.0]]])
def test_bad_input_is_rejected(bad):
    with pytest.raises(ValueError):
        summarize(bad)


def test_to_dict_is_json_ready():
    d = summarize([1, 2, 3, 4, 5, 6, 7]).to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["ci"] == [1.0, 7.0]
    assert d["n"] == 7


def _true_medians():
    return {
        "normal": (lambda rng, size: rng.normal(10.0, 2.0, size), 10.0),
        "lognormal": (lambda rng, size: rng.lognormal(1.0, 1.0, size), math.exp(1.0)),
        "exponential": (lambda rng, size: rng.exponential(3.0, size), 3.0 * math.log(2)),
        "uniform": (lambda rng, size: rng.uniform(0.0, 4.0, size), 2.0),
    }


@settings(derandomize=True, max_examples=40, deadline=None)
@given(st.sampled_from(sorted(_true_medians())), st.integers(6, 30), st.integers(0, 2**31))
def test_exact_median_ci_covers_true_median(dist, n, seed):
    """Hypothesis picks the distribution, n and seed; 1,000 simulated runs of n trials each must have their
    exact 95% median interval cover the true median in >= 93% of cases (the bound leaves 3 binomial
    standard deviations for the simulation's own noise)."""
    draw, true_median = _true_medians()[dist]
    sims = summarize_many(draw(np.random.default_rng(seed), (1000, n)))
    lo = np.array([s.ci[0] for s in sims])
    hi = np.array([s.ci[1] for s in sims])
    coverage = np.count_nonzero((lo <= true_median) & (true_median <= hi)) / len(sims)
    assert coverage >= 0.93, f"{dist}, n={n}: coverage {coverage:.3f}"
    # ... and it is the interval's exact binomial coverage, whatever the distribution (neither wider nor
    # narrower than claimed), to within 3 standard deviations of a 1,000-run simulation.
    exact = median_ci_ranks(n)[2]
    assert abs(coverage - exact) <= 3 * math.sqrt(exact * (1 - exact) / len(sims)), (dist, n, coverage, exact)


def test_summarize_many_matrix_equals_rowwise():
    rng = np.random.default_rng(7)
    m = rng.lognormal(3.0, 0.3, (40, 12))
    many = summarize_many(m)
    assert len(many) == 40
    for row, s in zip(m, many):
        assert s == summarize(row)


def test_summarize_many_ragged_groups_keep_order():
    groups = [[1.0, 2.0, 3.0], np.arange(10.0), [5.0], [4.0, 4.0, 9.0], np.arange(10.0) * 2]
    many = summarize_many(groups)
    assert [s.n for s in many] == [3, 10, 1, 3, 10]
    assert many == [summarize(g) for g in groups]
    assert summarize_many([]) == []


def test_summarize_many_rejects_nan_matrix():
    with pytest.raises(ValueError, match="ragged"):
        summarize_many(np.array([[1.0, np.nan], [1.0, 2.0]]))


finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)


@DERANDOMIZED
@given(st.lists(st.lists(finite, min_size=1, max_size=25), min_size=1, max_size=6))
def test_summary_invariants(groups):
    for g, s in zip(groups, summarize_many(groups)):
        assert s == summarize(g)
        x = np.sort(np.asarray(g))
        tol = 1e-9 * max(1.0, float(np.max(np.abs(x))))
        assert s.n == len(g)
        assert s.min == x[0] and s.max == x[-1]
        assert s.min - tol <= s.p5 <= s.median + tol <= s.p95 + 2 * tol <= s.max + 3 * tol
        assert 0 <= s.outliers <= s.n
        if s.n >= 6:
            lo, hi = s.ci
            assert s.min <= lo <= s.median <= hi <= s.max
            # the bounds are order statistics of the data
            assert lo == x[s.ci_ranks[0] - 1] and hi == x[s.ci_ranks[1] - 1]
        else:
            assert s.ci is None


def test_series_percentiles_linear():
    # 1..1000, position (n - 1) q: p50 at 499.5 -> 500.5, p90 at 899.1 -> 900.1,
    # p99 at 989.01 -> 990.01, p99.9 at 998.001 -> 999.001
    p = series_percentiles(np.arange(1.0, 1001.0))
    assert list(p) == [50.0, 90.0, 99.0, 99.9]
    assert p[50.0] == pytest.approx(500.5)
    assert p[90.0] == pytest.approx(900.1)
    assert p[99.0] == pytest.approx(990.01)
    assert p[99.9] == pytest.approx(999.001)
    assert series_percentiles([2.0, 4.0], qs=(0, 100, 25)) == {0.0: 2.0, 100.0: 4.0, 25.0: 2.5}


def test_series_percentiles_rejects_bad_input():
    with pytest.raises(ValueError):
        series_percentiles([])
    with pytest.raises(ValueError, match="lost"):
        series_percentiles([1.0, np.nan])
    with pytest.raises(ValueError):
        series_percentiles([1.0], qs=(101,))
