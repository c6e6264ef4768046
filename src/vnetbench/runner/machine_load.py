"""What else the machine was doing while a run measured.

A benchmark's numbers are only as good as the machine was quiet. The monitor
samples, every few seconds of the run, the load averages and the CPU time of
every process that is not the run's own, and stores what it saw in the run's
fingerprint; the report warns when others used a measurable share of a core.

The run's own processes are left out: the vnetbench process and its
descendants (tools, guests, the link emulator) and anything living in the
run's network namespaces (a daemon that re-parented itself to init). Kernel
threads are left out too: ksoftirqd and kworkers mostly carry the run's own
packets. What remains is load the run did not make. A process that starts and
ends between two samples is not seen: the monitor finds sustained load, which is
what moves a benchmark's numbers.
"""

from __future__ import annotations

import ipaddress
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vnetbench import runlock
from vnetbench.lab import netns

PF_KTHREAD = 0x00200000
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# A process is named in the fingerprint from 1 % of a core over the run; the report warns from a tenth of one
# (on a 2-core machine, 5 % of what a saturated sender can use).
NAMED_FROM_CORES = 0.01
WARN_FROM_CORES = 0.10
INTERVAL_S = 5.0


@dataclass
class _Proc:
    pid: int
    comm: str
    ppid: int
    kernel_thread: bool
    ticks: int
    start: int  # clock ticks after boot: with the pid, one process across pid reuse


def _read_stat(pid: str) -> _Proc | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None  # it ended between listing and reading
    # comm may hold spaces and parentheses: it runs from the first "(" to the last ")"
    left, right = text.find("("), text.rfind(")")
    fields = text[right + 2:].split()
    try:
        return _Proc(pid=int(pid), comm=text[left + 1:right], ppid=int(fields[1]),
                     kernel_thread=bool(int(fields[6]) & PF_KTHREAD),
                     ticks=int(fields[11]) + int(fields[12]), start=int(fields[19]))
    except (IndexError, ValueError):
        return None


def processes() -> list[_Proc]:
    return [p for pid in os.listdir("/proc") if pid.isdigit() and (p := _read_stat(pid)) is not None]


def _netns_inode(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def _run_namespaces(prefix: str) -> set[int]:
    """The run's own namespaces: not an engine's that it only named (the host's own, for a system dockerd,
    whose every process would otherwise pass for the run's)."""
    try:
        return {os.stat(p).st_ino for p in Path("/run/netns").glob(f"{prefix}-*") if not netns.is_foreign(p.name)}
    except OSError:
        return set()


LAB_RANGES = (ipaddress.ip_network("198.18.0.0/15"), ipaddress.ip_network("2001:2::/48"))


def _engine_helper(p: _Proc) -> bool:
    """A container engine's process that carries a lab's own traffic: docker-proxy forwarding a published
    port to a container on the benchmarking ranges (only a vnetbench lab puts containers there). It works for
    the run, as the run's own tools do, though dockerd started it."""
    if p.comm != "docker-proxy":
        return False
    try:
        argv = Path(f"/proc/{p.pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        target = ipaddress.ip_address(argv[argv.index("-container-ip") + 1])
    except (OSError, ValueError, IndexError):
        return False
    return any(target in net for net in LAB_RANGES)


def _descendants(procs: list[_Proc], root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for p in procs:
        children.setdefault(p.ppid, []).append(p.pid)
    found, todo = {root}, [root]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in found:
                found.add(c)
                todo.append(c)
    return found


def _uptime_ticks() -> float:
    try:
        return float(Path("/proc/uptime").read_text().split()[0]) * CLOCK_TICKS
    except (OSError, ValueError, IndexError):
        return float("inf")


def _loadavg() -> list[float]:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except (OSError, ValueError):
        return []


@dataclass
class LoadMonitor:
    """Start it when the run starts measuring, stop it when the run ends; ``summary()`` goes in the fingerprint."""

    netns_prefix: str
    run_id: str
    interval_s: float = INTERVAL_S
    own_pid: int = field(default_factory=os.getpid)

    def __post_init__(self) -> None:
        self.load_start = _loadavg()
        self.load_max = list(self.load_start)
        self.started = time.monotonic()
        self.ended: float | None = None
        self.load_end: list[float] = []
        self._last: dict[tuple[int, int], int] = {}
        self._used: dict[tuple[int, int], int] = {}
        self._names: dict[tuple[int, int], str] = {}
        self._concurrent: dict[str, runlock.LiveRun] = {}
        self.problem: str | None = None  # why a sample failed, if one did (the summary says so)
        self._born_after = _uptime_ticks()  # a process started after this is the run's to account from zero
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="vnetbench-load-monitor", daemon=True)
        self.sample()  # the baseline: CPU time used before the run started is not the run's to explain

    def start(self) -> "LoadMonitor":
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sample()
            except Exception as e:  # noqa: BLE001 - a sampling hiccup must never reach the user mid-run
                self.problem = f"{type(e).__name__}: {e}"

    def sample(self) -> None:
        procs = processes()
        ours = _descendants(procs, self.own_pid)
        namespaces = _run_namespaces(self.netns_prefix)
        for p in procs:
            if (p.kernel_thread or p.pid in ours or (namespaces and _netns_inode(p.pid) in namespaces)
                    or _engine_helper(p)):
                continue
            key = (p.pid, p.start)
            before = self._last.get(key)
            if before is None and p.start >= self._born_after:
                before = 0
            self._last[key] = p.ticks
            self._names[key] = p.comm
            if before is not None and p.ticks > before:
                self._used[key] = self._used.get(key, 0) + p.ticks - before
        now = _loadavg()
        self.load_max = [max(a, b) for a, b in zip(self.load_max, now)] if self.load_max else now
        for other in runlock.live_runs(exclude=self.run_id):
            self._concurrent[other.run_id] = other

    def stop(self) -> dict[str, Any]:
        if self.ended is None:
            self._stop.set()
            if self._thread.is_alive():
                self._thread.join(timeout=self.interval_s + 5)
            self.sample()
            self.ended = time.monotonic()
            self.load_end = _loadavg()
        return self.summary()

    def summary(self) -> dict[str, Any]:
        seconds = max((self.ended or time.monotonic()) - self.started, 1e-9)
        cores = {key: used / CLOCK_TICKS / seconds for key, used in self._used.items()}
        busy = sorted(((k, c) for k, c in cores.items() if c >= NAMED_FROM_CORES), key=lambda kc: -kc[1])
        return {
            "monitored_s": round(seconds, 1),
            "load_at_start": self.load_start,
            "load_max": self.load_max,
            "load_at_end": self.load_end or _loadavg(),
            "other_processes_cores": round(sum(cores.values()), 3),
            "busy_processes": [{"pid": k[0], "command": self._names[k], "cores": round(c, 3)} for k, c in busy[:10]],
            "concurrent_runs": [{"run_id": r.run_id, "pid": r.pid, "scenario": r.scenario}
                                for r in self._concurrent.values()],
            **({"sampling_problem": self.problem} if self.problem else {}),
        }


def _sessions(fingerprint: dict[str, Any]) -> list[dict[str, Any]]:
    sessions = fingerprint.get("machine_load")
    return [s for s in (sessions if isinstance(sessions, list) else [sessions]) if isinstance(s, dict)]


def describe(fingerprint: dict[str, Any]) -> dict[str, str]:
    """One line per session of the run (the first, then each resume), for the report's fingerprint table."""
    out = {}
    for i, s in enumerate(_sessions(fingerprint)):
        loads = [s.get(k) or [] for k in ("load_at_start", "load_max", "load_at_end")]
        busy = ", ".join(f"{p.get('command')} {float(p.get('cores') or 0):.2f}" for p in s.get("busy_processes") or []
                         if isinstance(p, dict))
        out["session 1 (run)" if i == 0 else f"session {i + 1} (resume)"] = (
            f"{s.get('monitored_s')} s; 1-min load average at start / highest / end: "
            + " / ".join(f"{x[0]:.2f}" if x else "?" for x in loads)
            + f"; other processes {float(s.get('other_processes_cores') or 0):.2f} cores"
            + (f" ({busy})" if busy else ""))
    return out


def machine_note(fingerprint: dict[str, Any]) -> str | None:
    """A warning for the report and the terminal when the run shared the machine, or None when it was quiet.
    ``machine_load`` holds one entry per session of the run (the first, then each resume)."""
    sessions = _sessions(fingerprint)
    parts = []
    if fingerprint.get("allow_concurrent"):
        parts.append("it was started with --allow-concurrent")
    runs = {str(r.get("run_id")): r for s in sessions for r in (s.get("concurrent_runs") or []) if isinstance(r, dict)}
    if runs:
        parts.append("other vnetbench runs measured at the same time ("
                     + ", ".join(f"{rid} pid {r.get('pid')}" for rid, r in runs.items()) + ")")
    busiest = max(sessions, key=lambda s: float(s.get("other_processes_cores") or 0), default=None)
    cores = float(busiest.get("other_processes_cores") or 0) if busiest else 0.0
    if busiest and cores >= WARN_FROM_CORES:
        top = ", ".join(f"{p.get('command')} (pid {p.get('pid')}, {float(p.get('cores') or 0):.2f})"
                        for p in (busiest.get("busy_processes") or [])[:3] if isinstance(p, dict))
        parts.append(f"other processes used {cores:.2f} of a core on average while it measured"
                     + (f": {top}" if top else ""))
    if not parts:
        return None
    return ("This run shared the machine: " + "; ".join(parts)
            + ". Its numbers may be lower or noisier than on a quiet machine.")
