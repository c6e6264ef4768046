"""Change points in a metric's history: where did performance shift, and by how much?

``vnetbench history`` shows one number per run for a configuration and metric.
A regression that crept in at some kernel version shows up as a *step* in that
series; looking run-to-run cannot see it through noise, and a fixed threshold
either fires on noise or misses small steps. We use the approach of Hunter
(Fleming et al., "Hunter: Using Change Point Detection to Hunt for Performance
Regressions", ICPE 2023; now Apache Otava), which builds on E-divisive means
(Matteson & James, "A Nonparametric Approach for Multiple Change Point Analysis
of Multivariate Data", JASA 2014). Written here from the published method on
numpy/scipy.

1. **Divergence.** For a segment Z_1..Z_L and a split tau, with
   X = Z_1..Z_tau and Y = Z_tau+1..Z_L, the energy statistic is

       E = 2/(tau m) sum|X_i - Y_j| - C(tau,2)^-1 sum_{i<k}|X_i - X_k|
           - C(m,2)^-1 sum_{j<k}|Y_j - Y_k|,     m = L - tau,

   and Q(tau) = tau m / L * E. E is >= 0 in expectation and 0 only when both
   sides have one distribution, so argmax Q is the most likely split. All
   Q(tau) of a segment come from one 2-D prefix sum of the distance matrix.

2. **Significance by t-test (Hunter's change).** The original tests a split by
   random permutations, whose p-value changes from run to run unless one pays
   for thousands of permutations. Hunter tests it with Student's two-sample
   t-test (equal variances, as Hunter does) between the two sides: cheap and
   deterministic, so the same history always yields the same change points.

3. **Split in windows.** E-divisive over a long series lets a large step hide
   a small nearby one, so the series is cut into windows of ``window`` points
   that overlap by half; in each window E-divisive runs recursively (best split
   of any current segment, accepted while its t-test p-value is below a
   relaxed first-pass threshold, 10x ``pvalue``). The next window starts half a
   window on, or at the last change found if that is further, so a change is
   never found twice. One addition of ours: candidates in the last quarter of
   a window (at least its last MIN_SEGMENT points, where the window has other
   legal splits; never in the final window) are left to the next window,
   which sees them from its middle. At a window's edge a step has too few
   points on one side and E-divisive shifts it by a few positions into the
   old regime; the shifted and the true position then both survive as a
   spurious 3-point "regime". Windows under 11 points are too short for this
   with half-window steps (a window of 6 has a single legal split): there
   the next window starts fewer points on, down to one, so that every
   position is a legal split of some window at least MIN_SEGMENT from both of
   its edges (see ``_window_plan``).

4. **Merge.** Candidates are then re-tested against the full segments between
   their neighbours, which the windows could not see. While some candidate has
   p > ``pvalue`` or a relative magnitude |mean_after / mean_before - 1| <
   ``min_magnitude``, the weakest (largest p; ties: smallest magnitude) is
   removed and its two neighbours, whose segments just grew, are re-tested.

Deterministic: no random numbers anywhere.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

__all__ = ["ChangePoint", "detect_change_points", "edivisive_q"]

#: Fewest points on either side of a split (and of a t-test). Two would let a
#: pair of outliers form a "regime"; three still finds steps near the edges.
MIN_SEGMENT = 3
#: The split pass is looser than the final threshold by this factor, so the
#: merge pass (which sees longer segments) gets to judge borderline candidates.
FIRST_PASS_FACTOR = 10.0


@dataclass(frozen=True)
class ChangePoint:
    """A shift in the series.

    ``index`` is the first index of the new regime; the means are over the
    segments bounded by the neighbouring change points (or the series ends).
    ``rel_change`` = (mean_after - mean_before) / |mean_before|, ``None`` when
    mean_before is 0. ``pvalue`` is the two-sample t-test between the segments.
    """

    index: int
    mean_before: float
    mean_after: float
    rel_change: float | None
    pvalue: float

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------------------
# E-divisive divergence


def edivisive_q(segment, min_size: int = MIN_SEGMENT) -> np.ndarray:
    """Q(tau) for every split tau of a 1-D segment, NaN where a side is < min_size.

    Element tau of the result is the statistic for X = segment[:tau],
    Y = segment[tau:] (alpha = 1, i.e. plain absolute differences). O(L^2)
    time and memory for a segment of length L, all in numpy.
    """
    z = np.asarray(segment, dtype=float)
    L = z.size
    q = np.full(L + 1, np.nan)
    if L < 2 * min_size:
        return q
    d = np.abs(z[:, None] - z[None, :])
    # P[i, j] = sum(d[:i, :j])
    P = np.zeros((L + 1, L + 1))
    np.cumsum(np.cumsum(d, axis=0), axis=1, out=P[1:, 1:])
    t = np.arange(min_size, L - min_size + 1)
    m = L - t
    within_x = P[t, t] / 2.0
    within_y = (P[L, L] - P[t, L] - P[L, t] + P[t, t]) / 2.0
    between = P[t, L] - P[t, t]
    e = 2.0 * between / (t * m) - within_x / (t * (t - 1) / 2.0) - within_y / (m * (m - 1) / 2.0)
    q[t] = t * m / L * e
    return q


def _ttest(left: np.ndarray, right: np.ndarray) -> float:
    """Two-sided Student t-test p-value; degenerate (zero-variance) cases decided directly."""
    if left.size < 2 or right.size < 2:
        return 1.0
    if np.ptp(left) == 0 and np.ptp(right) == 0:
        # no noise at all: any difference of levels is certain, none is nothing
        return 0.0 if left[0] != right[0] else 1.0
    # Student's pooled-variance t-test, as scipy.stats.ttest_ind(equal_var=True)
    # computes it, without its per-call overhead (the windowed split makes one
    # test per window, and short windows make many windows).
    n1, n2 = left.size, right.size
    df = n1 + n2 - 2
    pooled = ((n1 - 1) * left.var(ddof=1) + (n2 - 1) * right.var(ddof=1)) / df
    se = math.sqrt(pooled * (1.0 / n1 + 1.0 / n2))
    if not se > 0:
        return 1.0
    t = (left.mean() - right.mean()) / se
    from scipy import special as _spc  # here, not at the top: scipy takes every command a second to import

    p = 2.0 * _spc.stdtr(df, -abs(t))
    return float(p) if math.isfinite(p) else 1.0


def _edivisive_window(w: np.ndarray, max_p: float) -> list[int]:
    """Change points (indices into ``w``) by recursive E-divisive with a t-test stop rule."""
    bounds = [0, w.size]
    found: list[int] = []
    if w.size == 0 or np.ptp(w) == 0:
        return found  # one level throughout: nothing to split (every Q is 0, every p 1)
    # best split of each current segment, cached until the segment is split
    best: dict[tuple[int, int], tuple[float, int]] = {}
    while True:
        choice = None
        for s, e in zip(bounds[:-1], bounds[1:]):
            if (s, e) not in best:
                q = edivisive_q(w[s:e], MIN_SEGMENT)
                if np.all(np.isnan(q)):
                    best[(s, e)] = (-math.inf, -1)
                else:
                    tau = int(np.nanargmax(q))
                    best[(s, e)] = (float(q[tau]), s + tau)
            qv, idx = best[(s, e)]
            if idx >= 0 and (choice is None or qv > choice[0]):
                choice = (qv, idx, s, e)
        if choice is None:
            return found
        _, idx, s, e = choice
        if _ttest(w[s:idx], w[idx:e]) >= max_p:
            return found
        found.append(idx)
        bounds = sorted(bounds + [idx])


def _window_plan(window: int) -> tuple[int, int]:
    """(margin, step) of the windowed split for windows of ``window`` points.

    A window (except the last) keeps a candidate at relative position i only
    if i < window - margin, and the next window starts ``step`` points on. For
    every position to be judged away from a window's edge, a deferred position
    must land at least MIN_SEGMENT into the next window and the kept positions
    of consecutive windows must leave no gap; both hold when
    step <= window - margin - MIN_SEGMENT. The margin is a quarter window, at
    least MIN_SEGMENT, but never so large that a window keeps nothing (a window
    of 6 has one legal split, MIN_SEGMENT from its end, and keeps it). The step
    is half a window (Hunter's overlap) from 11 points on, shorter below, down
    to one point for windows of 6 and 7.
    """
    margin = min(max(MIN_SEGMENT, window // 4), window - MIN_SEGMENT - 1)
    step = max(1, min(window // 2, window - margin - MIN_SEGMENT))
    return margin, step


def _split(x: np.ndarray, window: int, max_p: float) -> list[int]:
    margin, step = _window_plan(window)
    start = 0
    found: list[int] = []
    n = x.size
    while start < n:
        end = min(start + window, n)
        new = sorted(start + i for i in _edivisive_window(x[start:end], max_p))
        if end < n:
            # Near a window's end a step has too few points after it to be
            # placed well (E-divisive cannot split closer than MIN_SEGMENT to
            # the edge, so it shifts the split into the old regime). The next
            # window sees that region at least MIN_SEGMENT from its start:
            # leave it to it.
            new = [i for i in new if i < end - margin]
        found.extend(new)
        if end == n:
            break
        start = max(start + step, new[-1] if new else 0)
    return sorted(set(found))


def _magnitude(before: float, after: float) -> float | None:
    if before == 0:
        return None
    return (after - before) / abs(before)


def _merge(x: np.ndarray, cands: list[int], max_p: float, min_magnitude: float) -> list[ChangePoint]:
    cps = list(cands)

    def stats(i: int) -> ChangePoint:
        lo = cps[i - 1] if i > 0 else 0
        hi = cps[i + 1] if i + 1 < len(cps) else x.size
        left, right = x[lo : cps[i]], x[cps[i] : hi]
        mb, ma = float(left.mean()), float(right.mean())
        return ChangePoint(cps[i], mb, ma, _magnitude(mb, ma), _ttest(left, right))

    def weak(cp: ChangePoint) -> bool:
        if cp.pvalue > max_p:
            return True
        if cp.rel_change is None:  # from a zero level: weak only if it stays at zero
            return cp.mean_after == 0
        return abs(cp.rel_change) < min_magnitude

    current = [stats(i) for i in range(len(cps))]
    while current:
        weak_ones = [i for i, cp in enumerate(current) if weak(cp)]
        if not weak_ones:
            break
        worst = max(
            weak_ones,
            key=lambda i: (
                current[i].pvalue,
                -abs(current[i].rel_change) if current[i].rel_change is not None else -math.inf,
            ),
        )
        del cps[worst]
        del current[worst]
        for i in (worst - 1, worst):  # the neighbours whose segments just grew
            if 0 <= i < len(cps):
                current[i] = stats(i)
    return current


def detect_change_points(
    values,
    window: int = 50,
    pvalue: float = 0.001,
    min_magnitude: float = 0.05,
) -> list[ChangePoint]:
    """Change points of a 1-D series (oldest first), by Hunter's split-and-merge E-divisive.

    ``window``: points per E-divisive window (windows overlap by half).
    ``pvalue``: a change is kept only if the t-test between its neighbouring
    segments gives p <= this. ``min_magnitude``: and only if the means differ
    by at least this fraction (0.05 = 5%; 0 disables). Returns the change
    points in index order; an empty list for a series too short to split.
    """
    x = np.asarray(values, dtype=float)
    if x.ndim != 1:
        raise ValueError(f"series must be one-dimensional, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("series contains NaN/inf: drop runs without a value first")
    if int(window) != window or window < 2 * MIN_SEGMENT:
        raise ValueError(f"window must be an integer >= {2 * MIN_SEGMENT}, got {window!r}")
    if not (0 < pvalue < 1):
        raise ValueError(f"pvalue must lie in (0, 1), got {pvalue!r}")
    if not (min_magnitude >= 0 and math.isfinite(min_magnitude)):
        raise ValueError(f"min_magnitude must be a finite fraction >= 0, got {min_magnitude!r}")
    if x.size < 2 * MIN_SEGMENT:
        return []
    first_pass = max(pvalue, min(0.5, pvalue * FIRST_PASS_FACTOR))
    candidates = _split(x, int(window), first_pass)
    return _merge(x, candidates, pvalue, float(min_magnitude))
