"""The machine-wide run lock and the load monitor: real flocks, real processes, a private lock directory."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest

from vnetbench import runlock
from vnetbench.errors import EnvironmentProblem
from vnetbench.runlock import RunLock
from vnetbench.runner.machine_load import LoadMonitor, machine_note


def holder(lock_dir, run_id: str) -> subprocess.Popen:
    """Another process holding a run's lock, as a second vnetbench would; it prints once it holds it."""
    code = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from vnetbench.runlock import RunLock
        RunLock({run_id!r}, scenario="other", db="/tmp/other.db", lock_dir=Path({str(lock_dir)!r})).acquire()
        print("held", flush=True)
        time.sleep(60)
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_second_run_is_refused_naming_the_first(tmp_path):
    other = holder(tmp_path, "aaaa11112222")
    try:
        with pytest.raises(EnvironmentProblem, match=rf"run aaaa11112222 .*pid {other.pid}.*--allow-concurrent"):
            RunLock("bbbb11112222", scenario="mine", db="x.db", lock_dir=tmp_path).acquire()
        assert not (tmp_path / "run-bbbb11112222.lock").exists()  # refused: it claimed nothing
        lock = RunLock("bbbb11112222", scenario="mine", db="x.db", lock_dir=tmp_path).acquire(allow_concurrent=True)
        assert [o.run_id for o in lock.others] == ["aaaa11112222"] and lock.others[0].pid == other.pid
        assert {r.run_id for r in runlock.live_runs(tmp_path)} == {"aaaa11112222", "bbbb11112222"}
        lock.release()
        assert not runlock.is_live("bbbb11112222", tmp_path)
    finally:
        other.kill()
        other.wait()


def test_a_killed_run_is_interrupted_and_its_lock_is_gone(tmp_path):
    other = holder(tmp_path, "cccc11112222")
    assert runlock.effective_status("running", "cccc11112222", runlock.boot_id(), tmp_path) == "running"
    other.send_signal(signal.SIGKILL)
    other.wait()
    # the kernel dropped the lock with the process; the file stays until the next run tidies it
    assert runlock.effective_status("running", "cccc11112222", runlock.boot_id(), tmp_path) == "interrupted"
    assert runlock.effective_status("completed", "cccc11112222", runlock.boot_id(), tmp_path) == "completed"
    RunLock("dddd11112222", scenario="mine", db="x.db", lock_dir=tmp_path).acquire().release()
    assert not (tmp_path / "run-cccc11112222.lock").exists()


def test_a_run_of_another_boot_is_interrupted_even_if_a_lock_is_held(tmp_path):
    lock = RunLock("eeee11112222", scenario="s", db="x.db", lock_dir=tmp_path).acquire()
    try:
        assert runlock.effective_status("running", "eeee11112222", "another-boot", tmp_path) == "interrupted"
        # the same run cannot be taken twice (a resume of a run that is still going)
        with pytest.raises(EnvironmentProblem, match="already running"):
            RunLock("eeee11112222", scenario="s", db="x.db", lock_dir=tmp_path).acquire()
    finally:
        lock.release()


def test_a_planted_symlink_is_not_followed(tmp_path):
    target = tmp_path / "victim"
    target.write_text("precious")
    (tmp_path / "run-ffff11112222.lock").symlink_to(target)
    with pytest.raises(EnvironmentProblem, match="cannot take the run lock"):
        RunLock("ffff11112222", scenario="s", db="x.db", lock_dir=tmp_path).acquire()
    assert target.read_text() == "precious"


BUSY_S = 4
BUSY = f"exec {sys.executable} -c 'import time\nend = time.time() + {BUSY_S}\nwhile time.time() < end: pass'"


def test_load_monitor_counts_others_and_not_the_runs_own(tmp_path):
    monitor = LoadMonitor(netns_prefix="vnb-test-none", run_id="gggg11112222", interval_s=0.5).start()
    own = subprocess.Popen(["sh", "-c", BUSY])  # the run's own tool: a descendant, not counted
    # someone else's: started through a shell that exits at once, so it is re-parented away from us
    subprocess.run(["sh", "-c", f"setsid sh -c \"{BUSY}\" >/dev/null 2>&1 &"], check=True)
    own.wait()
    time.sleep(0.6)
    summary = monitor.stop()
    assert summary["other_processes_cores"] >= 0.3, summary  # a whole core for 4 of ~4.6 s, minus a busy neighbour
    # the other busy loop is a python (one of several, on a machine busy with other runs' tools)
    assert max(p["cores"] for p in summary["busy_processes"] if p["command"].startswith("python")) >= 0.3, summary
    assert all(p["pid"] != own.pid for p in summary["busy_processes"]), summary
    assert len(summary["load_at_start"]) == 3 and summary["monitored_s"] >= 4
    note = machine_note({"machine_load": [summary]})
    assert note and "other processes used" in note and "python" in note


def test_machine_note_is_quiet_for_a_quiet_machine_and_names_concurrent_runs():
    quiet = {"other_processes_cores": 0.02, "busy_processes": [], "concurrent_runs": []}
    assert machine_note({"machine_load": [quiet]}) is None
    assert machine_note({}) is None
    shared = {**quiet, "concurrent_runs": [{"run_id": "abc", "pid": 7, "scenario": "s"}]}
    note = machine_note({"machine_load": [quiet, shared], "allow_concurrent": True})
    assert "--allow-concurrent" in note and "abc pid 7" in note
