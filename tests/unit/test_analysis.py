"""Comparisons, baselines and history on synthetic stores built through the Store API (no lab)."""

from __future__ import annotations

import csv
import io
import json
import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from vnetbench import analysis, cli_analysis
from vnetbench.cli import main
from vnetbench.errors import VnetbenchError
from vnetbench.metrics import METRICS
from vnetbench.scenario.plan import config_key
from vnetbench.stats.compare import DEFAULT_ALPHA
from vnetbench.store.db import SampleRecord, Store, TrialRecord

RX, LOSS, P50 = "throughput.rx_mbps", "udp.loss_ratio", "rtt.p50_ms"
UDP = {"ratio": 2.0, "proto": "udp"}
TCP = {"ratio": 2.0, "proto": "tcp"}


def jitter(center: float, n: int, spread: float = 0.005, seed: int = 0) -> list[float]:
    """n values within +-spread (relative) of center, deterministic."""
    return list(center * (1 + spread * np.linspace(-1, 1, n)[np.random.default_rng(seed).permutation(n)]))


def add_run(store: Store, run_id: str, configs: list[tuple[dict, dict[str, list[float]]]], *, scenario="congestion",
            started: float | None = None, params: dict | None = None, status="completed") -> str:
    """A run whose configurations (labels, {metric: per-trial values}) are stored in the order given."""
    store.create_run(run_id, scenario, f"builtin:{scenario}", "name='x'", "h", [], 1, {"kernel": "6.1"})
    position = 0
    for labels, metrics in configs:
        key = config_key(labels)
        store.add_configuration(run_id, key, labels, params or {"bottleneck_bps": 100e6}, {})
        n = max(len(v) for v in metrics.values())
        for rep in range(n):
            samples = [SampleRecord(m, v[rep], METRICS[m].unit, METRICS[m].direction)
                       for m, v in metrics.items() if rep < len(v)]
            store.record_trial(run_id, TrialRecord(key, rep, position, 1.0, 2.0, "ok", None, {}, samples, []))
            position += 1
    store.finish_run(run_id, status)
    if started is not None:
        with store.conn:
            store.conn.execute("UPDATE runs SET started=? WHERE id=?", (started, run_id))
    return run_id


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "r.db")
    yield s
    s.close()


def by_config(report) -> dict[str, dict[str, object]]:
    return {p.config: {r.metric: r for r in p.results} for p in report.pairs}


# ------------------------------------------------------------------ between runs


def test_configurations_are_matched_by_key_not_position(store):
    a = add_run(store, "aaaaaaaaaaaa", [(UDP, {RX: jitter(95, 6)}), (TCP, {RX: jitter(90, 6)})])
    # B lists them the other way round; only UDP lost 20%.
    b = add_run(store, "bbbbbbbbbbbb", [(TCP, {RX: jitter(90, 6, seed=1)}), (UDP, {RX: jitter(76, 6, seed=1)})])
    report = analysis.compare_runs(store, a, b)
    got = by_config(report)
    assert got["ratio=2.0, proto=udp"][RX].verdict == "regressed"
    assert got["ratio=2.0, proto=tcp"][RX].verdict == "unchanged"
    assert got["ratio=2.0, proto=udp"][RX].median_b == pytest.approx(76, rel=0.01)
    assert report.regressed and [r.metric for _, r in report.regressions] == [RX]
    # regressions come first in the listing
    assert report.sorted_rows()[0][1].verdict == "regressed"


def test_configurations_on_one_side_only_are_listed_never_paired(store):
    only_a = {"ratio": 0.6, "proto": "udp"}
    only_b = {"ratio": 4.0, "proto": "udp"}
    a = add_run(store, "aaaaaaaaaaaa", [(only_a, {RX: jitter(60, 5)}), (UDP, {RX: jitter(95, 5)})])
    b = add_run(store, "bbbbbbbbbbbb", [(UDP, {RX: jitter(95, 5)}), (only_b, {RX: jitter(30, 5)})])
    report = analysis.compare_runs(store, a, b)
    assert [p.config for p in report.pairs] == ["ratio=2.0, proto=udp"]
    assert [c["labels"] for c in report.only_a] == [only_a]
    assert [c["labels"] for c in report.only_b] == [only_b]
    data = json.loads(json.dumps(report.to_dict()))
    assert data["only_a"][0]["config"] == "ratio=0.6, proto=udp" and data["only_b"][0]["key"] == config_key(only_b)


def test_lower_is_better_improvement_is_improved_not_a_failure(store):
    a = add_run(store, "aaaaaaaaaaaa", [(UDP, {P50: jitter(40, 6), RX: jitter(95, 6)})])
    b = add_run(store, "bbbbbbbbbbbb", [(UDP, {P50: jitter(30, 6, seed=2), RX: jitter(95, 6, seed=2)})])
    report = analysis.compare_runs(store, a, b)
    r = by_config(report)["ratio=2.0, proto=udp"][P50]
    assert r.direction == "lower" and r.rel_change == pytest.approx(-0.25, abs=0.01)
    assert r.verdict == "improved" and not report.regressed
    assert ET.fromstring(report.junit()).find(".//failure") is None


def test_fewer_than_four_trials_gives_no_verdict_and_says_why(store):
    a = add_run(store, "aaaaaaaaaaaa", [(UDP, {RX: [95.0, 95.1, 95.2]})])
    b = add_run(store, "bbbbbbbbbbbb", [(UDP, {RX: [50.0, 50.1, 50.2]})])
    r = by_config(analysis.compare_runs(store, a, b))["ratio=2.0, proto=udp"][RX]
    assert r.verdict == "inconclusive" and "fewer than 4 trials per side" in r.reason


def test_noise_thresholds_come_from_the_metric_and_can_be_overridden(store):
    p99 = "rtt.p99_ms"
    a = add_run(store, "aaaaaaaaaaaa", [(UDP, {RX: jitter(100, 8), p99: jitter(40, 8)})])
    b = add_run(store, "bbbbbbbbbbbb", [(UDP, {RX: jitter(92, 8, seed=3), p99: jitter(43, 8, seed=3)})])  # -8%, +7.5%
    got = by_config(analysis.compare_runs(store, a, b))["ratio=2.0, proto=udp"]
    assert got[RX].noise_threshold == 0.05 and got[RX].verdict == "regressed"
    assert got[p99].noise_threshold == 0.10 and got[p99].verdict == "unchanged"  # p99 latency: 10% by default
    got = by_config(analysis.compare_runs(store, a, b, noise_default=0.10,
                                          noise_overrides={p99: 0.02}))["ratio=2.0, proto=udp"]
    assert got[RX].verdict == "unchanged" and got[p99].verdict == "regressed"



def test_counts_of_lost_segments_change_only_beyond_half(store):
    """Retransmissions through a tail-drop queue vary by trial from 1 to 32 on identical settings: a CI run's
    identical runs had medians 11.5 and 16 with nearly every trial of one above the other, which a 5 or 10%
    threshold called a regression. A doubling with the same spread is still one."""
    rtx = "tcp.retransmits"
    a = add_run(store, "aaaaaaaaaaaa", [(TCP, {rtx: [7.0, 9.0, 11.0, 12.0, 13.0, 14.0], RX: jitter(90, 6)})])
    b = add_run(store, "bbbbbbbbbbbb", [(TCP, {rtx: [13.0, 14.0, 15.0, 17.0, 19.0, 21.0], RX: jitter(90, 6, seed=1)})])
    c = add_run(store, "cccccccccccc", [(TCP, {rtx: [20.0, 23.0, 24.0, 26.0, 29.0, 33.0], RX: jitter(90, 6, seed=2)})])
    before = by_config(analysis.compare_runs(store, a, b, noise_overrides={rtx: 0.10}))["ratio=2.0, proto=tcp"][rtx]
    assert before.verdict == "regressed"  # what the 10% threshold said
    same = by_config(analysis.compare_runs(store, a, b, noise_default=0.10))["ratio=2.0, proto=tcp"][rtx]
    assert same.noise_threshold == 0.5 and same.verdict == "inconclusive", same.reason
    doubled = by_config(analysis.compare_runs(store, a, c, noise_default=0.10))["ratio=2.0, proto=tcp"][rtx]
    assert doubled.verdict == "regressed" and doubled.rel_change == pytest.approx(25.0 / 11.5 - 1)
    assert {METRICS[m].noise for m in ("tcp.retransmits", "ss.retrans_segments", "bottleneck.drops")} == {0.5}

def test_same_seed_same_intervals(store):
    a = add_run(store, "aaaaaaaaaaaa", [(UDP, {RX: list(np.random.default_rng(1).normal(95, 3, 7))})])
    b = add_run(store, "bbbbbbbbbbbb", [(UDP, {RX: list(np.random.default_rng(2).normal(93, 3, 7))})])
    one = analysis.compare_runs(store, a, b, seed=7).pairs[0].results[0].rel_change_ci
    two = analysis.compare_runs(store, a, b, seed=7).pairs[0].results[0].rel_change_ci
    other = analysis.compare_runs(store, a, b, seed=8).pairs[0].results[0].rel_change_ci
    assert one == two and one != other


def test_default_metrics_and_a_warning_when_holm_cannot_reject(store):
    many = {m: jitter(10.0, 5) for m in METRICS if m.startswith("rtt.")}
    many[RX] = jitter(95, 5)
    a = add_run(store, "aaaaaaaaaaaa", [(UDP, many)])
    b = add_run(store, "bbbbbbbbbbbb", [(UDP, many)])
    default = analysis.compare_runs(store, a, b)
    assert default.metrics == [RX, "rtt.p50_ms", "rtt.p99_ms"] and not default.notes
    everything = analysis.compare_runs(store, a, b, all_metrics=True)
    assert len(everything.metrics) == len(many)
    assert any("no metric can be reported as changed" in n for n in everything.notes)
    with pytest.raises(VnetbenchError, match="not stored"):
        analysis.compare_runs(store, a, b, metrics=["udp.loss_ratio"])


def test_power_note_is_per_metric_not_from_the_first_metric(store):
    # issue 19: 4 vs 4 trials in the first metric, 10 vs 10 in a second that regressed 30%; the note
    # used the first metric's counts for the family and said nothing could change beside "regressed"
    a = add_run(store, "aaaaaaaaaaaa", [(UDP, {P50: [40.0, 40.1, 40.2, 40.3], RX: jitter(95, 10)})])
    b = add_run(store, "bbbbbbbbbbbb", [(UDP, {P50: [40.05, 40.15, 40.25, 40.35], RX: jitter(66.5, 10, seed=1)})])
    report = analysis.compare_runs(store, a, b, metrics=[P50, RX])
    got = by_config(report)["ratio=2.0, proto=udp"]
    assert (got[P50].n_a, got[RX].n_a) == (4, 10) and got[RX].verdict == "regressed"
    assert report.notes == []  # RX can reach p < 0.001, so P50's best (2/70 = 0.029) is compared with alpha itself
    # more 4-vs-4 metrics: those cannot change (at best 4 x 0.029 after Holm), throughput still can
    rtts = [m for m in METRICS if m.startswith("rtt.")][:4]
    a = add_run(store, "cccccccccccc", [(UDP, {**{m: [10.0, 10.1, 10.2, 10.3] for m in rtts}, RX: jitter(95, 10)})])
    b = add_run(store, "dddddddddddd", [(UDP, {**{m: [10.05, 10.15, 10.25, 10.35] for m in rtts},
                                               RX: jitter(66.5, 10, seed=1)})])
    report = analysis.compare_runs(store, a, b, metrics=[*rtts, RX])
    assert by_config(report)["ratio=2.0, proto=udp"][RX].verdict == "regressed"
    (note,) = report.notes
    assert note.startswith(f"{', '.join(rtts)} (1 configuration(s), n=4 vs 4 trials, 5 metrics judged together) "
                           "cannot be reported as changed; the smallest p-value the test can reach is 0.029, "
                           "0.11 after Holm over 5 metrics, not below alpha 0.05")
    assert RX not in note and "no metric" not in note and "\n" not in note


def test_power_note_uses_the_p_value_ties_can_reach(store):
    # issue 19: [100]*4 vs [110]*4 reaches p = 0.013 (tie-corrected), below the untied bound 2/70 the note assumed
    a = add_run(store, "aaaaaaaaaaaa", [(UDP, {P50: [40.0, 40.1, 40.2, 40.3], "rtt.p99_ms": [60.0, 60.1, 60.2, 60.3],
                                               RX: [100.0] * 4})])
    b = add_run(store, "bbbbbbbbbbbb", [(UDP, {P50: [40.05, 40.15, 40.25, 40.35],
                                               "rtt.p99_ms": [60.05, 60.15, 60.25, 60.35], RX: [110.0] * 4})])
    report = analysis.compare_runs(store, a, b, metrics=[P50, RX])
    r = by_config(report)["ratio=2.0, proto=udp"][RX]
    assert r.verdict == "improved" and r.p_value == pytest.approx(0.0131, abs=1e-4)
    assert report.notes == []  # was: "no metric can be reported as changed" (2 x 2/70 = 0.057 >= 0.05)
    # three metrics: the tied one still can change (3 x 0.013 = 0.039), the untied ones cannot (2 x 0.029)
    report = analysis.compare_runs(store, a, b, metrics=[P50, "rtt.p99_ms", RX])
    assert by_config(report)["ratio=2.0, proto=udp"][RX].verdict == "improved"
    assert report.notes == [
        "rtt.p50_ms, rtt.p99_ms (1 configuration(s), n=4 vs 4 trials, 3 metrics judged together) cannot be "
        "reported as changed; the smallest p-value the test can reach is 0.029, 0.057 after Holm over 3 metrics, "
        "not below alpha 0.05; add repetitions or judge fewer metrics (--metric)"]


def test_parameter_and_machine_differences_are_named(store):
    a = add_run(store, "aaaaaaaaaaaa", [(UDP, {RX: jitter(95, 5)})], params={"bottleneck_bps": 100e6})
    b = add_run(store, "bbbbbbbbbbbb", [(UDP, {RX: jitter(76, 5)})], params={"bottleneck_bps": 80e6})
    diffs = analysis.compare_runs(store, a, b).differences
    assert {"what": "parameter", "name": "bottleneck_bps", "a": "100Mbit", "b": "80Mbit"} in diffs


def test_what_runs_on_hosts_ran_on_is_diffed_host_by_host(store):
    a = add_run(store, "aaaaaaaaaaaa", [(UDP, {RX: jitter(95, 5)})])
    b = add_run(store, "bbbbbbbbbbbb", [(UDP, {RX: jitter(76, 5)})])
    host = {"kernel": "6.1", "tool iperf3": "iperf 3.12", "clock": {"offset_ms": 0.1, "uncertainty_ms": 1.0}}
    store.update_fingerprint(a, {"kernel": "6.1", "hosts": {"server-a": host, "client-1": host}})
    store.update_fingerprint(b, {"kernel": "6.1", "hosts": {
        "server-a": {**host, "kernel": "6.12", "clock": {"offset_ms": 9.0, "uncertainty_ms": 2.0}},
        "client-2": host}})
    diffs = {d["name"]: (d["a"], d["b"]) for d in analysis.compare_runs(store, a, b).differences
             if d["what"] == "machine"}
    assert diffs == {"hosts.server-a.kernel": ("6.1", "6.12"),  # the clock offset differs by nature: not named
                     "hosts.client-1": ("a host of this run", "None"), "hosts.client-2": ("None", "a host of this run")}


def test_what_runs_on_a_cluster_ran_on_is_diffed_node_by_node_down_to_its_devices(store):
    a = add_run(store, "aaaaaaaaaaaa", [(UDP, {RX: jitter(95, 5)})])
    b = add_run(store, "bbbbbbbbbbbb", [(UDP, {RX: jitter(76, 5)})])
    node = {"kernel": "6.1", "addresses": {"InternalIP": "198.18.254.1"},
            "encapsulation": "vxlan (flannel.1: MTU 1450)",
            "interfaces": {"flannel.1": {"mtu": 1450, "kind": "vxlan"}, "u0": {"mtu": 1500, "kind": "veth"}}}
    store.update_fingerprint(a, {"kube": {"version": "v1.34.4", "context": "lab", "nodes": {"node1": node}}})
    store.update_fingerprint(b, {"kube": {"version": "v1.34.4", "context": "other-name", "nodes": {"node1": {
        **node, "addresses": {"InternalIP": "10.0.0.1"}, "encapsulation": "none",
        "interfaces": {"u0": {"mtu": 9000, "kind": "veth"}}}}}})
    diffs = {d["name"]: (d["a"], d["b"]) for d in analysis.compare_runs(store, a, b).differences
             if d["what"] == "machine"}
    # the context's name and the node's address are names, not facts of the path: not named
    assert diffs == {"kube.nodes.node1.encapsulation": ("vxlan (flannel.1: MTU 1450)", "none"),
                     "kube.nodes.node1.interfaces.flannel.1.mtu": ("1450", "None"),
                     "kube.nodes.node1.interfaces.flannel.1.kind": ("vxlan", "None"),
                     "kube.nodes.node1.interfaces.u0.mtu": ("1500", "9000")}


# ------------------------------------------------------------------ within one run


def test_within_run_pairs_each_variant_with_the_reference_other_labels_equal(store):
    configs = []
    for nic, rx in (("virtio", 9000.0), ("e1000", 1000.0)):
        configs.append(({"env": "bare", "nic": nic}, {RX: jitter(rx, 6)}))
        configs.append(({"env": "container", "nic": nic}, {RX: jitter(rx * 0.8, 6, seed=4)}))
        configs.append(({"env": "vm", "nic": nic}, {RX: jitter(rx, 6, seed=5)}))
    configs.append(({"env": "vm", "nic": "vhost"}, {RX: jitter(9500, 6)}))  # no bare vhost to compare with
    run = add_run(store, "cccccccccccc", configs)
    report = analysis.compare_within(store, run, "env", "bare")
    got = {(p.pair, p.config): p.results[0].verdict for p in report.pairs}
    assert got == {
        ("env: bare → container", "nic=virtio"): "regressed",
        ("env: bare → vm", "nic=virtio"): "unchanged",
        ("env: bare → container", "nic=e1000"): "regressed",
        ("env: bare → vm", "nic=e1000"): "unchanged",
    }
    assert [c["labels"] for c in report.only_b] == [{"env": "vm", "nic": "vhost"}]
    with pytest.raises(VnetbenchError, match="values of env: bare, container, vm"):
        analysis.compare_within(store, run, "env", "kvm")
    with pytest.raises(VnetbenchError, match="no label 'kernel'; its labels are: env, nic"):
        analysis.compare_within(store, run, "kernel", "6.1")


def test_within_run_numeric_labels_match_typed_values(store):
    run = add_run(store, "cccccccccccc", [({"ratio": 1.0}, {RX: jitter(95, 5)}), ({"ratio": 2.0}, {RX: jitter(95, 5)})])
    report = analysis.compare_within(store, run, "ratio", "1")
    assert [p.pair for p in report.pairs] == ["ratio: 1.0 → 2.0"]


# ------------------------------------------------------------------ JUnit


def test_junit_has_one_case_per_configuration_and_metric_and_fails_regressions(store):
    a = add_run(store, "aaaaaaaaaaaa", [(UDP, {RX: jitter(95, 6), LOSS: jitter(0.5, 6)}),
                                        (TCP, {RX: jitter(90, 6)}), ({"ratio": 9.0, "proto": "udp"}, {RX: [1.0] * 6})])
    b = add_run(store, "bbbbbbbbbbbb", [(UDP, {RX: jitter(76, 6, seed=1), LOSS: jitter(0.5, 6, seed=1)}),
                                        (TCP, {RX: jitter(90, 6, seed=1)})])
    root = ET.fromstring(analysis.compare_runs(store, a, b).junit())
    cases = root.findall("./testsuite/testcase")
    names = [(c.get("classname"), c.get("name")) for c in cases]
    assert ("ratio=2.0, proto=udp", RX) in names and ("ratio=2.0, proto=udp", LOSS) in names
    assert ("ratio=2.0, proto=tcp", RX) in names
    assert ("ratio=9.0, proto=udp", "(configuration)") in names  # listed, not silently dropped
    failed = [(c.get("classname"), c.get("name")) for c in cases if c.find("failure") is not None]
    assert failed == [("ratio=2.0, proto=udp", RX)]
    assert root.get("failures") == "1" and root.get("tests") == str(len(cases))


# ------------------------------------------------------------------ history


def history_store(store: Store, values: list[float], scenario="congestion") -> list[str]:
    ids = []
    for i, v in enumerate(values):
        ids.append(add_run(store, f"run{i:08d}", [(UDP, {RX: jitter(v, 5, seed=i)}), (TCP, {RX: jitter(90, 5)})],
                           scenario=scenario, started=1_700_000_000 + 3600 * i))
    return ids


def test_history_medians_in_time_order_with_a_change_point(store):
    ids = history_store(store, [95.0] * 8 + [76.0] * 8)
    hist = analysis.history(store, RX, where={"proto": "udp"})
    (line,) = hist.lines
    assert [p["run_id"] for p in line.points] == ids
    assert [round(p["median"]) for p in line.points] == [95] * 8 + [76] * 8
    (cp,) = line.change_points
    assert cp["index"] == 8 and cp["run_id"] == ids[8] and cp["rel_change"] == pytest.approx(-0.2, abs=0.01)
    assert hist.min_magnitude == 0.05 and hist.window == 50 and hist.pvalue == 0.001


def test_history_without_a_filter_has_one_line_per_configuration(store):
    history_store(store, [95.0] * 8)
    hist = analysis.history(store, RX)
    assert sorted(l.config for l in hist.lines) == ["ratio=2.0, proto=tcp", "ratio=2.0, proto=udp"]
    assert all(not l.change_points for l in hist.lines)


def test_history_csv_is_time_and_one_numeric_column_per_series(store):
    history_store(store, [95.0, 96.0, 76.0])
    one = list(csv.reader(io.StringIO(analysis.history(store, RX, where={"proto": "udp"}).csv_text())))
    assert one[0] == ["time", RX]
    assert one[1][0] == "2023-11-14T22:13:20+00:00"
    assert [round(float(r[1])) for r in one[1:]] == [95, 96, 76] and all(len(r) == 2 for r in one)
    both = list(csv.reader(io.StringIO(analysis.history(store, RX).csv_text())))
    assert both[0] == ["time", f"{RX}[ratio=2.0;proto=udp]", f"{RX}[ratio=2.0;proto=tcp]"]
    assert len(both) == 4


def test_history_filters_by_scenario_and_explains_bad_filters(store):
    history_store(store, [95.0] * 3)
    add_run(store, "otherscen001", [({"x": 1}, {RX: [1.0, 2.0]})], scenario="quick", started=1_800_000_000)
    hist = analysis.history(store, RX, scenario="congestion", where={"proto": "udp", "ratio": "2"})
    assert len(hist.lines) == 1 and len(hist.lines[0].points) == 3
    assert any("at least 6 runs" in n for n in hist.notes)
    latest = analysis.history(store, RX)  # default: the latest run's scenario, said so
    assert latest.scenario == "quick" and "others stored: congestion" in latest.notes[0]
    with pytest.raises(VnetbenchError, match="no label 'env'"):
        analysis.history(store, RX, scenario="congestion", where={"env": "bare"})
    with pytest.raises(VnetbenchError, match="proto: tcp, udp"):
        analysis.history(store, RX, scenario="congestion", where={"proto": "sctp"})
    with pytest.raises(VnetbenchError, match="not stored in any run"):
        analysis.history(store, "tcp.retransmits", scenario="congestion")
    with pytest.raises(VnetbenchError, match="scenarios stored: congestion, quick"):
        analysis.history(store, RX, scenario="nope")


# ------------------------------------------------------------------ parsers and CLI


def test_fraction_and_noise_parsing():
    assert analysis.parse_fraction("5%", "x") == pytest.approx(0.05)
    assert analysis.parse_fraction("0.1", "x") == pytest.approx(0.1)
    assert analysis.parse_noise_overrides(["rtt.p99_ms=10%"]) == {"rtt.p99_ms": pytest.approx(0.1)}
    with pytest.raises(VnetbenchError, match="METRIC=FRACTION"):
        analysis.parse_noise_overrides(["rtt.p99_ms"])
    with pytest.raises(VnetbenchError, match="not a fraction"):
        analysis.parse_fraction("lots", "--noise-default")


def test_cli_literals_agree_with_the_library():
    assert cli_analysis.DEFAULT_METRICS_HELP == analysis.DEFAULT_METRICS
    assert cli_analysis.DEFAULT_ALPHA == DEFAULT_ALPHA


@pytest.fixture
def db_with_runs(tmp_path):
    db = tmp_path / "cli.db"
    with Store(db) as s:
        add_run(s, "aaaaaaaaaaaa", [(UDP, {RX: jitter(95, 6)}), (TCP, {RX: jitter(90, 6)})], started=1_700_000_000)
        add_run(s, "bbbbbbbbbbbb", [(UDP, {RX: jitter(76, 6, seed=1)}), (TCP, {RX: jitter(90, 6, seed=1)})],
                started=1_700_003_600)
        add_run(s, "cccccccccccc", [(UDP, {RX: jitter(95, 6, seed=2)}), (TCP, {RX: jitter(90, 6, seed=2)})],
                started=1_700_007_200)
    return str(db)


def test_cli_fail_on_regression_exit_codes(db_with_runs, capsys):
    assert main(["compare", "aaaa", "bbbb", "--db", db_with_runs, "--fail-on", "regression"]) == 1
    out = capsys.readouterr().out
    assert "regressed" in out and RX in out and "FAIL" in out
    assert main(["compare", "aaaa", "cccc", "--db", db_with_runs, "--fail-on", "regression"]) == 0
    assert "PASS" in capsys.readouterr().out
    assert main(["compare", "aaaa", "bbbb", "--db", db_with_runs]) == 0  # no gate asked for


def test_cli_usage_errors_exit_2(db_with_runs, capsys):
    for argv in (["compare", "aaaa"], ["compare", "aaaa", "bbbb", "--by", "proto"], ["compare", "aaaa", "--ref", "x"],
                 ["compare", "zzzz", "bbbb"], ["compare", "aaaa", "--by", "proto"],
                 ["compare", "aaaa", "--baseline"], ["history", "--metric", "nope.metric"]):
        assert main([*argv, "--db", db_with_runs]) == 2, argv
    err = " ".join(capsys.readouterr().err.split())  # the error console wraps at 80 columns
    assert "one of tcp, udp" in err and "no baseline for scenario 'congestion'" in err
    with pytest.raises(SystemExit) as e:
        main(["compare", "aaaa", "bbbb", "--db", db_with_runs, "--fail-on", "everything"])
    assert e.value.code == 2


def test_cli_json_and_junit(db_with_runs, tmp_path, capsys):
    junit = tmp_path / "out" / "junit.xml"
    code = main(["compare", "aaaa", "bbbb", "--db", db_with_runs, "--json", "--junit", str(junit),
                 "--fail-on", "regression"])
    assert code == 1
    data = json.loads(capsys.readouterr().out)
    assert data["regressed"] is True and data["counts"]["regressed"] == 1
    assert data["configurations"][0]["results"][0]["unit"] == "Mbit/s"
    root = ET.parse(junit).getroot()
    assert root.get("failures") == "1"


def test_cli_baseline_set_list_and_compare(db_with_runs, capsys):
    assert main(["baseline", "set", "aaaa", "--db", db_with_runs]) == 0
    assert "baseline congestion = run aaaaaaaaaaaa" in capsys.readouterr().out
    assert main(["baseline", "set", "cccc", "--name", "nightly", "--db", db_with_runs]) == 0
    assert main(["baseline", "list", "--db", db_with_runs, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out.split("\n", 1)[1])  # after the `set` line
    assert {(b["name"], b["run_id"]) for b in listed} == {("congestion", "aaaaaaaaaaaa"), ("nightly", "cccccccccccc")}
    assert main(["compare", "bbbb", "--baseline", "--db", db_with_runs, "--fail-on", "regression"]) == 1
    assert "baseline 'congestion' (run aaaaaaaaaaaa)" in capsys.readouterr().out
    assert main(["compare", "cccc", "--baseline", "nightly", "--db", db_with_runs, "--fail-on", "regression"]) == 0


def test_cli_history_table_and_csv(db_with_runs, tmp_path, capsys):
    path = tmp_path / "h.csv"
    assert main(["history", "--metric", RX, "--where", "proto=udp", "--csv", str(path), "--db", db_with_runs]) == 0
    out = capsys.readouterr().out
    assert "aaaaaaaaaaaa" in out and "bbbbbbbbbbbb" in out and "ratio=2.0, proto=udp" in out
    rows = list(csv.reader(path.open()))
    assert rows[0] == ["time", RX] and len(rows) == 4
    assert main(["history", "--metric", RX, "--where", "proto=udp", "--csv", "-", "--db", db_with_runs]) == 0
    assert capsys.readouterr().out.startswith("time,throughput.rx_mbps\n")


def test_cli_nothing_in_common_is_a_usage_error(tmp_path, capsys):
    db = str(tmp_path / "x.db")
    with Store(db) as s:
        add_run(s, "aaaaaaaaaaaa", [(UDP, {RX: jitter(95, 5)})])
        add_run(s, "dddddddddddd", [({"ratio": 0.6, "proto": "udp"}, {RX: jitter(60, 5)})])
    assert main(["compare", "aaaa", "dddd", "--db", db, "--fail-on", "regression"]) == 2
    captured = capsys.readouterr()
    assert "only in A" in captured.out and "only in B" in captured.out
    assert "no configuration was compared" in " ".join(captured.err.split())


def test_terminal_views_read_well(db_with_runs, capsys):
    from rich.console import Console

    from vnetbench.report.terminal import comparison_view, history_view, show

    console = Console(width=200, record=True, highlight=False)
    with Store(db_with_runs) as s:
        comparison_view(analysis.compare_runs(s, "aaaaaaaaaaaa", "bbbbbbbbbbbb"), console)
        text = console.export_text()
        lines = [l for l in text.splitlines() if "ratio=2.0" in l and RX in l]
        assert "regressed" in lines[0] and "unchanged" in lines[1]  # regressions first
        assert "1 regressed, 0 improved, 0 inconclusive, 1 unchanged" in text
        console = Console(width=200, record=True, highlight=False)
        history_view(analysis.history(s, RX), console)
        text = console.export_text()
        assert text.count("0 change points in 3 runs") == 2 and "at least 6 runs" in text
        console = Console(width=200, record=True, highlight=False)
        show(s, "aaaaaaaaaaaa", console, metrics=[RX], detail=True)
        text = console.export_text()
        assert re.search(r"\[94\.5\d, 95\.4\d\]", text)  # at n = 6 the exact CI exists: [min, max]
        assert "cv " in text and "n too small" not in text
        console = Console(width=200, record=True, highlight=False)
        show(s, "aaaaaaaaaaaa", console, metrics=[RX])  # by default benchstat's form: [94.53, 95.47] is ±0%
        text = console.export_text()
        assert re.search(r"^2\.0\s+udp\s+6\s+95\.00 ±0%$", text, re.M) and "?" not in text


def test_show_says_n_too_small_and_marks_unstable(tmp_path):
    from rich.console import Console

    from vnetbench.report.terminal import show

    with Store(tmp_path / "s.db") as s:
        add_run(s, "eeeeeeeeeeee", [(UDP, {RX: [50.0, 95.0, 60.0, 90.0, 300.0]})])
        console = Console(width=200, record=True, highlight=False)
        show(s, "eeeeeeeeeeee", console, metrics=[RX], detail=True)
        text = console.export_text()
        assert "n too small" in text and "unstable" in text and "1 outlier" in text
        console = Console(width=200, record=True, highlight=False)
        show(s, "eeeeeeeeeeee", console, metrics=[RX])  # the same as marks, explained once
        text = console.export_text()
    assert "90.00 ±? !*" in text and "n too small" not in text
    assert "? no CI: fewer than 6 trials" in text and "! unstable: CV >= 10%" in text and "* outliers" in text


def test_show_gives_mean_sd_percentiles_and_per_metric_n(tmp_path, capsys):
    from rich.console import Console

    from vnetbench.report.terminal import show

    lost = "udp.loss_ratio"
    with Store(tmp_path / "s.db") as s:
        # One trial reported no loss ratio: that metric's n (4) differs from the configuration's (5).
        add_run(s, "ffffffffffff", [(UDP, {RX: [90.0, 92.0, 94.0, 96.0, 98.0], lost: [0.5, 0.52, 0.54, 0.56]}),
                                    (TCP, {RX: [float(v) for v in range(80, 100, 2)]})])
        console = Console(width=220, record=True, highlight=False)
        show(s, "ffffffffffff", console, metrics=[RX, lost], detail=True)
    text = console.export_text()
    assert "94.00 ± 3.16" in text and "90.00..98.00" in text
    assert "p5-95 80.90..97.10" in text and text.count("p5-95 8") + text.count("p5-95 9") == 1  # from 10 trials
    assert "n 4" in text and "n 5" not in text
    capsys.readouterr()
    assert main(["show", "ffff", "--json", "--metric", RX, "--db", str(tmp_path / "s.db")]) == 0
    doc = json.loads(capsys.readouterr().out)
    (row,) = [r for r in doc["summaries"] if r["labels"] == UDP]
    assert row["metric"] == RX and row["n"] == 5 and row["unit"] == "Mbit/s" and row["direction"] == "higher"
    assert row["mean"] == pytest.approx(94.0) and row["std"] == pytest.approx(3.1623, abs=1e-4)
    assert row["p5"] == pytest.approx(90.4) and row["p95"] == pytest.approx(97.6) and row["ci"] is None


def test_a_change_found_on_trials_the_machine_disturbed_says_so(store, tmp_path):
    """Trials with steal or other processes above metrics.NOISE_MARKS are marked, not dropped: the verdict stands,
    compare says it rests on them, show lists them."""
    quiet = [1.0] * 6
    busy = [1.0, 1.0, 98.0, 1.0, 1.0, 1.0]  # a busy loop held a core during the third trial of B
    a = add_run(store, "aaaaaaaaaaaa", [(UDP, {RX: jitter(95, 6), "cpu.foreign_pct": quiet}),
                                        (TCP, {RX: jitter(90, 6), "cpu.foreign_pct": quiet})])
    b = add_run(store, "bbbbbbbbbbbb", [(UDP, {RX: jitter(76, 6, seed=1), "cpu.foreign_pct": busy,
                                               "cpu.steal_pct": [0, 0, 0, 0, 7.5, 0]}),
                                        (TCP, {RX: jitter(90, 6, seed=1), "cpu.foreign_pct": busy})])
    assert store.marked_trials(a) == {}
    assert store.marked_trials(b) == {config_key(UDP): [(2, ["other processes 98 % of a core"]),
                                                        (4, ["steal 8 % of a core"])],
                                      config_key(TCP): [(2, ["other processes 98 % of a core"])]}
    report = analysis.compare_runs(store, a, b)
    got = {p.config: p for p in report.pairs}
    assert got["ratio=2.0, proto=udp"].marked == (0, 2) and got["ratio=2.0, proto=tcp"].marked == (0, 1)
    assert by_config(report)["ratio=2.0, proto=udp"][RX].verdict == "regressed"  # kept in the statistics
    notes = [n for n in report.notes if "busy with other work" in n]
    assert len(notes) == 1 and notes[0].startswith("ratio=2.0, proto=udp: throughput.rx_mbps changed, and 0 trial(s)"
                                                   " of A and 2 of B")  # tcp did not change: nothing to say
    assert report.to_dict()["configurations"][0]["marked_trials"] == {"a": 0, "b": 2}
    from rich.console import Console

    from vnetbench.report.terminal import show
    out = io.StringIO()
    show(store, b, Console(file=out, width=200))
    text = out.getvalue()
    assert "marked: 3 of 12 ok trials ran while the machine was busy with other work" in text, text
    assert f"{config_key(UDP)} #2: other processes 98 % of a core" in text
