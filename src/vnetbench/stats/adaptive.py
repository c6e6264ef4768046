"""Adaptive repetition: run trials until the key metrics are known precisely enough.

A fixed repetition count is either wasteful (a quiet configuration is nailed
after 6 trials) or too small (a noisy one needs 20). The runner asks after
every trial whether it may stop. The precision measure is the relative width of
each key metric's exact 95% median interval, (hi - lo) / |median| -- the same
interval the reports show, so "target_ci = 5%" in a scenario means what the
reader of the report sees.

Caveat worth knowing: stopping on precision slightly favours stopping when a
few trials happen to agree, so the realised coverage of an adaptively stopped
interval is a little below nominal. ``n_min`` bounds that effect; that is why
it can never be overridden by the target.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np

from .summary import CI_LEVEL, min_n_for_median_ci, summarize

__all__ = ["adaptive_decision"]


def adaptive_decision(
    values_by_metric: Mapping[str, Iterable[float]],
    target_rel_width: float,
    n_min: int,
    n_max: int,
    *,
    key_metrics: Iterable[str] | None = None,
) -> tuple[bool, str]:
    """Whether the runner may stop repeating a configuration, and why.

    ``values_by_metric`` maps each key metric to its per-trial values so far
    (pass ``key_metrics`` to restrict a larger mapping to the declared keys).
    ``target_rel_width`` is a fraction (0.05 for "5%"). Rules, in order:

    1. n < n_min: continue (never stop early, whatever the intervals say);
    2. n >= n_max: stop, "max reached";
    3. n < 6: continue, the exact median interval does not exist yet;
    4. stop when every key metric's (hi - lo) / |median| <= target, else
       continue naming the metrics still too wide.

    n is the smallest number of values among the key metrics (a metric that
    failed to parse in some trial has not been measured that often).
    """
    if int(n_min) != n_min or int(n_max) != n_max or n_min < 1:
        raise ValueError(f"n_min and n_max must be positive integers, got {n_min!r}, {n_max!r}")
    if n_max < n_min:
        raise ValueError(f"n_max ({n_max}) is smaller than n_min ({n_min}): raise max or lower min")
    if not (target_rel_width > 0 and math.isfinite(target_rel_width)):
        raise ValueError(f"target_rel_width must be a positive fraction (0.05 = 5%), got {target_rel_width!r}")

    if key_metrics is not None:
        keys = list(key_metrics)
        missing = [k for k in keys if k not in values_by_metric]
        if missing:
            raise ValueError(f"key metric(s) {missing} have no values; the workloads do not produce them")
        series = {k: np.asarray(values_by_metric[k], dtype=float) for k in keys}
    else:
        series = {k: np.asarray(v, dtype=float) for k, v in values_by_metric.items()}
    if not series:
        raise ValueError("no key metrics given: declare at least one metric to judge precision by")

    n = min(v.size for v in series.values())
    if n < n_min:
        return False, f"n={n} < n_min={n_min}"
    if n >= n_max:
        return True, f"max reached (n={n}, n_max={n_max})"
    need = min_n_for_median_ci(CI_LEVEL)
    if n < need:
        return False, f"n={n}: the median CI needs n >= {need}"

    widths: dict[str, float] = {}
    for name, v in series.items():
        w = summarize(v).ci_rel_width
        widths[name] = math.inf if w is None else w
    target_txt = f"{100 * target_rel_width:g}%"
    too_wide = {k: w for k, w in widths.items() if not w <= target_rel_width}
    if not too_wide:
        worst = max(widths, key=widths.get)
        return True, (
            f"all {len(widths)} key metric(s) within target {target_txt} at n={n} "
            f"(widest: {worst} {100 * widths[worst]:.1f}%)"
        )
    parts = ", ".join(
        f"{k} {'undefined (median 0)' if math.isinf(w) else f'{100 * w:.1f}%'}"
        for k, w in sorted(too_wide.items(), key=lambda kv: -kv[1])
    )
    return False, f"n={n}: CI wider than target {target_txt}: {parts}"
