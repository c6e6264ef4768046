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


# ---------------------------------------------------------------- what the store meets in the field

import contextlib
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from vnetbench.store import db as store_db

FIXTURES = Path(__file__).parent.parent / "fixtures"
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small or read-only file system: run as root")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_database_of_another_program_is_refused_and_left_alone(tmp_path):
    other = tmp_path / "app.db"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE users (id INTEGER, name TEXT)")
    conn.commit()
    conn.close()
    before = digest(other)
    with pytest.raises(StoreError, match=r"another program \(tables: users\)"):
        Store(other)
    assert digest(other) == before


def test_database_of_a_newer_vnetbench_is_refused_with_its_version(tmp_path):
    make(tmp_path).close()
    conn = sqlite3.connect(tmp_path / "r.db")
    conn.execute("UPDATE meta SET value='7' WHERE key='schema_version'")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match=rf"newer vnetbench \(database schema 7; .* reads schema "
                                         rf"{store_db.SCHEMA_VERSION} and older\): upgrade"):
        Store(tmp_path / "r.db")


def test_database_of_the_first_release_is_upgraded_after_a_backup(tmp_path):
    """v1.db was written by vnetbench at schema 1 (commit e83590b, before runs knew their process): a real
    `vnetbench run quick --set duration=1s --set workload.stream.omit=0s --set repetitions=2
    --set repeat.warmup=false`, then checkpointed into one file."""
    path = tmp_path / "v1.db"
    shutil.copy(FIXTURES / "store" / "v1.db", path)
    old = sqlite3.connect(path)
    old.row_factory = sqlite3.Row
    runs_before = [dict(r) for r in old.execute("SELECT * FROM runs")]
    samples_before = old.execute("SELECT COUNT(*) FROM samples").fetchone()[0]
    old.close()
    assert runs_before and samples_before

    store = Store(path)
    assert store.conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == \
        str(store_db.SCHEMA_VERSION)
    backup = tmp_path / "v1.db.schema1.bak"
    assert backup.exists()
    assert sqlite3.connect(backup).execute("SELECT value FROM meta").fetchone()[0] == "1"
    run = store.run(runs_before[0]["id"])
    assert run["status"] == runs_before[0]["status"] and run["pid"] is None
    assert run["scenario_text"] == runs_before[0]["scenario_text"]
    values = store.values(run["id"])
    assert sum(len(v) for per in values.values() for v in per.values()) == samples_before
    # what the new schema adds works on the upgraded file
    store.create_run("new000000001", "t", "s", "", "h", [], 1, {})
    assert store.run("new000000001")["pid"] == os.getpid()
    store.close()
    assert Store(path).run("new000000001")["boot_id"]  # opened again: no second migration, nothing lost


def test_a_file_that_lost_its_version_row_reads_as_the_schema_its_columns_show(tmp_path):
    """A run killed between creating the tables and writing the version row (before both went into one
    transaction) left such a file; read as schema 1, its upgrade failed on "duplicate column name: pid"."""
    make(tmp_path).close()
    conn = sqlite3.connect(tmp_path / "r.db")
    conn.execute("DELETE FROM meta WHERE key='schema_version'")
    conn.commit()
    conn.close()
    store = Store(tmp_path / "r.db")
    assert store.conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == \
        str(store_db.SCHEMA_VERSION)
    assert not list(tmp_path.glob("*.bak"))  # nothing to upgrade
    store.create_run("new000000001", "t", "s", "", "h", [], 1, {})
    assert store.run("new000000001")["pid"] == os.getpid()


def test_every_schema_names_a_column_that_shows_it():
    assert max(store_db.SCHEMA_MARKS) == store_db.SCHEMA_VERSION
    conn = sqlite3.connect(":memory:")
    conn.executescript(store_db.SCHEMA)
    for table, column in store_db.SCHEMA_MARKS.values():
        assert column in {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}


def test_a_failed_upgrade_leaves_the_file_unchanged(tmp_path, monkeypatch):
    path = tmp_path / "v1.db"
    shutil.copy(FIXTURES / "store" / "v1.db", path)
    monkeypatch.setitem(store_db.MIGRATIONS, 2, [*store_db.MIGRATIONS[2], "ALTER TABLE no_such ADD COLUMN x"])
    with pytest.raises(StoreError, match="upgrading from schema 1 to 2 failed .* the file is unchanged"):
        Store(path)
    assert sqlite3.connect(path).execute("SELECT value FROM meta").fetchone()[0] == "1"
    assert "pid" not in {r[1] for r in sqlite3.connect(path).execute("PRAGMA table_info(runs)")}
    # (not compared byte for byte: opening it may touch SQLite's own header; its schema and rows must not change)


def test_a_run_whose_process_is_gone_reads_as_interrupted_with_the_resume_command(tmp_path):
    store = make(tmp_path)
    store.record_trial("abc123def456", trial("k1", 0, 10.0))
    run = store.run("abc123def456")  # running, but no process of this run holds its lock
    assert run["stored_status"] == "running" and run["status"] == "interrupted"
    assert "1 trials are stored" in run["status_reason"]
    assert f"vnetbench run --resume abc123def456 --db {store.path}" in run["status_reason"]
    assert store.runs()[0]["status"] == "interrupted"
    store.finish_run("abc123def456", "completed")
    assert store.run("abc123def456")["status"] == "completed"


@contextlib.contextmanager
def mounted(path: Path, *options: str):
    path.mkdir(exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(options), "vnb-test", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@root_only
def test_full_disk_gives_a_clear_error_and_loses_no_committed_trial(tmp_path):
    with mounted(tmp_path / "small", "size=512k") as fs:
        store = make(fs)
        recorded = 0
        big = {"iperf3": {"s1": os.urandom(64 * 1024).hex()}}  # incompressible: fills the disk in a few trials
        with pytest.raises(StoreError, match=r"r\.db: cannot store a trial: the disk is full\. What was stored "):
            for rep in range(100):
                t = trial("k1", rep, float(rep))
                t.raw = big
                store.record_trial("abc123def456", t)
                recorded += 1
        assert recorded >= 1
        assert store.done_slots("abc123def456") == {("k1", r) for r in range(recorded)}
        assert list(store.values("abc123def456")["k1"]["throughput.rx_mbps"]) == [float(r) for r in range(recorded)]
        store.close()


@root_only
def test_read_only_database_can_be_read_and_refuses_writes_clearly(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    store = make(ro)
    store.record_trial("abc123def456", trial("k1", 0, 10.0))
    store.finish_run("abc123def456", "completed")
    store.close()
    subprocess.run(["mount", "--bind", str(ro), str(ro)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(ro)], check=True)
        store = Store(ro / "r.db")
        assert store.run("abc123def456")["status"] == "completed"
        assert store.values("abc123def456")["k1"]["throughput.rx_mbps"][0] == 10.0
        with pytest.raises(StoreError, match="cannot store the baseline: the file .* is read-only"):
            store.set_baseline("main", "abc123def456")
        store.close()
    finally:
        subprocess.run(["umount", "-l", str(ro)], check=False)
