"""Benchmark of the statistics layer on a realistic comparison workload.

Two synthetic runs (A = baseline, B = candidate) of 1,000 configurations x 30
trials with 3 metrics each (throughput higher-is-better, RTT and loss
lower-is-better; B regresses some configurations and improves others). Timed:

* summarise every (run, configuration, metric): 6,000 summaries;
* compare A vs B: 1,000 configurations x 3 metrics = 3,000 comparisons,
  Mann-Whitney U + 2,000-resample bootstrap CI each, Holm per configuration.

The reference is a plain numpy mean/std pass over the same arrays, measured
side by side in the same process, so the printed ratio does not depend on
how fast this machine happens to be. Target: the whole thing under 5 s.

Run: python bench/stats.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

_T_START = time.perf_counter()

try:
    import vnetbench.stats  # noqa: F401
except ImportError:  # not installed: use the source tree
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import numpy as np

from vnetbench.stats import compare_many, compare_metrics, summarize, summarize_many

N_CONFIGS = 1000
N_TRIALS = 30
METRICS = (
    ("throughput.rx_mbps", "higher", None),
    ("rtt.p99_ms", "lower", 0.10),
    ("udp.loss_ratio", "lower", None),
)
SEED = 20240601
REPEATS = 3  # best of, for each timed step


def make_runs(seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(configs x trials) arrays per metric for runs A and B."""
    rng = np.random.default_rng(seed)
    level = {
        "throughput.rx_mbps": rng.uniform(100, 9000, N_CONFIGS),
        "rtt.p99_ms": rng.uniform(0.05, 40, N_CONFIGS),
        "udp.loss_ratio": rng.uniform(0.001, 0.3, N_CONFIGS),
    }
    cv = rng.uniform(0.01, 0.08, N_CONFIGS)
    # B: 10% of configurations regress by 15%, 5% improve by 15%, the rest are equal
    kind = rng.choice([0, 1, 2], size=N_CONFIGS, p=[0.85, 0.10, 0.05])
    a, b = {}, {}
    for name, direction, _ in METRICS:
        mu = level[name]
        worse = 0.85 if direction == "higher" else 1.15
        shift = np.select([kind == 1, kind == 2], [worse, 1 / worse], 1.0)
        noise_a = rng.lognormal(0.0, cv[:, None], (N_CONFIGS, N_TRIALS))
        noise_b = rng.lognormal(0.0, cv[:, None], (N_CONFIGS, N_TRIALS))
        a[name] = mu[:, None] * noise_a
        b[name] = (mu * shift)[:, None] * noise_b
    return a, b


def best_of(fn, repeats: int = REPEATS) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def main() -> int:
    a, b = make_runs(SEED)
    arrays = [run[name] for run in (a, b) for name, _, _ in METRICS]

    def baseline():
        return [(m.mean(axis=1), m.std(axis=1, ddof=1)) for m in arrays]

    def summaries():
        return [summarize_many(m) for m in arrays]

    def comparisons():
        groups = [
            [(name, a[name][i], b[name][i], direction, noise) for name, direction, noise in METRICS]
            for i in range(N_CONFIGS)
        ]
        return compare_many(groups, seed=SEED)

    def loop_sample(k: int = 100):
        """The unvectorised way, on the first k configurations: one call per configuration."""
        for i in range(k):
            compare_metrics([(name, a[name][i], b[name][i], d, nz) for name, d, nz in METRICS], seed=SEED)
            for name, _, _ in METRICS:
                summarize(a[name][i])
                summarize(b[name][i])

    # warm caches (bootstrap rank patterns, scipy imports) the way a CLI run would once
    t_cold, _ = best_of(comparisons, repeats=1)

    t_base, _ = best_of(baseline)
    t_sum, sums = best_of(summaries)
    t_cmp, results = best_of(comparisons)
    t_loop = best_of(loop_sample, repeats=1)[0] * (N_CONFIGS / 100)

    n_summaries = sum(len(s) for s in sums)
    flat = [r for g in results for r in g]
    counts = {v: sum(r.verdict == v for r in flat) for v in ("improved", "regressed", "unchanged", "inconclusive")}
    unstable = sum(s.unstable for ss in sums for s in ss)
    total = t_sum + t_cmp

    print(f"data: {N_CONFIGS} configurations x {N_TRIALS} trials x {len(METRICS)} metrics x 2 runs")
    print(f"numpy mean/std pass        {t_base * 1e3:9.1f} ms   (reference, {len(arrays)} arrays)")
    print(f"summarize_many             {t_sum * 1e3:9.1f} ms   {n_summaries} summaries, "
          f"{t_sum / t_base:7.1f}x the numpy pass, {unstable} flagged unstable")
    print(f"compare_many (Holm/config) {t_cmp * 1e3:9.1f} ms   {len(flat)} comparisons, "
          f"{t_cmp / t_base:7.1f}x the numpy pass (first call incl. caches: {t_cold * 1e3:.1f} ms)")
    print(f"per-configuration calls    {t_loop * 1e3:9.1f} ms   same work one configuration at a time "
          f"(extrapolated from 100), {t_loop / total:.1f}x the vectorised path")
    print(f"verdicts: {counts}")
    print(f"total (summaries + comparisons): {total:.3f} s = {total / t_base:.1f}x the numpy pass; "
          f"target < 5 s: {'OK' if total < 5 else 'MISSED'}")
    print(f"script wall time incl. imports, data generation and repeats: {time.perf_counter() - _T_START:.2f} s")
    return 0 if total < 5 else 1


if __name__ == "__main__":
    raise SystemExit(main())
