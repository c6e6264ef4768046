"""Per-metric summaries of trials, and per-trial metrics from within-trial series.

The unit of analysis is the trial: one number per trial per metric (see the
design guide, "Data model"). A summary describes the spread of those numbers
across repetitions of one configuration.

Why these statistics:

* The **median** with an **exact order-statistic confidence interval** is the
  headline number. Network measurements are skewed (a few slow trials when a
  CPU migrates or a queue builds), so the mean and a t-interval would be pulled
  by exactly the trials we trust least. The interval [x_(l), x_(u)] needs no
  distributional assumption: the number of trials below the true median is
  Binomial(n, 1/2), so the coverage is a binomial sum, exact for any continuous
  distribution. At 95% it exists only from n = 6 on (with n = 5 even
  [min, max] covers only 1 - 2/32 = 93.75%), hence the ``ci_note`` below that.
* **Mean, standard deviation (ddof=1) and CV** are kept because people compare
  them with published tables, and the CV is the quickest "is this setup
  stable?" signal: CV >= 10% flags the configuration as ``unstable``.
* **Tukey fences** (1.5 IQR) count outliers low and high. They are reported,
  never removed: a slow trial is data about the system, and dropping it would
  make a flaky setup look good.

Everything is computed by one vectorised kernel over a (configurations x
trials) block, so summarising thousands of configurations costs a few numpy
passes; :func:`summarize` is that kernel applied to one row, so both paths give
identical numbers.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import numpy as np

from . import binomial

__all__ = [
    "CI_LEVEL",
    "UNSTABLE_CV",
    "TUKEY_K",
    "Summary",
    "median_ci_ranks",
    "min_n_for_median_ci",
    "summarize",
    "summarize_many",
    "series_percentiles",
]

#: Nominal confidence of the median interval.
CI_LEVEL = 0.95
#: A configuration whose coefficient of variation reaches this is flagged unstable.
UNSTABLE_CV = 0.10
#: Tukey's fence multiplier on the inter-quartile range.
TUKEY_K = 1.5


@dataclass(frozen=True)
class Summary:
    """What the trials of one configuration say about one metric.

    ``ci`` is the exact (order-statistic) interval for the median, ``None``
    when there are too few trials for one to exist (``ci_note`` says so).
    ``ci_ranks`` are the 1-based ranks (l, u) of the order statistics used and
    ``ci_coverage`` the interval's exact coverage, which is >= the nominal
    ``ci_level`` (a discrete distribution cannot hit 95% exactly).
    Percentiles use numpy's default linear interpolation.
    """

    n: int
    median: float
    ci: tuple[float, float] | None
    ci_level: float
    ci_coverage: float | None
    ci_ranks: tuple[int, int] | None
    ci_note: str | None
    mean: float
    std: float | None
    cv: float | None
    min: float
    max: float
    p5: float
    p95: float
    q1: float
    q3: float
    fence_low: float
    fence_high: float
    outliers_low: int
    outliers_high: int
    unstable: bool

    @property
    def outliers(self) -> int:
        """Outliers on both sides (counted, never removed)."""
        return self.outliers_low + self.outliers_high

    @property
    def ci_rel_width(self) -> float | None:
        """(hi - lo) / |median|: the precision measure adaptive repetition stops on.

        ``None`` without an interval; ``inf`` when the median is 0 (a relative
        width is meaningless there, and infinity never satisfies a target).
        """
        if self.ci is None:
            return None
        width = self.ci[1] - self.ci[0]
        if self.median == 0:
            return 0.0 if width == 0 else math.inf
        return width / abs(self.median)

    def to_dict(self) -> dict:
        """Plain JSON-ready dict (tuples become lists)."""
        d = asdict(self)
        for key in ("ci", "ci_ranks"):
            if d[key] is not None:
                d[key] = list(d[key])
        return d


# ---------------------------------------------------------------------------
# exact median interval


@functools.lru_cache(maxsize=1024)
def median_ci_ranks(n: int, level: float = CI_LEVEL) -> tuple[int, int, float] | None:
    """1-based ranks (l, u) of the order statistics bounding the median, and coverage.

    The number of observations below the true median is B ~ Binomial(n, 1/2),
    so P(x_(l) <= median <= x_(u)) = P(l <= B <= u - 1). We take the symmetric
    pair u = n + 1 - l with the largest l whose coverage is still >= ``level``;
    coverage = 1 - 2 * P(B <= l - 1). Returns ``None`` when even [min, max]
    falls short (n < 6 at 95%).
    """
    if n < 1:
        return None
    tail = (1.0 - level) / 2.0
    # the largest rank l with P(B <= l - 1) <= tail, so that P(l <= B <= n - l) >= level
    l, below = 0, 0.0  # below = P(B <= l - 1)
    while below + (step := binomial.pmf(l, n, 0.5)) <= tail:
        below += step
        l += 1
    if l < 1:
        return None
    u = n + 1 - l
    if u < l:
        return None
    coverage = 1.0 - 2.0 * binomial.cdf(l - 1, n, 0.5)
    return l, u, coverage


@functools.lru_cache(maxsize=16)
def min_n_for_median_ci(level: float = CI_LEVEL) -> int:
    """Smallest n for which an exact median interval at ``level`` exists (6 at 95%)."""
    n = 1
    while median_ci_ranks(n, level) is None:
        n += 1
    return n


# ---------------------------------------------------------------------------
# input checks


def _as_1d(
    values,
    what: str = "values",
    hint: str = "leave failed trials out instead of storing a placeholder",
) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    if arr.ndim != 1:
        raise ValueError(f"{what} must be one-dimensional (one number per trial), got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{what} is empty: a summary needs at least one trial")
    if not np.all(np.isfinite(arr)):
        bad = int(np.count_nonzero(~np.isfinite(arr)))
        raise ValueError(
            f"{what} contains {bad} non-finite value(s) (NaN/inf): {hint}"
        )
    return arr


def _as_block(matrix) -> np.ndarray:
    arr = np.asarray(matrix, dtype=float)
    if arr.ndim != 2 or arr.shape[1] == 0:
        raise ValueError(f"expected a (configurations x trials) matrix, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(
            "matrix contains NaN/inf: pass ragged groups (a list of arrays) when "
            "configurations have different numbers of successful trials"
        )
    return arr


# ---------------------------------------------------------------------------
# vectorised kernel


def _summarize_block(block: np.ndarray) -> list[Summary]:
    """Summaries of every row of a finite (m x n) block; all rows share n."""
    m, n = block.shape
    s = np.sort(block, axis=1)
    median = 0.5 * (s[:, (n - 1) // 2] + s[:, n // 2])
    mean = s.mean(axis=1)
    if n > 1:
        std = s.std(axis=1, ddof=1)
    else:
        std = np.full(m, np.nan)
    p5, q1, q3, p95 = np.percentile(s, [5.0, 25.0, 75.0, 95.0], axis=1)
    iqr = q3 - q1
    fence_lo = q1 - TUKEY_K * iqr
    fence_hi = q3 + TUKEY_K * iqr
    out_lo = np.count_nonzero(s < fence_lo[:, None], axis=1)
    out_hi = np.count_nonzero(s > fence_hi[:, None], axis=1)

    ranks = median_ci_ranks(n, CI_LEVEL)
    if ranks is not None:
        l, u, coverage = ranks
        ci_lo, ci_hi = s[:, l - 1], s[:, u - 1]
        note = None
    else:
        note = f"n too small (need >= {min_n_for_median_ci(CI_LEVEL)})"

    # Python scalars so the dataclass is JSON- and comparison-friendly.
    median_l, mean_l, std_l = median.tolist(), mean.tolist(), std.tolist()
    min_l, max_l = s[:, 0].tolist(), s[:, -1].tolist()
    p5_l, p95_l, q1_l, q3_l = p5.tolist(), p95.tolist(), q1.tolist(), q3.tolist()
    flo_l, fhi_l = fence_lo.tolist(), fence_hi.tolist()
    olo_l, ohi_l = out_lo.tolist(), out_hi.tolist()
    if ranks is not None:
        cil_l, cih_l = ci_lo.tolist(), ci_hi.tolist()

    result = []
    for i in range(m):
        sd = std_l[i] if n > 1 else None
        mu = mean_l[i]
        cv = (sd / abs(mu)) if (sd is not None and mu != 0) else None
        result.append(
            Summary(
                n=n,
                median=median_l[i],
                ci=(cil_l[i], cih_l[i]) if ranks is not None else None,
                ci_level=CI_LEVEL,
                ci_coverage=coverage if ranks is not None else None,
                ci_ranks=(l, u) if ranks is not None else None,
                ci_note=note,
                mean=mu,
                std=sd,
                cv=cv,
                min=min_l[i],
                max=max_l[i],
                p5=p5_l[i],
                p95=p95_l[i],
                q1=q1_l[i],
                q3=q3_l[i],
                fence_low=flo_l[i],
                fence_high=fhi_l[i],
                outliers_low=olo_l[i],
                outliers_high=ohi_l[i],
                unstable=cv is not None and cv >= UNSTABLE_CV,
            )
        )
    return result


# ---------------------------------------------------------------------------
# public API


def summarize(values) -> Summary:
    """Summary of one metric over the trials of one configuration.

    ``values`` holds one finite number per successful trial. Raises
    ``ValueError`` for empty or non-finite input: a failed trial has no value,
    it must not be stored as 0 or NaN and then averaged in.
    """
    arr = _as_1d(values)
    return _summarize_block(arr[None, :])[0]


def summarize_many(matrix_or_groups) -> list[Summary]:
    """Summaries of many configurations at once, in input order.

    Accepts either a 2-D array (configurations x trials, every configuration
    with the same number of trials) or a sequence of 1-D arrays of possibly
    different lengths (configurations that lost trials). Groups of equal
    length are stacked and summarised by one vectorised pass each, so the cost
    is a few numpy operations per distinct trial count, not per configuration.
    The numbers are identical to calling :func:`summarize` on each row.
    """
    if isinstance(matrix_or_groups, np.ndarray) and matrix_or_groups.ndim == 2:
        return _summarize_block(_as_block(matrix_or_groups))
    groups = [_as_1d(g, f"group {i}") for i, g in enumerate(matrix_or_groups)]
    if not groups:
        return []
    by_len: dict[int, list[int]] = {}
    for i, g in enumerate(groups):
        by_len.setdefault(g.size, []).append(i)
    out: list[Summary | None] = [None] * len(groups)
    for idx in by_len.values():
        block = np.stack([groups[i] for i in idx])
        for i, summary in zip(idx, _summarize_block(block)):
            out[i] = summary
    return out  # type: ignore[return-value]


def series_percentiles(
    values, qs: Iterable[float] = (50, 90, 99, 99.9)
) -> dict[float, float]:
    """Percentiles of a within-trial series, turning it into per-trial metrics.

    Example: the per-packet RTTs of one ping run become that trial's
    ``rtt.p50_ms``, ``rtt.p90_ms``, ``rtt.p99_ms`` and ``rtt.p999_ms``. These
    are then summarised *across* trials like any other metric; pooling the
    packets of all trials instead would treat correlated packets as
    independent trials and make intervals far too narrow.

    Linear interpolation (numpy's default), so the result does not jump when
    one packet more or less is counted. Lost packets have no RTT: leave them
    out (loss is its own metric). Keys are the requested ``qs`` as floats.
    """
    arr = _as_1d(values, "series", "drop lost packets (loss is its own metric)")
    q = np.asarray(list(qs), dtype=float)
    if q.ndim != 1 or q.size == 0:
        raise ValueError("qs must be a non-empty sequence of percentiles")
    if np.any((q < 0) | (q > 100)):
        raise ValueError(f"percentiles must lie in [0, 100], got {q.tolist()}")
    vals = np.percentile(arr, q)
    return {float(k): float(v) for k, v in zip(q.tolist(), vals.tolist())}

