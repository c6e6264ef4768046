"""Compare run A (baseline) with run B for one configuration, metric by metric.

The question a CI job asks is "did B get worse by more than noise?", and a
plain p-value cannot answer it: with many trials a 0.5% shift is "significant",
with few a 30% shift is not. So a verdict needs two things at once:

* **evidence** that the distributions differ: the two-sided Mann-Whitney U
  test (rank based, because trial results are skewed and have outliers; no
  normality assumed), Holm-adjusted across the metrics of one comparison so
  that checking ten metrics does not give ten chances of a false alarm;
* **size**: the relative change of the medians, (median_b - median_a) /
  |median_a| (= median_b / median_a - 1 for the positive quantities vnetbench
  measures), with a percentile-bootstrap 95% interval, compared with a noise
  threshold (default 5%, per metric overridable) below which a change is not
  worth anyone's time.

Verdict rules (``p`` is the Holm-adjusted p-value):

* ``improved`` / ``regressed``: p < alpha AND the whole interval lies beyond
  the noise threshold on one side. Which of the two depends on the metric's
  direction: for "lower" is better a decrease is an improvement.
* ``unchanged``: the whole interval lies inside +-noise (whatever p says: a
  significant 1% shift is still within noise).
* ``inconclusive``: anything else, and always below 4 trials per side (with 3
  trials the smallest possible two-sided Mann-Whitney p-value is 0.1).

Cliff's delta, P(B > A) - P(B < A), is reported as a scale-free effect size.

Speed: every comparison of a run goes through one vectorised engine. The
bootstrap uses the fact that the median of a resample depends only on *which
ranks* were drawn: for a given (seed, n) the rank pattern of 2000 resamples is
drawn once and cached, and each comparison's bootstrap medians are a gather
from its sorted values. The same seed therefore gives the same interval for a
metric whatever else is compared alongside it (common random numbers).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

__all__ = [
    "HIGHER",
    "LOWER",
    "IMPROVED",
    "REGRESSED",
    "UNCHANGED",
    "INCONCLUSIVE",
    "VERDICTS",
    "DEFAULT_ALPHA",
    "DEFAULT_NOISE",
    "DEFAULT_N_BOOT",
    "MIN_TRIALS",
    "Comparison",
    "holm",
    "cliffs_delta",
    "compare",
    "compare_metrics",
    "compare_many",
    "smallest_pvalue",
]

HIGHER = "higher"
LOWER = "lower"
DIRECTIONS = (HIGHER, LOWER)

IMPROVED = "improved"
REGRESSED = "regressed"
UNCHANGED = "unchanged"
INCONCLUSIVE = "inconclusive"
VERDICTS = (IMPROVED, REGRESSED, UNCHANGED, INCONCLUSIVE)

DEFAULT_ALPHA = 0.05
DEFAULT_NOISE = 0.05
DEFAULT_N_BOOT = 2000
#: Below this many trials on either side no verdict is given.
MIN_TRIALS = 4
_BOOT_LEVEL = 0.95


@dataclass(frozen=True)
class Comparison:
    """The comparison of one metric between run A (baseline) and run B.

    ``rel_change`` is (median_b - median_a) / |median_a|, ``None`` when
    median_a is 0. ``rel_change_ci`` is its 95% percentile-bootstrap interval,
    ``None`` when it cannot be computed (too few trials, median_a = 0, or the
    interval is unbounded). ``p_value`` is the raw two-sided Mann-Whitney U
    p-value and ``p_adjusted`` the Holm-adjusted one the verdict uses; both are
    ``None`` below 4 trials per side, where no test is made (such metrics are
    not counted in the Holm family either). ``cliffs_delta`` is
    P(B > A) - P(B < A), in [-1, 1].
    """

    metric: str
    direction: str
    n_a: int
    n_b: int
    median_a: float
    median_b: float
    rel_change: float | None
    rel_change_ci: tuple[float, float] | None
    p_value: float | None
    p_adjusted: float | None
    cliffs_delta: float
    noise_threshold: float
    alpha: float
    verdict: str
    reason: str

    @property
    def changed(self) -> bool:
        return self.verdict in (IMPROVED, REGRESSED)

    def to_dict(self) -> dict:
        """Plain JSON-ready dict (the interval becomes a list)."""
        d = asdict(self)
        if d["rel_change_ci"] is not None:
            d["rel_change_ci"] = list(d["rel_change_ci"])
        return d


# ---------------------------------------------------------------------------
# building blocks


def holm(pvalues) -> np.ndarray:
    """Holm step-down adjusted p-values, in input order.

    Sort ascending p_(1) <= ... <= p_(m); adjusted p_(i) =
    max_{j <= i} min(1, (m - j + 1) p_(j)). Rejecting where the adjusted value
    is < alpha controls the family-wise error rate at alpha under any
    dependence between the metrics (they come from the same trials, so they
    are dependent), while being uniformly more powerful than Bonferroni.
    """
    p = np.asarray(pvalues, dtype=float)
    if p.ndim != 1:
        raise ValueError("holm() expects a 1-D sequence of p-values")
    if p.size == 0:
        return p.copy()
    if np.any(np.isnan(p)) or np.any((p < 0) | (p > 1)):
        raise ValueError(f"p-values must lie in [0, 1], got {p.tolist()}")
    m = p.size
    order = np.argsort(p, kind="stable")
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
    adjusted_sorted = np.maximum.accumulate(scaled)
    out = np.empty(m)
    out[order] = adjusted_sorted
    return out


def cliffs_delta(a, b) -> float:
    """Cliff's delta P(B > A) - P(B < A) over all pairs; positive when B tends larger."""
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    if a.size == 0 or b.size == 0:
        raise ValueError("cliffs_delta needs values on both sides")
    return float(np.sign(b[:, None] - a[None, :]).mean())


@functools.lru_cache(maxsize=512)
def _boot_ranks(n: int, n_boot: int, seed: int, side: int) -> tuple[np.ndarray, np.ndarray]:
    """0-based ranks whose values average to each bootstrap resample's median.

    Draw n indices with replacement, sort them: because the data are sorted,
    the k-th smallest drawn index points at the k-th smallest drawn value, so
    the resample's median is (x[j1] + x[j2]) / 2 with j1, j2 the middle drawn
    indices. Depends only on (n, n_boot, seed, side): cache it. ``side``
    (0 for A, 1 for B) keeps the two sides independent when n_a == n_b.
    """
    rng = np.random.default_rng(np.random.SeedSequence([seed, side, n, n_boot]))
    idx = rng.integers(0, n, size=(n_boot, n))
    idx.sort(axis=1)
    j1 = np.ascontiguousarray(idx[:, (n - 1) // 2])
    j2 = np.ascontiguousarray(idx[:, n // 2])
    j1.flags.writeable = False
    j2.flags.writeable = False
    return j1, j2


def _boot_medians(sorted_rows: np.ndarray, j1: np.ndarray, j2: np.ndarray) -> np.ndarray:
    return 0.5 * (sorted_rows[:, j1] + sorted_rows[:, j2])


def _mwu_rows(sa: np.ndarray, sb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row-wise two-sided Mann-Whitney U (U of A, p) with per-row method choice.

    scipy's ``method="auto"`` picks exact vs asymptotic once for a whole batch
    (any tie anywhere switches every row to asymptotic). So that a metric's
    p-value does not depend on what else is in the batch, small-sample rows are
    split by whether they have ties, reproducing the per-row choice.
    """
    from scipy import stats as _sps  # here, not at the top: it takes every command a second to import

    na, nb = sa.shape[1], sb.shape[1]
    if na > 8 and nb > 8:
        res = _sps.mannwhitneyu(sa, sb, alternative="two-sided", method="asymptotic", axis=1)
        return np.asarray(res.statistic, float), np.asarray(res.pvalue, float)
    both = np.sort(np.concatenate([sa, sb], axis=1), axis=1)
    ties = np.any(both[:, 1:] == both[:, :-1], axis=1)
    u = np.empty(sa.shape[0])
    p = np.empty(sa.shape[0])
    for mask, method in ((ties, "asymptotic"), (~ties, "exact")):
        if np.any(mask):
            res = _sps.mannwhitneyu(sa[mask], sb[mask], alternative="two-sided", method=method, axis=1)
            u[mask] = res.statistic
            p[mask] = res.pvalue
    return u, p


def smallest_pvalue(a, b) -> float | None:
    """The smallest raw p-value this module's Mann-Whitney test can give for these values.

    Whatever the trials had measured, the test sees only which of the pooled
    values fell on which side. The most extreme split -- A holds the n_a
    smallest (or the n_a largest) of the pooled values -- gives the smallest
    p-value; it is evaluated with the same test :func:`compare_many` uses
    (exact without ties at up to 8 trials on a side, else the normal
    approximation with tie correction), so ties and unequal sample sizes are
    accounted for. Without ties and with at most 8 trials on a side this is
    2 / C(n_a + n_b, n_a); ties change it, either way. ``None`` below
    :data:`MIN_TRIALS` trials on a side (no test is made), 1.0 when all values
    are equal (reported as unchanged).
    """
    va = np.asarray(a, dtype=float).ravel()
    vb = np.asarray(b, dtype=float).ravel()
    na, nb = va.size, vb.size
    if na < MIN_TRIALS or nb < MIN_TRIALS:
        return None
    pooled = np.sort(np.concatenate([va, vb]))
    if not np.all(np.isfinite(pooled)):
        raise ValueError("values contain NaN/inf; leave failed trials out")
    if pooled[0] == pooled[-1]:
        return 1.0
    sa = np.stack([pooled[:na], pooled[nb:]])  # A lowest, A highest
    sb = np.stack([pooled[na:], pooled[:nb]])
    _, p = _mwu_rows(sa, sb)
    p = p[np.isfinite(p)]
    return float(p.min()) if p.size else 1.0


# ---------------------------------------------------------------------------
# item handling


@dataclass
class _Item:
    metric: str
    a: np.ndarray  # sorted
    b: np.ndarray  # sorted
    direction: str
    noise: float
    resolution: float | None = None  # the tool's step in the metric's unit, where it is coarse
    # filled by the engine
    median_a: float = math.nan
    median_b: float = math.nan
    rel: float | None = None
    ci: tuple[float, float] | None = None
    ci_problem: str | None = None
    p: float | None = None
    p_adj: float | None = None
    delta: float = 0.0
    identical: bool = False


def _as_side(values, metric: str, side: str) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    if arr.ndim != 1:
        raise ValueError(f"{metric}: values of {side} must be one-dimensional, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{metric}: no values for {side}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{metric}: values of {side} contain NaN/inf; leave failed trials out")
    return np.sort(arr)


def _parse_item(item, index: int) -> _Item:
    if not 4 <= len(item) <= 6:
        raise ValueError(
            f"item {index}: expected (metric, a_values, b_values, direction[, noise_threshold[, resolution]]), "
            f"got {len(item)} fields"
        )
    metric, a, b, direction = item[:4]
    noise = item[4] if len(item) > 4 else None
    resolution = item[5] if len(item) > 5 else None
    metric = str(metric)
    if direction not in DIRECTIONS:
        raise ValueError(f"{metric}: direction must be 'higher' or 'lower' (which way is better), got {direction!r}")
    noise = DEFAULT_NOISE if noise is None else float(noise)
    if not (math.isfinite(noise) and noise >= 0):
        raise ValueError(f"{metric}: noise threshold must be a finite fraction >= 0 (0.05 = 5%), got {noise!r}")
    if resolution is not None and not (math.isfinite(float(resolution)) and float(resolution) > 0):
        raise ValueError(f"{metric}: resolution must be a finite step > 0 in the metric's unit, got {resolution!r}")
    return _Item(metric, _as_side(a, metric, "A"), _as_side(b, metric, "B"), direction, noise,
                 None if resolution is None else float(resolution))


def _median_sorted(x: np.ndarray) -> float:
    n = x.size
    return float(0.5 * (x[(n - 1) // 2] + x[n // 2]))


def _rel(med_a: float, med_b: float) -> float | None:
    if med_a == 0:
        return None
    return (med_b - med_a) / abs(med_a)


# ---------------------------------------------------------------------------
# vectorised engine


def _analyse(items: list[_Item], seed: int, n_boot: int) -> None:
    """Fill medians, p-values, Cliff's delta and bootstrap intervals in place."""
    buckets: dict[tuple[int, int], list[_Item]] = {}
    for it in items:
        it.median_a = _median_sorted(it.a)
        it.median_b = _median_sorted(it.b)
        it.rel = _rel(it.median_a, it.median_b)
        it.identical = bool(it.a[0] == it.a[-1] == it.b[0] == it.b[-1])
        if it.a.size < MIN_TRIALS or it.b.size < MIN_TRIALS:
            it.delta = cliffs_delta(it.a, it.b)  # informative only; no test, no interval
            continue
        buckets.setdefault((it.a.size, it.b.size), []).append(it)

    tail = (1.0 - _BOOT_LEVEL) / 2.0
    for (na, nb), group in buckets.items():
        sa = np.stack([it.a for it in group])
        sb = np.stack([it.b for it in group])
        u, p = _mwu_rows(sa, sb)
        delta = 1.0 - 2.0 * u / (na * nb)  # U counts ties as 1/2, so this is P(B>A) - P(B<A)

        ma = _boot_medians(sa, *_boot_ranks(na, n_boot, seed, 0))
        mb = _boot_medians(sb, *_boot_ranks(nb, n_boot, seed, 1))
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = (mb - ma) / np.abs(ma)
        # a resample whose A median is 0 has no relative change: +-inf (0 if B's is 0 too)
        zero = ma == 0
        if np.any(zero):
            rel = np.where(zero, np.where(mb == ma, 0.0, np.copysign(np.inf, mb - ma)), rel)
        frac_zero = zero.mean(axis=1)
        with np.errstate(invalid="ignore"):
            lo, hi = np.quantile(rel, [tail, 1.0 - tail], axis=1)

        for k, it in enumerate(group):
            it.delta = float(delta[k])
            if it.identical:
                # no variation at all: the test statistic is undefined, but the
                # answer is not: nothing changed.
                it.p, it.rel, it.ci = 1.0, 0.0, (0.0, 0.0)
                it.delta = 0.0
                continue
            it.p = float(p[k]) if math.isfinite(p[k]) else 1.0
            if it.rel is None:
                continue
            if math.isfinite(lo[k]) and math.isfinite(hi[k]):
                it.ci = (float(lo[k]), float(hi[k]))
            else:
                it.ci_problem = (
                    "bootstrap interval of the relative change is unbounded "
                    f"(median of A is 0 in {100 * frac_zero[k]:.1f}% of resamples)"
                )


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def _p(x: float) -> str:
    return f"{x:.2g}" if x >= 0.001 else f"{x:.1e}"


def _verdict(it: _Item, alpha: float) -> tuple[str, str]:
    """Verdict and a sentence a person can act on."""
    if it.a.size < MIN_TRIALS or it.b.size < MIN_TRIALS:
        return INCONCLUSIVE, f"fewer than {MIN_TRIALS} trials per side (a={it.a.size}, b={it.b.size})"
    if it.identical:
        return UNCHANGED, f"all values identical on both sides ({it.a[0]:g}): no change"
    if it.resolution and abs(it.median_b - it.median_a) < it.resolution:
        return UNCHANGED, (f"medians {it.median_a:g} and {it.median_b:g} are closer than the tool's resolution "
                           f"({it.resolution:g}): no change it can show")
    if it.rel is None:
        return INCONCLUSIVE, (
            f"relative change undefined: median of A is 0 (median of B is {it.median_b:g}); "
            f"p={_p(it.p_adj)}"
        )
    if it.ci is None:
        return INCONCLUSIVE, it.ci_problem or "no interval for the relative change"

    lo, hi = it.ci
    noise = it.noise
    better = "higher" if it.direction == HIGHER else "lower"
    change = f"median {_pct(it.rel)} (95% CI {_pct(lo)} to {_pct(hi)})"
    ptxt = f"p={_p(it.p_adj)}" + (f" (Holm; raw {_p(it.p)})" if it.p_adj != it.p else "")
    beyond_up = lo > noise
    beyond_down = hi < -noise
    if (beyond_up or beyond_down) and it.p_adj < alpha:
        increased = beyond_up
        good = increased == (it.direction == HIGHER)
        verdict = IMPROVED if good else REGRESSED
        return verdict, (
            f"{change} beyond the +-{100 * noise:g}% noise threshold and {ptxt} < {alpha:g}; "
            f"{better} is better"
        )
    if -noise <= lo and hi <= noise:
        extra = f", although {ptxt} < {alpha:g}" if it.p_adj < alpha else f", {ptxt}"
        return UNCHANGED, f"{change} within the +-{100 * noise:g}% noise threshold{extra}"
    if beyond_up or beyond_down:
        return INCONCLUSIVE, (
            f"{change} beyond the +-{100 * noise:g}% noise threshold but not significant: "
            f"{ptxt} >= {alpha:g}"
        )
    return INCONCLUSIVE, (
        f"{change} straddles the +-{100 * noise:g}% noise threshold, {ptxt}; more trials would narrow it"
    )


def _check_common(alpha: float, seed: int, n_boot: int) -> None:
    if not (0 < alpha < 1):
        raise ValueError(f"alpha must lie in (0, 1), got {alpha!r}")
    if int(seed) != seed or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    if int(n_boot) != n_boot or n_boot < 100:
        raise ValueError(f"n_boot must be an integer >= 100, got {n_boot!r}")


def compare_many(
    groups: Sequence[Sequence[tuple]],
    *,
    alpha: float = DEFAULT_ALPHA,
    seed: int = 0,
    n_boot: int = DEFAULT_N_BOOT,
) -> list[list[Comparison]]:
    """Compare many configurations at once; Holm is applied within each group.

    ``groups`` holds one list of items per configuration, each item
    ``(metric_name, a_values, b_values, direction, noise_threshold)`` (the
    threshold may be omitted or ``None`` for the 5% default). Everything is
    computed in a few vectorised passes; the result for a metric depends only
    on its own data, its group's p-values (through Holm) and the seed.
    """
    _check_common(alpha, seed, n_boot)
    parsed = [[_parse_item(item, i) for i, item in enumerate(items)] for items in groups]
    _analyse([it for g in parsed for it in g], int(seed), int(n_boot))

    out: list[list[Comparison]] = []
    for g in parsed:
        tested = [it for it in g if it.p is not None]
        if tested:
            for it, padj in zip(tested, holm([it.p for it in tested]).tolist()):
                it.p_adj = padj
        results = []
        for it in g:
            verdict, reason = _verdict(it, alpha)
            results.append(
                Comparison(
                    metric=it.metric,
                    direction=it.direction,
                    n_a=int(it.a.size),
                    n_b=int(it.b.size),
                    median_a=it.median_a,
                    median_b=it.median_b,
                    rel_change=it.rel,
                    rel_change_ci=it.ci,
                    p_value=it.p,
                    p_adjusted=it.p_adj,
                    cliffs_delta=it.delta,
                    noise_threshold=it.noise,
                    alpha=alpha,
                    verdict=verdict,
                    reason=reason,
                )
            )
        out.append(results)
    return out


def compare_metrics(
    items: Sequence[tuple],
    *,
    alpha: float = DEFAULT_ALPHA,
    seed: int = 0,
    n_boot: int = DEFAULT_N_BOOT,
) -> list[Comparison]:
    """Compare the metrics of one configuration, Holm-adjusting across them.

    ``items``: list of ``(metric_name, a_values, b_values, direction,
    noise_threshold)``. Returns one :class:`Comparison` per item, in order,
    each with the raw and the Holm-adjusted p-value; verdicts use the adjusted
    one.
    """
    return compare_many([items], alpha=alpha, seed=seed, n_boot=n_boot)[0]


def compare(
    a,
    b,
    direction: str,
    noise_threshold: float | None = DEFAULT_NOISE,
    *,
    metric: str = "",
    alpha: float = DEFAULT_ALPHA,
    seed: int = 0,
    n_boot: int = DEFAULT_N_BOOT,
) -> Comparison:
    """Compare a single metric (a family of one: the adjusted p equals the raw p)."""
    return compare_metrics([(metric, a, b, direction, noise_threshold)], alpha=alpha, seed=seed, n_boot=n_boot)[0]
