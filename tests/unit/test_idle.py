"""The lab's hold on the CPUs' wake-up latency (lab/idle.py): 0 while held, the kernel's own after; where the
kernel has no cpuidle driver to honour that, the cores halt unless the scenario asks them to poll
(lab.idle_cores = "poll": vnb-link idle-poll, whose time is idle)."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import time

import pytest

from vnetbench.impair.backend import find_binary
from vnetbench.lab import cgroups, idle
from vnetbench.lab.clean import cgroup_leftovers, clean
from vnetbench.lab.idle import PM_QOS, WakeLatency

# Each test's own run prefix (the pollers' cgroup is named after it): a run's or another test worker's never met
PREFIX = f"vnb-i{os.getpid()}"
pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists(PM_QOS), reason=f"needs root and {PM_QOS}")
needs_vnb_link = pytest.mark.skipif(find_binary() is None, reason="vnb-link is not built (make setup)")


def _target() -> int:
    with open(PM_QOS, "rb") as f:
        return struct.unpack("i", f.read(4))[0]


@pytest.fixture
def driver(monkeypatch, tmp_path):
    """The kernel's cpuidle driver, as the hold reads it: set(name) writes what current_driver says."""
    path = tmp_path / "current_driver"
    monkeypatch.setattr("vnetbench.lab.idle.CPUIDLE_DRIVER", path)
    return lambda name: path.write_text(f"{name}\n")


def _pollers(parent: int | None = None) -> list[int]:
    """Pids of the vnb-link idle-poll processes that `parent` (this process) started: a lab up meanwhile on
    this machine has its own."""
    out = subprocess.run(["pgrep", "-P", str(parent or os.getpid()), "-f", "vnb-link idle-poll"],
                         capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def test_with_a_cpuidle_driver_the_hold_asks_it_for_0_us_and_goes_with_its_release(driver):
    driver("haltpoll")
    before = _target()
    wake = WakeLatency(PREFIX)
    assert wake.hold().startswith("held at 0 us") and "cpuidle driver haltpoll" in wake.state and _target() == 0
    assert wake.hold() == wake.state  # held once
    assert not wake.polling and not _pollers() and wake.polled_ns() == {}
    wake.release()
    assert _target() == before and wake.fd is None


def test_where_it_cannot_be_held_the_record_says_why(monkeypatch, driver):
    driver("haltpoll")
    monkeypatch.setattr("vnetbench.lab.idle.PM_QOS", "/nonexistent/cpu_dma_latency")
    wake = WakeLatency(PREFIX)
    assert wake.hold() == "not held: /nonexistent/cpu_dma_latency: No such file or directory"
    wake.release()


def test_without_a_driver_idle_cores_halt_unless_asked_to_poll_and_the_record_says_so(driver):
    driver("none")
    wake = WakeLatency(PREFIX)
    assert wake.hold().startswith("not held: the kernel has no cpuidle driver") and 'idle_cores = "poll"' in wake.state
    assert not wake.polling and not _pollers() and wake.polled_ns() == {}
    wake.release()


@needs_vnb_link
def test_without_a_driver_and_asked_to_poll_every_core_polls_under_sched_idle_and_its_time_is_counted(driver):
    driver("none")
    first, second = WakeLatency(PREFIX, poll=True), WakeLatency(PREFIX, poll=True)
    assert first.hold().startswith("held by polling") and "no cpuidle driver" in first.state
    assert second.hold().startswith("held by polling")
    try:
        (pid,) = _pollers()  # two labs of one run share one set of pollers
        cores = sorted(os.sched_getaffinity(0))
        threads = {}
        for tid in os.listdir(f"/proc/{pid}/task"):
            name = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
            if name.startswith("vnb-idle/"):
                threads[int(name.removeprefix("vnb-idle/"))] = int(tid)
        assert sorted(threads) == cores
        for core, tid in threads.items():
            assert os.sched_getscheduler(tid) == os.SCHED_IDLE and os.sched_getaffinity(tid) == {core}
            assert os.getpriority(os.PRIO_PROCESS, tid) == 19  # its time is /proc/stat's nice
        # ... in a cgroup that is idle as a whole (a group competes with its own weight, not its tasks')
        group = cgroups.dirs_of(pid).get("cpu")
        assert group is not None and group.name == f"{PREFIX}-idle" and (group / "cpu.idle").read_text() == "1\n"
        start = first.polled_ns()
        assert sorted(start) == [f"cpu{c}" for c in cores]
        # The pollers run whenever a core has nothing else to do (and a SCHED_IDLE thread gets a sliver of a
        # busy core too): their count grows, core by core, never back.
        deadline = time.monotonic() + 5.0
        while (end := first.polled_ns()) == start and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(end[c] >= start[c] for c in start) and sum(end.values()) > sum(start.values())
        first.release()
        assert _pollers() == [pid] and first.polled_ns() == {} and second.polled_ns()
    finally:
        first.release()
        second.release()
    assert not _pollers() and not group.exists() and not cgroup_leftovers(PREFIX)


@needs_vnb_link
def test_the_pollers_end_by_themselves_when_the_run_is_killed():
    code = ("import sys, time; from pathlib import Path; from vnetbench.lab import idle; "
            f"idle.CPUIDLE_DRIVER = Path('/nonexistent'); w = idle.WakeLatency('{PREFIX}k', poll=True); "
            "print(w.hold(), flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    poller = None
    try:
        try:
            assert proc.stdout.readline().startswith("held by polling")
            (poller,) = _pollers(proc.pid)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            proc.stdout.close()
        # They look for their parent every 0.1 s when they get to run: at once on an idle core, and on cores
        # that other work keeps busy whenever the idle group's sliver of them comes round (beside three busy
        # loops on two cores this whole test took 5 to 8 s; one that never looks never ends)
        deadline = time.monotonic() + 20.0
        while _runs(poller) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _runs(poller), "idle pollers outlived the process that started them"
        # what a killed run leaves, `vnetbench clean` removes: the pollers' cgroup
        assert cgroup_leftovers(f"{PREFIX}k")
    finally:  # whatever failed, nothing of this test's is left for the lab tests' leftover checks
        if poller is not None and _runs(poller):
            os.kill(poller, signal.SIGKILL)
        clean(f"{PREFIX}k")
    assert not cgroup_leftovers(f"{PREFIX}k")


def _runs(pid: int) -> bool:
    """Whether `pid` runs: not gone, and not a zombie that its new parent (init) has yet to reap."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_without_a_driver_and_without_vnb_link_the_record_says_so(monkeypatch, driver):
    driver("none")
    monkeypatch.setattr("vnetbench.impair.backend.find_binary", lambda: None)
    wake = WakeLatency(PREFIX, poll=True)
    assert wake.hold().startswith("not held: the kernel has no cpuidle driver") and "make setup" in wake.state
    wake.release()
    assert not idle._POLLERS.proc


def test_doctor_says_how_a_lab_keeps_idle_cores_awake(monkeypatch, driver):
    driver("haltpoll")
    assert idle.how_held() == (True, f"cpuidle driver haltpoll: a lab asks it for 0 us of wake-up latency ({PM_QOS})",
                               "")
    driver("none")
    monkeypatch.setattr("vnetbench.impair.backend.find_binary", lambda: "/usr/bin/vnb-link")
    ok, detail, _ = idle.how_held()
    assert ok and "idle cores halt" in detail and 'idle_cores = "poll"' in detail and "vnb-link idle-poll" in detail
    monkeypatch.setattr("vnetbench.impair.backend.find_binary", lambda: None)
    ok, detail, fix = idle.how_held()
    assert not ok and "idle cores halt" in detail and "make setup" in fix
