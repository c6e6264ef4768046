"""Topologies built from namespaces, veth links and a Linux bridge.

Names: every namespace is ``vnb-<run id>-<node>`` so `vnetbench clean` can find
what a killed run left, and touch nothing else. Addresses come from the
benchmarking ranges only: 198.18.0.0/15 (RFC 2544) and 2001:2::/48 (RFC 5180).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from vnetbench.errors import LabError
from vnetbench.impair import tc
from vnetbench.lab.nodes import Host, Link, Namespace
from vnetbench.lab.teardown import Registry

IPV4_PREFIXLEN = 15
IPV6_PREFIXLEN = 64


def host_addresses(n: int) -> tuple[str, str]:
    """The n-th host's addresses (n >= 1): 198.18.0.1, ..., 198.18.1.4, ...; 2001:2::1, ..."""
    if not 1 <= n <= 65000:
        raise LabError(f"host number {n} is outside the benchmarking range plan (1..65000)")
    return f"198.18.{n // 250}.{n % 250 + 1}", f"2001:2::{n:x}"


@dataclass
class Lab:
    """A built testbed: hosts by name plus the interfaces impairments attach to."""

    run_prefix: str
    registry: Registry
    hosts: dict[str, Host] = field(default_factory=dict)
    switch: Namespace | None = None
    ports: dict[str, Any] = field(default_factory=dict)  # host name -> switch-side Interface

    def teardown(self) -> list[str]:
        return self.registry.teardown()

    def ns_name(self, node: str) -> str:
        return f"{self.run_prefix}-{node}"


def _cpu_plan(n_senders: int) -> tuple[int, list[int]]:
    """Receiver on the last CPU, senders spread over the others (all CPUs on a 1-CPU box)."""
    cpus = sorted(os.sched_getaffinity(0))
    receiver = cpus[-1]
    others = cpus[:-1] or cpus
    return receiver, [others[i % len(others)] for i in range(n_senders)]


def build_dumbbell(run_prefix: str, senders: int, mtu: int = 1500, pin_cpus: bool = True,
                   registry: Registry | None = None) -> Lab:
    """Senders behind a switch whose port toward the receiver is the bottleneck.

    ::

        s1 ──┐
        s2 ──┤                         bottleneck
        ...  ├── [ switch: bridge br0 ] ──────────── r
        sN ──┘      (port "r" egress: tbf/htb = rate + buffer)

    Hosts: ``r`` (receiver) and ``s1..sN``; each has ``eth0`` toward the switch.
    """
    registry = registry or Registry()
    lab = Lab(run_prefix, registry)
    try:
        lab.switch = Namespace.create(lab.ns_name("sw"), registry)
        sw = lab.switch
        sw.ipr.link("add", ifname="br0", kind="bridge")
        sw.link_up("br0")
        br_index = sw.index("br0")
        rx_cpu, tx_cpus = _cpu_plan(senders)
        names = ["r"] + [f"s{i}" for i in range(1, senders + 1)]
        cpus = [rx_cpu] + tx_cpus
        for number, (name, cpu) in enumerate(zip(names, cpus), start=1):
            ns = Namespace.create(lab.ns_name(name), registry)
            link = Link.connect(sw, name, ns, "eth0", registry, mtu=mtu)
            sw.ipr.link("set", index=link.a.index, master=br_index)
            v4, v6 = host_addresses(number)
            link.b.add_address(f"{v4}/{IPV4_PREFIXLEN}")
            link.b.add_address(f"{v6}/{IPV6_PREFIXLEN}")
            lab.hosts[name] = Host(name=name, ns=ns, registry=registry, ipv4=v4, ipv6=v6,
                                   cpu=cpu if pin_cpus else None, iface=link.b)
            lab.ports[name] = link.a
    except BaseException:
        registry.teardown()
        raise
    return lab


def shape_bottleneck(lab: Lab, shaping: tc.Shaping, direction: str) -> list[dict[str, Any]]:
    """Put the bottleneck on the receiver's link, in the declared direction(s), and
    return the qdiscs as the kernel reports them."""
    port = lab.ports["r"]  # switch side: its egress carries traffic toward the receiver
    host_end = lab.hosts["r"].iface  # receiver side: its egress carries traffic back
    applied = []
    for iface, wanted in ((port, direction in ("forward", "both")), (host_end, direction in ("reverse", "both"))):
        if wanted:
            tc.apply(iface, shaping)
        else:
            tc.clear(iface)
        applied.extend(q for q in tc.read_back(iface) if q["kind"] not in ("noqueue",))
    return applied
