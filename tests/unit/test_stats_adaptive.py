"""Adaptive repetition: stop on precision of the median CI, within [n_min, n_max]."""

from __future__ import annotations

import numpy as np
import pytest

from vnetbench.stats.adaptive import adaptive_decision

# 100..109: CI ranks (2, 9) for n = 10 -> [101, 108], median 104.5, rel. width 7 / 104.5 = 0.0670
TEN = np.arange(100.0, 110.0)


def test_stops_when_every_key_metric_is_precise_enough():
    stop, reason = adaptive_decision({"tput": TEN}, 0.07, n_min=5, n_max=30)
    assert stop is True
    assert "within target 7%" in reason and "n=10" in reason and "6.7%" in reason
    stop, reason = adaptive_decision({"tput": TEN}, 0.06, n_min=5, n_max=30)
    assert stop is False
    assert "tput 6.7%" in reason


def test_every_key_metric_must_be_precise():
    wide = np.array([100.0, 60, 140, 80, 120, 90, 110, 70, 130, 100])
    stop, reason = adaptive_decision({"tput": TEN, "rtt": wide}, 0.07, n_min=5, n_max=30)
    assert stop is False and "rtt" in reason and "tput" not in reason
    # restricted to the declared key metrics, the wide one does not count
    stop, _ = adaptive_decision({"tput": TEN, "rtt": wide}, 0.07, 5, 30, key_metrics=["tput"])
    assert stop is True


def test_never_stops_before_n_min():
    flat = np.full(8, 42.0)  # relative width 0: as precise as it gets
    stop, reason = adaptive_decision({"m": flat}, 0.05, n_min=10, n_max=20)
    assert (stop, reason) == (False, "n=8 < n_min=10")
    assert adaptive_decision({"m": np.full(10, 42.0)}, 0.05, n_min=10, n_max=20)[0] is True


def test_keeps_going_below_six_trials():
    stop, reason = adaptive_decision({"m": np.full(5, 42.0)}, 0.05, n_min=3, n_max=20)
    assert stop is False and "n >= 6" in reason
    assert adaptive_decision({"m": np.full(6, 42.0)}, 0.05, n_min=3, n_max=20)[0] is True


def test_stops_at_n_max():
    noisy = np.random.default_rng(0).lognormal(0, 1, 20)
    stop, reason = adaptive_decision({"m": noisy}, 0.01, n_min=5, n_max=20)
    assert stop is True and reason.startswith("max reached")
    # n counts the least-measured key metric
    stop, _ = adaptive_decision({"m": noisy, "k": noisy[:12]}, 0.01, n_min=5, n_max=20)
    assert stop is False


def test_zero_median_never_satisfies_a_relative_target():
    zeros = np.array([0.0] * 6 + [0.01] * 4)
    stop, reason = adaptive_decision({"loss": zeros}, 0.5, n_min=5, n_max=30)
    assert stop is False and "median 0" in reason


def test_simulated_runner_stops_early_on_quiet_configurations_only():
    def run(cv, seed):
        rng = np.random.default_rng(seed)
        values = []
        while True:
            values.append(rng.normal(100, cv * 100))
            stop, _ = adaptive_decision({"m": values}, 0.05, n_min=5, n_max=30)
            if stop:
                return len(values)

    quiet = [run(0.01, s) for s in range(20)]
    noisy = [run(0.20, s) for s in range(20)]
    assert max(quiet) <= 8  # CV 1%: the interval is ~2-3% wide as soon as it exists
    assert min(quiet) >= 6
    assert all(n == 30 for n in noisy)  # CV 20%: would need far more than 30 trials


def test_validation():
    with pytest.raises(ValueError, match="n_max"):
        adaptive_decision({"m": TEN}, 0.05, n_min=10, n_max=5)
    with pytest.raises(ValueError):
        adaptive_decision({"m": TEN}, 0.0, n_min=5, n_max=10)
    with pytest.raises(ValueError, match="no key metrics"):
        adaptive_decision({}, 0.05, n_min=5, n_max=10)
    with pytest.raises(ValueError, match="have no values"):
        adaptive_decision({"m": TEN}, 0.05, 5, 10, key_metrics=["x"])
