"""What this machine is: its kernel, CPUs, memory and settings, read from /proc and uname.

A low module of facts, with no opinion about runs: the fingerprint (runner/), the link capacity measurement
(impair/) and `doctor` each read the machine through it, so none of them reaches into another's package.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any


def threads_cpu_ns(pid: int, proc: Path = Path("/proc")) -> list[tuple[str, int]]:
    """Each live thread of process `pid` as (its name, the CPU time it has had so far in nanoseconds): its
    /proc/<pid>/task/<tid>/schedstat, the scheduler's own count, finer than stat's 10 ms ticks. Empty when the
    process is gone."""
    out: list[tuple[str, int]] = []
    try:
        tasks = os.scandir(proc / str(pid) / "task")
    except OSError:
        return out
    with tasks:
        for task in tasks:
            try:
                with open(f"{task.path}/comm") as f:
                    name = f.read().strip()
                with open(f"{task.path}/schedstat") as f:
                    out.append((name, int(f.read().split()[0])))
            except (OSError, ValueError, IndexError):
                continue  # the thread ended meanwhile
    return out


def read_sysctl(key: str) -> str | None:
    """A sysctl's value (`net.ipv4.tcp_congestion_control`), None where this kernel has no such key."""
    try:
        return Path("/proc/sys", *key.split(".")).read_text().strip()
    except OSError:
        return None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def memory_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def identity() -> dict[str, Any]:
    """The facts that tell one machine from another: host name, kernel, processor and how many of them."""
    uname = os.uname()
    return {
        "kernel": uname.release,
        "kernel_version": uname.version,
        "machine": uname.machine,
        "hostname": uname.nodename,
        "cpu_model": cpu_model(),
        "cpus": os.cpu_count(),
    }
