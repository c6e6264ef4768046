"""The run's fingerprint: what machine, kernel, tools and settings produced the numbers."""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path
from typing import Any

import vnetbench
from vnetbench import machine
from vnetbench.tools import IPERF3, PING, Tool

SYSCTLS = [
    "net.core.rmem_max", "net.core.wmem_max", "net.core.default_qdisc", "net.core.netdev_max_backlog",
    "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem", "net.ipv4.tcp_congestion_control",
    "net.ipv4.tcp_available_congestion_control", "net.ipv4.tcp_mtu_probing", "net.ipv4.tcp_ecn",
]


def git_revision() -> str | None:
    src = Path(vnetbench.__file__).resolve().parent
    try:
        out = subprocess.run(["git", "-C", str(src), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True, timeout=5)
        dirty = subprocess.run(["git", "-C", str(src), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def collect(tools: list[Tool] | None = None) -> dict[str, Any]:
    tools = tools or [IPERF3, PING]
    return {
        **machine.identity(),
        "memory_bytes": machine.memory_bytes(),
        "python": platform.python_version(),
        "vnetbench_version": vnetbench.__version__,
        "vnetbench_git": git_revision(),
        "tools": {t.command: t.version() for t in tools},
        "sysctls": {k: machine.read_sysctl(k) for k in SYSCTLS},
    }


def left_out_note(fp: dict[str, Any]) -> str | None:
    """One sentence for `show` and the report: which `if_available` environments this run left out, and why."""
    left = [e for e in (fp.get("left_out") or []) if isinstance(e, dict)]
    if not left:
        return None
    return ("Left out on this machine (marked if_available): " + "; ".join(
        f"{e.get('environment')} ({e.get('configurations')} configuration{'s' if e.get('configurations') != 1 else ''}): {e.get('reason')}" for e in left) + ".")


#: One-way delays compare two hosts' clocks: beyond this bound on their offset they are not reported as trusted.
ONE_WAY_TRUST_MS = 1.0


def clock_note(fp: dict[str, Any]) -> str | None:
    """For a run on hosts: a warning when the hosts' clocks are known to the controller's only within more than
    ONE_WAY_TRUST_MS, so one-way delays (irtt's send and receive delays) between them are not to be trusted."""
    loose = {}
    for name, facts in (fp.get("hosts") or {}).items():
        clock = facts.get("clock") if isinstance(facts, dict) else None
        if not isinstance(clock, dict):
            continue
        offset, bound = clock.get("offset_ms"), clock.get("uncertainty_ms")
        if offset is None or bound is None:
            loose[name] = "not measured" + (f" ({clock['note']})" if clock.get("note") else "")
        elif abs(offset) + bound > ONE_WAY_TRUST_MS:
            loose[name] = f"{offset:+.1f} ms ± {bound:.1f}"
    if not loose:
        return None
    return ("One-way delays between hosts are untrusted: clock offsets to the controller "
            + "; ".join(f"{n} {v}" for n, v in loose.items())
            + f" (trusted within {ONE_WAY_TRUST_MS:g} ms); round trips are unaffected.")


def idle_note(fp: dict[str, Any]) -> str | None:
    """For a run whose lab could not keep idle cores from halting (lab/idle.py): what a wake-up cost meanwhile,
    which every round trip through a delay paid twice (a run on real hosts measures none: no note)."""
    state, woke = fp.get("cpu_wake_latency"), fp.get("cpu_wake_up")
    if not (isinstance(state, str) and state.startswith("not held") and isinstance(woke, dict)):
        return None
    after, at_once, asleep = woke.get("wake_us_after_sleep"), woke.get("wake_us_at_once"), woke.get("asleep_us")
    if not all(isinstance(x, (int, float)) for x in (after, at_once, asleep)):
        return None
    driverless = "no cpuidle driver" in state
    why = "the kernel has no cpuidle driver" if driverless else state.removeprefix("not held: ")
    return (f"Idle cores halted while the lab was up ({why}): a process woken after {asleep / 1000:g} ms asleep "
            f"started {after:.0f} us late ({at_once:.0f} us just asleep), which a round trip through a delay pays "
            "twice" + ('; lab.idle_cores = "poll" keeps them polling.' if driverless else "."))


def run_notes(fp: dict[str, Any]) -> list[str]:
    """What `show` and the report say about a run from its fingerprint, beside the machine's load."""
    return [n for n in (scale_note(fp), left_out_note(fp), clock_note(fp), idle_note(fp)) if n]


def scale_note(fp: dict[str, Any]) -> str | None:
    """The line rate a scenario with a [scale] table ran at, and where it came from (scenario/load.py)."""
    note = fp.get("scale")
    return f"Scaled: {note}" if isinstance(note, str) and note else None
