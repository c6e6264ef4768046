"""Max-min fair shares (topology/fairness.py), and the names of metrics when several workloads of a trial run
the same tool (metrics.py, runner/bench.py)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from vnetbench.metrics import METRICS, base_name, in_order, metric, qualified
from vnetbench.scenario.load import workload_order
from vnetbench.runner.bench import _named_after, _share_fairness
from vnetbench.store.db import SampleRecord, SeriesRecord
from vnetbench.topology.fairness import max_min_shares, share_fairness
from vnetbench.workloads.base import Measurement

INF = math.inf
PARKING = {"long": ["b1", "b2"], "c1": ["b1"], "c2": ["b2"]}


@pytest.mark.parametrize("capacity, demands, shares", [
    # the parking lot: each bottleneck shared by the flows crossing it; what the long flow cannot use on b2
    # goes to the cross flow there
    ({"b1": 10, "b2": 30}, {"long": INF, "c1": INF, "c2": INF}, {"long": 5, "c1": 5, "c2": 25}),
    ({"b1": 10, "b2": 10}, {"long": INF, "c1": INF, "c2": INF}, {"long": 5, "c1": 5, "c2": 5}),
    # a flow that asks for less than its share gets what it asks; the others share the rest
    ({"b1": 10, "b2": 30}, {"long": INF, "c1": 2, "c2": INF}, {"long": 8, "c1": 2, "c2": 22}),
    # a link without a rate bounds nothing: the flow's demand does, or nothing does
    ({"b1": 10}, {"long": INF, "c1": INF, "c2": 7}, {"long": 5, "c1": 5, "c2": 7}),
    ({"b1": 10}, {"long": INF, "c1": INF, "c2": INF}, {"long": 5, "c1": 5, "c2": None}),
    # a flow that asks for nothing gets nothing and takes nothing from the others
    ({"b1": 10, "b2": 30}, {"long": 0, "c1": INF, "c2": INF}, {"long": 0, "c1": 10, "c2": 30}),
])
def test_max_min_shares(capacity, demands, shares):
    got = max_min_shares(demands, PARKING, capacity)
    assert got == {f: pytest.approx(v) if v is not None else None for f, v in shares.items()}


def test_max_min_shares_fill_every_link_a_flow_could_still_use():
    # random graphs: no flow could get more without a link over its capacity or taking from a flow with less
    rng = np.random.default_rng(7)
    for _ in range(200):
        links = {f"l{i}": float(rng.integers(1, 100)) for i in range(rng.integers(1, 6))}
        paths = {f"f{j}": list(rng.choice(list(links), size=rng.integers(1, len(links) + 1), replace=False))
                 for j in range(rng.integers(1, 8))}
        shares = max_min_shares({f: INF for f in paths}, paths, links)
        load = {link: sum(shares[f] for f in paths if link in paths[f]) for link in links}
        assert all(load[link] <= links[link] * (1 + 1e-9) for link in links)
        for f, path in paths.items():
            # each flow has a bottleneck: a full link on its path where no flow gets more than it does
            assert any(load[link] >= links[link] * (1 - 1e-9)
                       and all(shares[g] <= shares[f] * (1 + 1e-9) for g in paths if link in paths[g])
                       for link in path), (links, paths, shares)


def test_a_metric_named_after_its_workload_is_the_registered_one():
    m = METRICS["throughput.rx_mbps@cross1"]
    assert m.name == "throughput.rx_mbps@cross1" and m.unit == "Mbit/s" and m.direction == "higher"
    assert m.nothing == metric("throughput.rx_mbps").nothing and "(workload cross1)" in m.description
    assert "throughput.rx_mbps@long" in METRICS and "no.such@long" not in METRICS
    assert "throughput.rx_mbps@" not in METRICS  # a qualifier names a workload
    assert base_name(qualified("rtt.p50_ms", "probe")) == "rtt.p50_ms"
    # shown in the order of the preferred, each followed by its workloads' forms
    present = {"rtt.p50_ms", "throughput.rx_mbps@long", "throughput.rx_mbps@cross1", "cpu.util_pct"}
    assert in_order(["throughput.rx_mbps", "rtt.p50_ms", "cpu.util_pct"], present) == [
        "throughput.rx_mbps@cross1", "throughput.rx_mbps@long", "rtt.p50_ms", "cpu.util_pct"]
    # ... in the scenario's order of its workloads where it is known (the stored scenario text's), others after
    text = '[workload.long]\ntool = "iperf3"\n[workload.cross1]\ntool = "iperf3"\n'
    assert workload_order(text) == ["long", "cross1"] and workload_order("not = [toml") == []
    assert in_order(["throughput.rx_mbps"], present | {"throughput.rx_mbps@a"}, workload_order(text)) == [
        "throughput.rx_mbps@long", "throughput.rx_mbps@cross1", "throughput.rx_mbps@a"]


def test_a_measurement_is_named_after_its_workload_metrics_series_and_undefined():
    m = Measurement()
    m.samples.append(SampleRecord("throughput.rx_mbps", 9.5, "Mbit/s", "higher"))
    m.series.append(SeriesRecord("throughput_mbps/src", "Mbit/s", np.zeros(2), np.ones(2)))
    m.series.append(SeriesRecord("rtt_ms", "ms", np.zeros(2), np.ones(2)))
    m.undefined.append("flows.jain_fairness")
    out = _named_after(m, "long")
    assert [s.metric for s in out.samples] == ["throughput.rx_mbps@long"] and out.samples[0].value == 9.5
    # the kind before "/" stays (the report draws series by kind), the rest says whose it is
    assert [s.name for s in out.series] == ["throughput_mbps/src@long", "rtt_ms/@long"]
    assert out.undefined == ["flows.jain_fairness@long"]
    assert m.samples[0].metric == "throughput.rx_mbps"  # the workload's own measurement is left as it was


def test_fairness_relative_to_the_max_min_shares():
    shares = {"long": 5.0, "cross1": 5.0, "cross2": 25.0}
    # every flow its share, or the same part of it: fair, though the rates differ fivefold
    assert share_fairness(shares, shares) == pytest.approx(1.0)
    assert share_fairness({f: 0.9 * v for f, v in shares.items()}, shares) == pytest.approx(1.0)
    # one flow everything: 1/n
    assert share_fairness({"long": 0.0, "cross1": 0.0, "cross2": 30.0}, shares) == pytest.approx(1 / 3)
    # the parking lot as TCP shares it (2.2, 7.2, 26.4 of 5, 5, 25)
    x = [2.2 / 5, 7.2 / 5, 26.4 / 25]
    assert share_fairness({"long": 2.2, "cross1": 7.2, "cross2": 26.4}, shares) == \
        pytest.approx(sum(x) ** 2 / (3 * sum(v * v for v in x)))
    assert share_fairness({"long": 2.0}, shares) is None  # one flow: nothing to judge
    assert share_fairness({"long": 2.0, "cross1": 1.0}, {"long": 5.0, "cross1": 0.0}) is None


def test_a_trial_of_streams_between_different_hosts_says_how_fairly_they_shared():
    config = SimpleNamespace(expected={"throughput.rx_mbps@long": 5.0, "throughput.rx_mbps@cross1": 5.0,
                                       "rtt.p50_ms": 3.0})
    m = Measurement()
    m.add("throughput.rx_mbps@long", 2.5)
    m.add("throughput.rx_mbps@cross1", 7.5)
    _share_fairness(config, m)
    # 2.5 and 7.5 of 5 each: parts 0.5 and 1.5, (0.5 + 1.5)^2 / (2 (0.25 + 2.25)) = 0.8
    assert m.value("flows.maxmin_fairness") == pytest.approx(0.8)
    # a dumbbell's single stream: its theory is unqualified, and there is no fairness between workloads
    config = SimpleNamespace(expected={"throughput.rx_mbps": 100.0})
    m = Measurement()
    m.add("throughput.rx_mbps", 95.0)
    _share_fairness(config, m)
    assert not m.has("flows.maxmin_fairness")
