"""`vnetbench doctor`: what this machine can do, and what is missing.

Capabilities are detected by trying, never assumed: each qdisc is installed on
a veth pair inside a throw-away namespace; a kernel without netem (like many
cloud and minimal kernels) says "Specified qdisc kind is unknown" and we report
that, with what vnetbench does instead.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from vnetbench import machine, tools
from vnetbench.impair.backends import REGISTRY
from vnetbench.lab import cgroups, environments, idle, netns
from vnetbench.workloads import registry
from vnetbench.tools import ETHTOOL, IP, SS, TASKSET

# The lab's own tools, every workload's, and those of the environments.
TOOLS = list(dict.fromkeys([IP, SS, TASKSET, *(t for d in registry.drivers().values() for t in d.requires), ETHTOOL,
                            tools.TCPDUMP, tools.NFT, tools.QEMU]))

# Every kernel qdisc a link backend is made of (from the backend registry: each registers its probe and its
# fix), and the others vnetbench uses or users ask about.
QDISCS = {
    **{kind.name: kind.probe_qdisc for kind in REGISTRY.values() if kind.kernel},
    "fq": "fq",
    "fq_codel": "fq_codel",
    "codel": "codel",
    "pfifo": "pfifo limit 100",
    "clsact": "",  # its own parent: `tc qdisc add dev X clsact`
}
# What to do when a qdisc is missing; in the lab the userspace emulator stands in for netem.
QDISC_FIXES = {
    **{kind.name: kind.fix for kind in REGISTRY.values() if kind.kernel},
    "fq": "modprobe sch_fq (CONFIG_NET_SCH_FQ): only for pacing with fq; vnetbench does not need it",
}
QDISC_FIXES["netem"] += ("; until then delay, jitter, loss and reordering use the userspace emulator vnb-link "
                         "(`make setup` builds it)")
KVM_FIX = ("guests run under TCG (software, much slower; results say so). For KVM: enable virtualisation "
           "(VT-x/AMD-V, nested on a VM), modprobe kvm_intel or kvm_amd, and install qemu-system-x86")


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""


@dataclass
class DoctorReport:
    checks: list[Check] = field(default_factory=list)

    def add(self, name: str, ok: bool, detail: str, fix: str = "") -> None:
        self.checks.append(Check(name, ok, detail, fix))


def link_emulator_check() -> tuple[str, bool, str, str]:
    """The userspace link emulator: what `backend = "auto"` uses for delay, loss... without netem."""
    from vnetbench.impair.backend import find_binary, missing_binary_message

    from vnetbench import units
    from vnetbench.impair import capacity

    path = find_binary()
    if path is None:
        return "link emulator vnb-link", False, "not built", missing_binary_message()
    rate, origin = capacity.line_rate()
    said = origin if rate is None else f"{origin}: scenarios with a [scale] table run at up to {units.format_rate(rate)}"
    return "link emulator vnb-link", True, f"{path} (userspace backend); {said}", ""


def report_bundle_check() -> tuple[str, bool, str, str]:
    """Which plotly.js HTML reports inline: the pinned cartesian bundle, or the full one and why."""
    from vnetbench.report import plotly_bundle

    problem = plotly_bundle.problem()
    if problem is None:
        return ("report plotly.js", True, f"{plotly_bundle.PACKAGE} {plotly_bundle.VERSION}, sha256 verified", "")
    return ("report plotly.js", False, f"{problem}: reports carry the full bundle (3 MB more each)",
            "`make setup` installs the cartesian bundle (python -m vnetbench.report.plotly_bundle install)")


def kvm_state() -> tuple[bool, str]:
    dev = Path("/dev/kvm")
    if not dev.exists():
        return False, "/dev/kvm is absent: guests would run under TCG (software emulation)"
    try:
        fd = os.open(dev, os.O_RDWR)
        os.close(fd)
    except OSError as e:
        return False, f"/dev/kvm cannot be opened ({e}): guests would run under TCG"
    return True, "/dev/kvm opens; whether a guest really boots under KVM is probed when a VM environment starts"


def run_checks() -> DoctorReport:
    report = DoctorReport()
    root = os.geteuid() == 0
    report.add("root", root, "running as root" if root else "not root", "run vnetbench with sudo")
    facts = machine.identity()
    report.add("kernel", True, f"{facts['kernel']} on {facts['cpu_model']} x{facts['cpus']}, "
                               f"{(machine.memory_bytes() or 0) / 2**30:.1f} GiB")
    report.add("tcp congestion control", True,
               f"default {machine.read_sysctl('net.ipv4.tcp_congestion_control')}, available: "
               f"{machine.read_sysctl('net.ipv4.tcp_available_congestion_control')}")
    for tool in TOOLS:
        version = tool.version() if tool.path() else None
        report.add(f"tool {tool.command}", tool.path() is not None, version or "missing",
                   f"apt-get install {tool.package}")
    if root:
        qdiscs = netns.probe_qdiscs(QDISCS, purpose="doctor")
        for kind, err in qdiscs.items():
            report.add(f"qdisc {kind}", err is None, "works" if err is None else f"not available: {err}",
                       QDISC_FIXES.get(kind, ""))
    else:
        # Probing installs each qdisc in a throw-away namespace, which needs root: say so rather than
        # leaving the qdisc lines out, so "no netem" is never read into their absence.
        report.add("qdiscs", False, f"not probed ({', '.join(QDISCS)}): probing builds a namespace",
                   "run `sudo vnetbench doctor`")
    report.add(*link_emulator_check())
    kvm_ok, kvm_detail = kvm_state()
    report.add("kvm", kvm_ok, kvm_detail, "" if kvm_ok else KVM_FIX)
    report.add("cgroups", True, cgroups.describe())
    report.add("idle cores", *idle.how_held())
    report.add(*report_bundle_check())
    for cap in environments.availability(probe=root):  # what `env = ...` can be on this machine
        report.add(f"env {cap.name}", cap.ok, cap.detail, cap.fix)
    return report
