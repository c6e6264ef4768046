"""Other work on the lab's machine during a trial: the CPU time of processes that are not the run's.

A trial's CPU numbers (runner/recorders.CpuRecorder) count the whole machine, as netperf does; this says how
much of it was someone else's. A process is the run's when it lives in another network namespace than the
run's own (every lab endpoint, emulator, guest and container does), descends from the run's process, or is a
container engine's daemon (it serves the run's containers). Kernel threads are not counted: they do the
kernel's share of the run's traffic (ksoftirqd) as much as anything else, and /proc/stat's softirq and system
time already show them. Everything else in the run's namespace is foreign: other users' jobs, a build, a
benchmark left running, the shell loop of whoever shares the machine.

The time is read from /proc/<pid>/stat at the trial's start and end (user + system time of the process and of
the children it reaped), so a foreign process that starts and ends within a trial counts when its parent reaps
it. Each scan reads every process's stat once: about 1 ms per 100 processes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PF_KTHREAD = 0x00200000  # include/linux/sched.h: the task is a kernel thread
# Daemons that run a container engine's containers: their work during a trial is the run's.
ENGINE_DAEMONS = frozenset({"dockerd", "containerd", "containerd-shim", "containerd-shim-runc-v2", "runc", "crun",
                            "conmon", "podman", "catatonit"})


@dataclass(frozen=True)
class ProcTimes:
    """One process as /proc/<pid>/stat tells it."""

    pid: int
    ppid: int
    comm: str
    kernel_thread: bool
    ticks: int  # utime + stime + cutime + cstime, in clock ticks


def parse_pid_stat(text: str) -> ProcTimes:
    """/proc/<pid>/stat (proc(5)); the command name is between the first "(" and the last ")" and may hold
    spaces and parentheses itself."""
    left, right = text.index("("), text.rindex(")")
    pid = int(text[:left])
    rest = text[right + 2:].split()  # from field 3 (state) on
    flags, utime, stime, cutime, cstime = (int(rest[i]) for i in (6, 11, 12, 13, 14))
    return ProcTimes(pid, int(rest[1]), text[left + 1:right], bool(flags & PF_KTHREAD),
                     utime + stime + max(0, cutime) + max(0, cstime))


def scan(proc: Path = Path("/proc")) -> dict[int, ProcTimes]:
    """Every process in this process's network namespace (kernel threads included: they are told apart later,
    and processes in other namespaces are the run's)."""
    own_ns = os.readlink(proc / "self" / "ns" / "net")
    out: dict[int, ProcTimes] = {}
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(f"{entry.path}/ns/net") != own_ns:
                continue
            with open(f"{entry.path}/stat") as f:
                out[int(entry.name)] = parse_pid_stat(f.read())
        except (OSError, ValueError):
            continue  # it ended meanwhile, or it is a kernel thread without a namespace link
    return out


def _runs(pid: int, parents: dict[int, int], run_pid: int) -> bool:
    """Whether `pid` is `run_pid` or one of its descendants."""
    seen = set()
    while pid and pid not in seen:
        if pid == run_pid:
            return True
        seen.add(pid)
        pid = parents.get(pid, 0)
    return False


@dataclass(frozen=True)
class ForeignLoad:
    """Foreign CPU time over a span: in cores x 100 (100 = one core busy all along), and the busiest foreign
    processes (command name, pid, share of a core)."""

    pct: float
    top: list[tuple[str, int, float]]


def foreign_load(before: dict[int, ProcTimes], after: dict[int, ProcTimes], seconds: float,
                 run_pid: int | None = None, hz: int | None = None) -> ForeignLoad:
    """The CPU time foreign processes used between two scans `seconds` apart. A process seen only in `after`
    started within the span: all of its time counts."""
    run_pid = os.getpid() if run_pid is None else run_pid
    hz = hz or os.sysconf("SC_CLK_TCK")
    parents = {p.pid: p.ppid for p in (*before.values(), *after.values())}
    used: list[tuple[str, int, float]] = []
    for pid, now in after.items():
        if now.kernel_thread or now.comm in ENGINE_DAEMONS or _runs(pid, parents, run_pid):
            continue
        then = before.get(pid)
        ticks = now.ticks - (then.ticks if then is not None and then.comm == now.comm else 0)
        if ticks > 0:
            used.append((now.comm, pid, 100.0 * ticks / hz / seconds if seconds > 0 else 0.0))
    used.sort(key=lambda u: -u[2])
    return ForeignLoad(sum(u[2] for u in used), [(c, p, round(s, 1)) for c, p, s in used[:3]])
