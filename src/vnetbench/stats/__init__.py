"""Pure statistics for vnetbench: summaries, comparisons, change points, adaptive stopping.

Functions on numpy arrays, no I/O (``junit`` only builds a string). Every
random choice is seeded, so the same data always give the same numbers.

* :mod:`.summary` -- per-metric summaries over trials (median with exact CI, ...)
* :mod:`.compare` -- A vs B verdicts with Mann-Whitney U, bootstrap CI, Holm
* :mod:`.changepoint` -- change points in a history (Hunter's E-divisive)
* :mod:`.adaptive` -- when the runner may stop repeating a configuration
* :mod:`.junit` -- JUnit XML of comparison verdicts for CI servers
"""

from .adaptive import adaptive_decision
from .changepoint import ChangePoint, detect_change_points
from .compare import (
    HIGHER,
    IMPROVED,
    INCONCLUSIVE,
    LOWER,
    REGRESSED,
    UNCHANGED,
    VERDICTS,
    Comparison,
    cliffs_delta,
    compare,
    compare_many,
    compare_metrics,
    holm,
    smallest_pvalue,
)
from .junit import junit_xml
from .summary import Summary, median_ci_ranks, series_percentiles, summarize, summarize_many

__all__ = [
    "HIGHER",
    "LOWER",
    "IMPROVED",
    "REGRESSED",
    "UNCHANGED",
    "INCONCLUSIVE",
    "VERDICTS",
    "Summary",
    "summarize",
    "summarize_many",
    "series_percentiles",
    "median_ci_ranks",
    "Comparison",
    "compare",
    "compare_metrics",
    "compare_many",
    "holm",
    "smallest_pvalue",
    "cliffs_delta",
    "ChangePoint",
    "detect_change_points",
    "adaptive_decision",
    "junit_xml",
]
