"""A vs B comparisons: error rates, power, direction, Holm, degenerate input."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from vnetbench.stats.compare import (
    IMPROVED,
    INCONCLUSIVE,
    REGRESSED,
    UNCHANGED,
    cliffs_delta,
    compare,
    compare_many,
    compare_metrics,
    holm,
    smallest_pvalue,
)


# The rates, as hypothesis properties: hypothesis picks the noise model (family, CV, trials per side,
# direction, seed; derandomized, so every run checks the same cases) and each example simulates a few hundred
# comparisons of that model, whose rate must meet the bound.
FAMILIES = ("normal", "lognormal", "gamma")
RATE_SETTINGS = settings(derandomize=True, max_examples=20, deadline=None)


def draw(rng, family: str, mean: float, cv: float, size) -> np.ndarray:
    """Trials with this mean and coefficient of variation: symmetric, or right-skewed as latencies are."""
    if family == "normal":
        return rng.normal(mean, cv * mean, size)
    if family == "lognormal":
        sigma = math.sqrt(math.log1p(cv * cv))
        return rng.lognormal(math.log(mean) - sigma * sigma / 2, sigma, size)
    k = 1 / (cv * cv)
    return rng.gamma(k, mean / k, size)


def simulate(family, cv, n, shift, direction, seed, pairs=200):
    rng = np.random.default_rng(seed)
    mean = rng.uniform(50, 5000)
    groups = [[("m", draw(rng, family, mean, cv, n), draw(rng, family, mean * (1 + shift), cv, n), direction, None)]
              for _ in range(pairs)]
    return [g[0] for g in compare_many(groups, seed=seed % 1000)]


@RATE_SETTINGS
@given(st.sampled_from(FAMILIES), st.floats(0.01, 0.10), st.integers(4, 20), st.sampled_from(["higher", "lower"]),
       st.integers(0, 2**31))
def test_same_distribution_is_unchanged_or_inconclusive_in_95_percent(family, cv, n, direction, seed):
    results = simulate(family, cv, n, 0.0, direction, seed)
    quiet = sum(r.verdict in (UNCHANGED, INCONCLUSIVE) for r in results)
    assert quiet / len(results) >= 0.95


def test_same_distribution_low_noise_is_positively_unchanged():
    # with n = 10 and CV 3-5% the CI of the change is about +-4-6% wide, so many equal
    # pairs can only be "inconclusive"; at CV 1% the CI fits inside +-5% almost always
    rng = np.random.default_rng(77)
    groups = []
    for _ in range(300):
        mu = rng.uniform(50, 5000)
        groups.append([("m", rng.normal(mu, 0.01 * mu, 10), rng.normal(mu, 0.01 * mu, 10), "lower", None)])
    results = [g[0] for g in compare_many(groups, seed=2)]
    assert sum(r.verdict == UNCHANGED for r in results) / len(results) >= 0.95


@RATE_SETTINGS
@given(st.sampled_from(FAMILIES), st.floats(0.01, 0.05), st.sampled_from([0.20, -0.20]),
       st.sampled_from(["higher", "lower"]), st.integers(0, 2**31))
def test_20pct_shift_with_10_trials_is_detected_in_90_percent_the_right_way(family, cv, shift, direction, seed):
    """A 20% change, 10 trials per side, CV up to 5%: found in >= 90% of cases, and called by the direction
    (more throughput, or less latency, is an improvement; never the opposite verdict)."""
    results = simulate(family, cv, 10, shift, direction, seed)
    better = (shift > 0) == (direction == "higher")
    right, wrong = (IMPROVED, REGRESSED) if better else (REGRESSED, IMPROVED)
    assert sum(r.verdict == right for r in results) / len(results) >= 0.90
    assert not any(r.verdict == wrong for r in results)
    assert np.median([r.rel_change for r in results]) == pytest.approx(shift, abs=0.02)


def test_direction_decides_improved_or_regressed():
    rng = np.random.default_rng(5)
    a = rng.normal(100, 3, 12)
    down = rng.normal(80, 3, 12)
    up = rng.normal(125, 3, 12)
    assert compare(a, down, "lower").verdict == IMPROVED  # lower RTT: better
    assert compare(a, up, "lower").verdict == REGRESSED
    assert compare(a, down, "higher").verdict == REGRESSED  # lower throughput: worse
    assert compare(a, up, "higher").verdict == IMPROVED
    r = compare(a, down, "lower", metric="rtt.p50_ms")
    assert r.rel_change == pytest.approx(np.median(down) / np.median(a) - 1, rel=1e-12)
    assert r.rel_change_ci[1] < -0.05
    assert "lower is better" in r.reason
    assert r.cliffs_delta == pytest.approx(-1.0)


def test_fewer_than_four_trials_per_side_is_inconclusive():
    a = [100.0, 101.0, 99.0]
    b = [150.0, 151.0, 149.0, 150.0, 152.0]
    r = compare(a, b, "higher")
    assert r.verdict == INCONCLUSIVE
    assert r.reason == "fewer than 4 trials per side (a=3, b=5)"
    assert r.p_value is None and r.p_adjusted is None and r.rel_change_ci is None
    assert r.rel_change == pytest.approx(0.5)
    r = compare(b, a, "higher")
    assert r.reason == "fewer than 4 trials per side (a=5, b=3)"


def test_holm_hand_computed():
    # p = 0.01, 0.04, 0.03, 0.005 (m = 4); sorted: 0.005, 0.01, 0.03, 0.04
    #   0.005 * 4 = 0.02; 0.01 * 3 = 0.03; 0.03 * 2 = 0.06; 0.04 * 1 = 0.04 -> max(0.06, 0.04) = 0.06
    # back in input order: 0.03, 0.06, 0.06, 0.02
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # capped at 1: 0.5 * 2 = 1.0; then max(1.0, 0.6) = 1.0
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])
    assert holm([0.2]) == pytest.approx([0.2])
    assert holm([]).size == 0
    with pytest.raises(ValueError):
        holm([0.1, 1.5])


def test_compare_metrics_uses_holm_adjusted_p():
    # n = 4 per side, complete separation: exact two-sided MWU p = 2 / C(8, 4) = 2/70 = 0.02857.
    # Alone that is < 0.05; in a family of two, Holm gives max(2 * 0.02857, 0.02857) = 0.0571.
    a = [99.0, 100.0, 101.0, 102.0]
    b = [149.0, 150.0, 151.0, 152.0]
    alone = compare(a, b, "higher", metric="x")
    assert alone.p_value == pytest.approx(2 / 70)
    assert alone.p_adjusted == pytest.approx(2 / 70)
    assert alone.verdict == IMPROVED
    both = compare_metrics([("x", a, b, "higher", 0.05), ("y", a, b, "lower", 0.05)])
    for r in both:
        assert r.p_value == pytest.approx(2 / 70)
        assert r.p_adjusted == pytest.approx(4 / 70)
        assert r.verdict == INCONCLUSIVE
        assert "not significant" in r.reason
    # the interval is the same either way: only the p-value changed
    assert both[0].rel_change_ci == alone.rel_change_ci


def test_holm_family_excludes_untested_metrics():
    rng = np.random.default_rng(8)
    a, b = rng.normal(100, 2, 10), rng.normal(130, 2, 10)
    res = compare_metrics([("tested", a, b, "higher", None), ("few", a[:2], b[:2], "higher", None)])
    assert res[0].p_adjusted == pytest.approx(res[0].p_value)  # family of one
    assert res[1].p_adjusted is None


def test_noise_threshold_override():
    rng = np.random.default_rng(11)
    a = rng.normal(100, 0.5, 20)
    b = rng.normal(108, 0.5, 20)  # +8%, tight
    assert compare(a, b, "lower", 0.05).verdict == REGRESSED
    r = compare(a, b, "lower", 0.10)
    assert r.verdict == UNCHANGED and "10%" in r.reason
    r = compare(a, b, "lower", 0.08)  # CI straddles 8%
    assert r.verdict == INCONCLUSIVE and "straddles" in r.reason


def test_all_identical_is_unchanged():
    r = compare([5.0] * 6, [5.0] * 8, "higher")
    assert (r.verdict, r.p_value, r.rel_change, r.rel_change_ci) == (UNCHANGED, 1.0, 0.0, (0.0, 0.0))
    assert "identical" in r.reason
    r = compare([0.0] * 6, [0.0] * 6, "lower", 0.0)  # e.g. no loss at all, even with zero noise allowed
    assert r.verdict == UNCHANGED


def test_median_a_zero_is_inconclusive():
    r = compare([0.0, 0.0, 0.0, 0.0, 0.1], [0.2, 0.3, 0.2, 0.4, 0.3], "lower")
    assert r.verdict == INCONCLUSIVE
    assert r.rel_change is None and r.rel_change_ci is None
    assert "median of A is 0" in r.reason
    assert r.p_value is not None and r.p_value < 0.05


def test_unbounded_bootstrap_interval_is_inconclusive():
    # median of A is 0.1, but resamples with three or more zeros have median 0
    a = [0.0, 0.0, 0.1, 0.2, 0.3]
    r = compare(a, [0.3, 0.4, 0.5, 0.6, 0.7], "lower")
    assert r.rel_change == pytest.approx(4.0)
    assert r.verdict == INCONCLUSIVE
    assert r.rel_change_ci is None and "unbounded" in r.reason


def test_cliffs_delta_hand_computed():
    # a = 1 2 3, b = 2 3 4: pairs with b > a: 6, b < a: 1 (2 vs 3), ties: 2 -> (6 - 1) / 9
    assert cliffs_delta([1, 2, 3], [2, 3, 4]) == pytest.approx(5 / 9)
    assert cliffs_delta([1, 2], [3, 4]) == 1.0
    assert cliffs_delta([3, 4], [1, 2]) == -1.0


def test_engine_matches_scipy_per_item_regardless_of_batch():
    # small samples with and without ties in one batch: scipy's "auto" would switch the
    # whole batch to asymptotic; each item must get the p-value it gets on its own.
    rng = np.random.default_rng(17)
    items = []
    for k in range(30):
        n_a, n_b = 5, 6
        a = rng.normal(10, 1, n_a)
        b = rng.normal(11, 1, n_b)
        if k % 3 == 0:
            a = np.round(a)
            b = np.round(b)
        items.append((f"m{k}", a, b, "higher", None))
    batch = [g[0] for g in compare_many([[it] for it in items])]
    for (name, a, b, _, _), r in zip(items, batch):
        expected = sps.mannwhitneyu(a, b, alternative="two-sided").pvalue
        if np.all(np.concatenate([a, b]) == a[0]):
            expected = 1.0
        assert r.p_value == pytest.approx(expected, rel=1e-12), name
        assert r.cliffs_delta == pytest.approx(cliffs_delta(a, b), abs=1e-12), name


def test_bootstrap_ci_matches_a_naive_bootstrap():
    rng = np.random.default_rng(23)
    a = rng.lognormal(3.0, 0.2, 20)
    b = rng.lognormal(3.1, 0.2, 25)
    r = compare(a, b, "higher", seed=4)
    # naive percentile bootstrap, many resamples, independent stream
    nrng = np.random.default_rng(1000)
    ma = np.median(nrng.choice(a, size=(20000, a.size)), axis=1)
    mb = np.median(nrng.choice(b, size=(20000, b.size)), axis=1)
    lo, hi = np.percentile(mb / ma - 1, [2.5, 97.5])
    assert r.rel_change_ci[0] == pytest.approx(lo, abs=0.01)
    assert r.rel_change_ci[1] == pytest.approx(hi, abs=0.01)
    assert r.rel_change_ci[0] < r.rel_change < r.rel_change_ci[1]


def test_deterministic_and_independent_of_what_else_is_compared():
    rng = np.random.default_rng(31)
    a, b = rng.normal(100, 5, 15), rng.normal(104, 5, 15)
    other = (rng.normal(1, 0.1, 15), rng.normal(1, 0.1, 15))
    r1 = compare(a, b, "higher", seed=7)
    r2 = compare(a, b, "higher", seed=7)
    assert r1 == r2
    in_family = compare_metrics([("o", *other, "lower", None), ("", a, b, "higher", None)], seed=7)[1]
    assert in_family.rel_change_ci == r1.rel_change_ci
    assert in_family.p_value == r1.p_value
    assert compare(a, b, "higher", seed=8).rel_change_ci != r1.rel_change_ci


def test_changed_requires_significance_and_ci_beyond_noise():
    rng = np.random.default_rng(41)
    for k in range(40):
        a = rng.normal(100, rng.uniform(1, 15), int(rng.integers(4, 25)))
        b = rng.normal(100 * rng.uniform(0.7, 1.3), rng.uniform(1, 15), int(rng.integers(4, 25)))
        r = compare(a, b, "higher", seed=k)
        if r.changed:
            lo, hi = r.rel_change_ci
            assert r.p_adjusted < 0.05
            assert lo > 0.05 or hi < -0.05
            assert (r.verdict == IMPROVED) == (lo > 0.05)
        elif r.verdict == UNCHANGED:
            assert -0.05 <= r.rel_change_ci[0] and r.rel_change_ci[1] <= 0.05
        assert r.reason


def test_result_to_dict_and_validation():
    r = compare([1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.5], "lower", metric="rtt")
    d = r.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["metric"] == "rtt" and d["verdict"] in ("unchanged", "inconclusive")
    with pytest.raises(ValueError, match="direction"):
        compare([1.0] * 4, [1.0] * 4, "up")
    with pytest.raises(ValueError, match="noise"):
        compare([1.0] * 4, [1.0] * 4, "lower", -0.1)
    with pytest.raises(ValueError, match="NaN"):
        compare([1.0, np.nan, 2.0, 3.0], [1.0] * 4, "lower")
    with pytest.raises(ValueError):
        compare_metrics([("x", [1.0], [1.0])])


values = st.lists(st.floats(min_value=0.1, max_value=1e4, allow_nan=False), min_size=1, max_size=15)


@settings(derandomize=True, max_examples=100, deadline=None)
@given(values, values, st.sampled_from(["higher", "lower"]))
def test_verdict_rules_hold_for_arbitrary_input(a, b, direction):
    r = compare(a, b, direction)
    assert r.verdict in (IMPROVED, REGRESSED, UNCHANGED, INCONCLUSIVE)
    assert r.reason
    assert -1.0 <= r.cliffs_delta <= 1.0
    if min(len(a), len(b)) < 4:
        assert r.verdict == INCONCLUSIVE and r.reason.startswith("fewer than 4 trials")
    if r.changed:
        assert r.p_adjusted < r.alpha
        lo, hi = r.rel_change_ci
        increased = lo > r.noise_threshold
        assert increased or hi < -r.noise_threshold
        assert (r.verdict == IMPROVED) == (increased == (direction == "higher"))


def test_smallest_pvalue_is_what_the_test_gives_on_the_most_extreme_split():
    # no ties: the exact bound 2 / C(n_a + n_b, n_a), whichever side holds the small values
    assert smallest_pvalue([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == pytest.approx(2 / math.comb(10, 5))
    assert smallest_pvalue([6, 7, 8, 9], [1, 2, 3, 4, 5, 10]) == pytest.approx(2 / math.comb(10, 4))
    # ties: the tie-corrected normal approximation goes below the untied bound 2/70 = 0.029 (issue 19)
    tied = compare([100.0] * 4, [110.0] * 4, "higher")
    assert smallest_pvalue([100.0] * 4, [110.0] * 4) == pytest.approx(tied.p_value) == pytest.approx(0.0131, abs=1e-4)
    assert tied.verdict == IMPROVED
    assert smallest_pvalue([5.0] * 4, [5.0] * 5) == 1.0  # nothing varies
    assert smallest_pvalue([1, 2, 3], [4, 5, 6, 7]) is None  # no test below 4 trials per side
    # no arrangement of the pooled values reaches below it, ties or not
    rng = np.random.default_rng(3)
    for na, nb, levels in ((4, 4, 3), (4, 7, 5), (5, 5, 100), (9, 12, 6), (6, 10, 1000)):
        pooled = rng.integers(0, levels, na + nb).astype(float)
        floor = smallest_pvalue(pooled[:na], pooled[na:])
        for _ in range(30):
            x = rng.permutation(pooled)
            assert compare(x[:na], x[na:], "higher").p_value >= floor * (1 - 1e-9)


def test_medians_closer_than_the_tools_resolution_are_unchanged_not_inconclusive():
    # ab's connect time is whole ms: on a fast path A is all 0 ms and B has a few 1 ms trials
    a, b = [0.0] * 10, [0.0] * 7 + [1.0] * 3
    plain = compare_metrics([("ab.connect_p50_ms", a, b, "lower", 0.05)])[0]
    assert plain.verdict == "inconclusive" and "median of A is 0" in plain.reason
    stepped = compare_metrics([("ab.connect_p50_ms", a, b, "lower", 0.05, 1.0)])[0]
    assert stepped.verdict == "unchanged" and "closer than the tool's resolution (1)" in stepped.reason
    # a change of whole steps is judged as any other
    worse = compare_metrics([("ab.connect_p50_ms", [2.0, 3.0] * 5, [6.0, 7.0] * 5, "lower", 0.05, 1.0)])[0]
    assert worse.verdict == "regressed"
    with pytest.raises(ValueError, match="resolution must be a finite step > 0"):
        compare_metrics([("m", a, b, "lower", 0.05, 0.0)])
