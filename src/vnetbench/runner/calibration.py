"""Is it the machine? A run's calibration: the same two small measurements before the run and after it, stored
with its fingerprint, so that two runs that disagree can be told apart from a machine that changed between them
(another tenant on a shared VM, a frequency cap, a kernel update) and a run during which the machine changed.

- ``cpu_events_per_s``: one core's speed, sysbench's prime-number loop (a fixed number of events, one thread,
  pinned to the first CPU the run may use);
- ``veth_tcp_gbps``: a bare veth pair's TCP stream (iperf3, one cubic flow, 1 s after a 1 s warm-up) between
  two namespaces of the calibration's own, both ends on that CPU: the kernel's path with no lab around it.

Each takes about two seconds. Neither is a benchmark of its own: the recipe never changes, so that the numbers
compare across runs and machines; they say how fast this machine was then. `compare` puts the two runs'
calibrations side by side and says when they differ beyond what one run's before and after differ by.
"""

from __future__ import annotations

import os
import subprocess
import time
from typing import Any

from vnetbench.lab.teardown import interruption_behind
from vnetbench.units import utc_text
from vnetbench.workloads import sysbench

LOOP_EVENTS = 1000  # about 0.6 s on this project's 2-core VM
STREAM_S = 1.0
SECONDS = 7.0  # before and after together, as `plan` estimates them
# Beyond this, two runs' calibrations differ by more than the machine's own drift over one run (measured on the
# 2-core VM: before and after one run within 6 % for the loop and 25 % for the bare stream, which a busy core moves).
CHANGED = {"cpu_events_per_s": 0.10, "veth_tcp_gbps": 0.30}
WHAT = {"cpu_events_per_s": ("one core's loop", "events/s"), "veth_tcp_gbps": ("a bare veth TCP stream", "Gbit/s")}


def measure(prefix: str) -> dict[str, Any]:
    """Both measurements now; a measurement that could not be made is named with why (never raises for it)."""
    out: dict[str, Any] = {"at": utc_text(time.time())}
    cpu = min(os.sched_getaffinity(0))
    try:
        done = subprocess.run(["taskset", "-c", str(cpu), "sysbench", "cpu", "--threads=1",
                               f"--events={LOOP_EVENTS}", "--time=0", "run"],
                              capture_output=True, text=True, timeout=60)
        # the workload's parser reads its own sectioned output: this run is one section of it
        out["cpu_events_per_s"] = round(sysbench.parse(f"=== vnb: sysbench cpu ===\n{done.stdout}", ["cpu"])["cpu"], 1)
    except Exception as e:  # noqa: BLE001 - a calibration that fails is recorded, the run goes on
        _unless_stopped(e)
        out["cpu_error"] = f"{type(e).__name__}: {e}"[:300]
    try:
        from vnetbench.impair.fidelity import FidelityLab

        with FidelityLab(prefix=f"{prefix}-cal") as lab:
            out["veth_tcp_gbps"] = round(lab.tcp(STREAM_S) / 1e9, 2)
    except Exception as e:  # noqa: BLE001
        _unless_stopped(e)
        out["veth_error"] = f"{type(e).__name__}: {e}"[:300]
    return out


def _unless_stopped(e: Exception) -> None:
    """Re-raise a stop (SIGINT, SIGTERM) that C code handed back as another exception: the run must stop."""
    stop = interruption_behind(e)
    if stop is not None:
        raise stop from e


def lines(calibration: list[dict[str, Any]] | None) -> list[str]:
    """What `show` prints of a run's calibration: a line per session (a resumed run has several)."""
    out = []
    for session in calibration or []:
        parts = []
        for key, (what, unit) in WHAT.items():
            values = [session.get(when, {}).get(key) for when in ("before", "after")]
            if any(v is not None for v in values):
                parts.append(f"{what} {' then '.join('-' if v is None else f'{v:g}' for v in values)} {unit}")
        if parts:
            out.append("calibration (before then after the run): " + "; ".join(parts))
    return out


def _values(calibration: list[dict[str, Any]] | None, key: str) -> list[float]:
    return [s[when][key] for s in calibration or [] for when in ("before", "after")
            if isinstance(s.get(when), dict) and isinstance(s[when].get(key), (int, float))]


def differences(a: list[dict[str, Any]] | None, b: list[dict[str, Any]] | None) -> list[str]:
    """How the machine measured differently between two runs (a's calibration, then b's): each quantity whose
    mean moved by more than CHANGED, and by more than either run's before and after differ. Empty when the
    machine measured alike or a run has no calibration."""
    out = []
    for key, (what, unit) in WHAT.items():
        va, vb = _values(a, key), _values(b, key)
        if not va or not vb:
            continue
        ma, mb = sum(va) / len(va), sum(vb) / len(vb)
        if ma <= 0:
            continue
        change = mb / ma - 1
        own = max((max(v) - min(v)) / (sum(v) / len(v)) for v in (va, vb))
        if abs(change) > max(CHANGED[key], own):
            out.append(f"{what} measured {ma:.4g} then {mb:.4g} {unit} ({change:+.0%}; within a run it moved by "
                       f"{own:.0%} at most)")
    return out
