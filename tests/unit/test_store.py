import sqlite3

import numpy as np
import pytest

from vnetbench.errors import StoreError
from vnetbench.store.db import SampleRecord, SeriesRecord, Store, TrialRecord


def trial(key, rep, value, status="ok"):
    return TrialRecord(config_key=key, repetition=rep, position=rep, started=1.0, ended=2.0, status=status,
                       reason=None if status == "ok" else "iperf3: boom", raw={"iperf3": {"s1": "{...}" * 100}},
                       samples=[SampleRecord("throughput.rx_mbps", value, "Mbit/s", "higher")],
                       series=[SeriesRecord("rtt_ms", "ms", np.arange(3.0), np.array([1.0, 2.0, 40.0]))])


def make(tmp_path):
    store = Store(tmp_path / "r.db")
    store.create_run("abc123def456", "t", "builtin:t", "name='t'", "h", ["bottleneck=1Mbit"], 1, {"kernel": "x"})
    store.add_configuration("abc123def456", "k1", {"ratio": 0.5}, {"p": 1}, {"udp.loss_ratio": 0.0})
    store.add_configuration("abc123def456", "k2", {"ratio": 2.0}, {"p": 2}, {"udp.loss_ratio": 0.5})
    return store


def test_round_trip(tmp_path):
    store = make(tmp_path)
    rid = store.resolve_run("abc")
    store.record_trial(rid, trial("k1", 0, 10.0))
    tid = store.record_trial(rid, trial("k1", 1, 12.0))
    store.record_trial(rid, trial("k2", 0, 99.0, status="failed"))
    assert store.values(rid) == {"k1": {"throughput.rx_mbps": pytest.approx(np.array([10.0, 12.0]))}}
    assert store.done_slots(rid) == {("k1", 0), ("k1", 1), ("k2", 0)}
    s = store.series(tid)[0]
    assert s.name == "rtt_ms" and list(s.v) == [1.0, 2.0, 40.0]
    raw = store.trials(rid, with_raw=True)
    assert [t["reason"] for t in raw if t["status"] != "ok"] == ["iperf3: boom"] and raw[0]["raw"]["iperf3"]["s1"].startswith("{...}")
    rows = list(store.samples(rid))
    assert {r["labels"]["ratio"] for r in rows} == {0.5} and rows[0]["direction"] == "higher"
    assert store.metric_meta(rid) == {"throughput.rx_mbps": ("Mbit/s", "higher")}
    store.finish_run(rid, "completed")
    assert store.run(rid)["overrides"] == ["bottleneck=1Mbit"] and store.run(rid)["status"] == "completed"
    assert store.runs()[0]["trials_ok"] == 2 and store.runs()[0]["trials_failed"] == 1


def test_trial_is_committed_when_recorded(tmp_path):
    store = make(tmp_path)
    store.record_trial("abc123def456", trial("k1", 0, 10.0))
    # Another connection (a killed process's successor) sees it without any close/commit call.
    other = sqlite3.connect(tmp_path / "r.db")
    assert other.execute("SELECT COUNT(*) FROM samples").fetchone()[0] == 1


def test_resolve_errors(tmp_path):
    store = make(tmp_path)
    store.create_run("abc999", "t", "s", "", "h", [], 1, {})
    with pytest.raises(StoreError, match="matches 2 runs"):
        store.resolve_run("abc")
    with pytest.raises(StoreError, match="no run 'zzz'"):
        store.resolve_run("zzz")
    assert store.resolve_run("last") == "abc999"
    with pytest.raises(StoreError, match="no baseline 'main'"):
        store.baseline("main")
    store.set_baseline("main", "abc999")
    assert store.baseline("main") == "abc999"


def test_not_a_database(tmp_path):
    bad = tmp_path / "notes.txt"
    bad.write_text("hello " * 1000)
    with pytest.raises(StoreError, match="not a vnetbench results database"):
        Store(bad)
    with pytest.raises(StoreError, match="is a directory"):
        Store(tmp_path)
