"""Other work on the lab's machine (runner/foreign.py): /proc/<pid>/stat parsed from recorded files, and which
processes count as foreign."""

from __future__ import annotations

from pathlib import Path

from vnetbench.metrics import noise_marks
from vnetbench.runner.foreign import ProcTimes, foreign_load, parse_pid_stat

FIXTURES = Path(__file__).parent.parent / "fixtures" / "proc"


def test_pid_stat_from_the_kernel():
    cat = parse_pid_stat((FIXTURES / "pid-stat-cat.txt").read_text())
    assert (cat.comm, cat.kernel_thread) == ("cat", False) and cat.ppid > 0
    kthreadd = parse_pid_stat((FIXTURES / "pid-stat-kthreadd.txt").read_text())
    assert (kthreadd.pid, kthreadd.ppid, kthreadd.comm, kthreadd.kernel_thread) == (2, 0, "kthreadd", True)
    # user 100, system 50, reaped children's user 7 and system 3 ticks; the name holds ") (" and spaces
    odd = parse_pid_stat("4242 (a) (b c) R 1 4242 4242 0 -1 4194304 0 0 0 0 100 50 7 3 20 0 1 0 99 0 0")
    assert (odd.pid, odd.ppid, odd.comm, odd.kernel_thread, odd.ticks) == (4242, 1, "a) (b c", False, 160)


def proc(pid: int, ppid: int, ticks: int, comm: str = "x", kernel: bool = False) -> ProcTimes:
    return ProcTimes(pid, ppid, comm, kernel, ticks)


def test_what_is_foreign():
    run = 100
    before = {1: proc(1, 0, 1000, "init"), 100: proc(100, 1, 0, "vnetbench"), 101: proc(101, 100, 0, "iperf3"),
              200: proc(200, 1, 50, "stress-ng"), 3: proc(3, 2, 0, "ksoftirqd/0", kernel=True),
              300: proc(300, 1, 0, "dockerd"), 400: proc(400, 1, 10, "old")}
    after = {1: proc(1, 0, 1010, "init"),  # reaped a foreign child that used 10 ticks
             100: proc(100, 1, 400, "vnetbench"), 101: proc(101, 100, 300, "iperf3"),
             102: proc(102, 101, 50, "sh"),  # started during the trial, by the run
             200: proc(200, 1, 250, "stress-ng"),  # 200 ticks in 2 s: one core
             3: proc(3, 2, 90, "ksoftirqd/0", kernel=True), 300: proc(300, 1, 80, "dockerd"),
             400: proc(400, 1, 5, "new"),  # the pid came back as another process: all of its time is new
             500: proc(500, 1, 20, "make")}  # started during the trial, not by the run
    load = foreign_load(before, after, seconds=2.0, run_pid=run, hz=100)
    # stress-ng 100 + make 10 + init's reaped child 5 + the new pid 400 2.5 (% of a core)
    assert abs(load.pct - 117.5) < 1e-9
    assert load.top == [("stress-ng", 200, 100.0), ("make", 500, 10.0), ("init", 1, 5.0)]
    assert foreign_load(before, before, seconds=2.0, run_pid=run, hz=100).pct == 0


def test_a_trial_is_marked_above_the_noise_marks():
    assert noise_marks({"cpu.steal_pct": 1.0, "cpu.foreign_pct": 3.0, "throughput.rx_mbps": 5.0}) == []
    assert noise_marks({"cpu.steal_pct": 6.0, "cpu.foreign_pct": 99.6}) == ["steal 6 % of a core",
                                                                            "other processes 100 % of a core"]
