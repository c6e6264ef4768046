"""`vnetbench export`: samples, series points and trials, as CSV and JSON, from a store built through its API."""

from __future__ import annotations

import csv
import io
import json

import numpy as np

from vnetbench.report.export import export
from vnetbench.store.db import SampleRecord, SeriesRecord, Store, TrialRecord


def stored(tmp_path) -> tuple[Store, str]:
    store = Store(tmp_path / "r.db")
    run = "expo00000run"
    store.create_run(run, "x", "x.toml", 'name = "x"\n', "h", [], 1, {"kernel": "6.1"})
    store.add_configuration(run, "k1", {"proto": "tcp", "delay": "10ms"}, {}, {})
    for rep in range(2):
        series = [SeriesRecord("throughput.flow1_mbps", "Mbit/s", np.array([1.0, 2.0, 3.0]),
                               np.array([900.0 + rep, 950.0, float("nan")])),
                  SeriesRecord("rtt.probe_ms", "ms", np.array([0.5]), np.array([10.2]))]
        store.record_trial(run, TrialRecord("k1", rep, rep, 10.0 * rep, 10.0 * rep + 5, "ok", None,
                                            {"cores": {"endpoints": {"r": 1, "s1": 0}}},
                                            [SampleRecord("throughput.rx_mbps", 925.0, "Mbit/s", "higher")], series))
    store.record_trial(run, TrialRecord("k1", 2, 2, 20.0, 21.0, "failed", "iperf3 exited 1", {"stderr": {}}, [],
                                        [SeriesRecord("throughput.flow1_mbps", "Mbit/s", np.array([1.0]),
                                                      np.array([0.0]))]))
    return store, run


def test_series_one_record_per_point_of_ok_trials(tmp_path):
    store, run = stored(tmp_path)
    out = io.StringIO()
    assert export(store, run, "csv", out, what="series") == 8  # 2 ok trials x (3 + 1 points); the failed one not
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    first = rows[0]
    assert (first["series"], first["unit"], first["t"], first["v"], first["repetition"], first["label.delay"]) == \
        ("throughput.flow1_mbps", "Mbit/s", "1.0", "900.0", "0", "10ms")
    assert [r["series"] for r in rows[:4]] == ["throughput.flow1_mbps"] * 3 + ["rtt.probe_ms"]
    out = io.StringIO()
    export(store, run, "json", out, what="series")
    points = json.loads(out.getvalue())  # valid JSON: a NaN point is null
    assert len(points) == 8 and points[2]["v"] is None and points[4]["v"] == 901.0
    assert points[4]["labels"] == {"proto": "tcp", "delay": "10ms"} and points[4]["repetition"] == 1


def test_trials_with_their_raw_records(tmp_path):
    store, run = stored(tmp_path)
    out = io.StringIO()
    assert export(store, run, "json", out, what="trials") == 3
    trials = json.loads(out.getvalue())
    assert [t["status"] for t in trials] == ["ok", "ok", "failed"] and trials[2]["reason"] == "iperf3 exited 1"
    assert trials[0]["raw"]["cores"]["endpoints"] == {"r": 1, "s1": 0}
    out = io.StringIO()
    export(store, run, "csv", out, what="trials")
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert json.loads(rows[1]["raw"])["cores"]["endpoints"]["r"] == 1


def test_samples_as_before(tmp_path):
    store, run = stored(tmp_path)
    out = io.StringIO()
    assert export(store, run, "json", out) == 2
    assert [s["value"] for s in json.loads(out.getvalue())] == [925.0, 925.0]
