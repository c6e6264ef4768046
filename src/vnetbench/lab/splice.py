"""Put a middle namespace on an existing veth link, and take it off again.

Before::

    switch [bridge]─ X ──veth── eth0  host

After splice (X keeps its name and bridge; the host side is not touched, so its
addresses, routes and neighbours stay)::

    switch [bridge]─ X ──veth── a  [middle]  b ──veth── eth0  host
                                   (vnb-link)

The switch's old end moves into the middle namespace (renamed ``a`` or ``b``,
so that ``a -> b`` is the link's forward direction) and a new veth pair joins
the switch to the middle. Offloads stay as they were: vnb-link forwards a
TCP or UDP segmentation-offloaded frame whole and counts it as its segments
(see emulator/README.md); a scenario's ``offload = "off"`` turns them off on
the endpoints. Only the offloads it cannot take (tunnels, SCTP, fraglists,
AccECN: KERNEL_SEGMENTS) are turned off on the two ends that send into the
middle. ``unsplice`` restores the original wiring and the host end's settings.

On a link between two IP nodes of a declared topology (a router's end, say) the "switch" end is an
interface with addresses and routes through it; moving a device to another namespace drops both, so the
new end takes them over at the splice, and the old one gets them back at the unsplice (:class:`Layer3`).
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field

from vnetbench.errors import LabError
from vnetbench.lab import netns
from vnetbench.lab.nodes import IFA_F_NODAD, Interface, Link, Namespace
from vnetbench.lab.offload import changeable_features, set_features
from vnetbench.lab.teardown import Registry, atomic

RT_TABLE_MAIN, RTPROT_KERNEL, RT_SCOPE_UNIVERSE = 254, 2, 0  # linux/rtnetlink.h

# Segmentation offloads vnb-link does not take whole (it forwards TCP and UDP ones, emulator/README.md):
# tunnels (VXLAN, Geneve, GRE, IP-in-IP), SCTP, fraglists and AccECN. A packet socket cannot even describe
# most of them. The two ends that send into the middle segment those in the kernel, as a NIC without them
# would; TCP and UDP segmentation stay as they are.
KERNEL_SEGMENTS = ("tx-udp_tnl-segmentation", "tx-udp_tnl-csum-segmentation", "tx-gre-segmentation",
                   "tx-gre-csum-segmentation", "tx-ipxip4-segmentation", "tx-ipxip6-segmentation",
                   "tx-sctp-segmentation", "tx-gso-list", "tx-tcp-accecn-segmentation")


@dataclass
class Splice:
    """A middle namespace on one link; `a -> b` is the link's forward direction."""

    middle: Namespace
    switch_end: Interface  # the new end in the switch (same name as before)
    host_end: Interface  # unchanged
    moved_name: str  # "a" or "b": the switch's old end, now in the middle
    original_name: str
    host_features: dict[str, bool] = field(default_factory=dict)  # KERNEL_SEGMENTS before, to put back
    # The receive steering (rps_cpus) of the end that gets the reverse direction, before steer_receive: put back by
    # unsteer_receive, and by unsplice when that end is the host's (the switch end goes with the splice).
    reverse_rps: str | None = None
    layer3: "Layer3 | None" = None  # the moved end's addresses and routes (a router's or a host's end), carried

    @property
    def a(self) -> Interface:
        return Interface(self.middle, "a")

    @property
    def b(self) -> Interface:
        return Interface(self.middle, "b")


@dataclass(frozen=True)
class Layer3:
    """What a device loses when it moves to another namespace: its own addresses and the routes through it.
    A bridge port has none; a router's or a host's end of a link has both, and the end that stands in for it
    must carry them for the network to route as before."""

    addresses: tuple[tuple[str, int], ...]  # (address, prefix length), link-local ones left out
    routes: tuple[tuple[int, str, int, str | None], ...]  # (family, destination, prefix length, gateway)

    def __bool__(self) -> bool:
        return bool(self.addresses or self.routes)


def read_layer3(ns: Namespace, index: int) -> Layer3:
    """Device `index`'s global addresses and the main table's routes out of it that are not the kernel's own
    (those come back with the addresses)."""
    addresses = tuple((a.get_attr("IFA_ADDRESS"), a["prefixlen"]) for a in ns.ipr.get_addr(index=index)
                      if a["scope"] == RT_SCOPE_UNIVERSE)
    routes = []
    for family in (socket.AF_INET, socket.AF_INET6):
        for r in ns.ipr.get_routes(family=family, table=RT_TABLE_MAIN):
            if r.get_attr("RTA_OIF") != index or r["proto"] == RTPROT_KERNEL:
                continue
            default = "0.0.0.0" if family == socket.AF_INET else "::"
            routes.append((family, r.get_attr("RTA_DST") or default, r["dst_len"], r.get_attr("RTA_GATEWAY")))
    return Layer3(addresses, tuple(routes))


def restore_layer3(ns: Namespace, ifname: str, layer3: Layer3) -> None:
    """Put `layer3` on device `ifname` (up already): the addresses first, then the routes through them."""
    index = ns.index(ifname)
    for address, prefixlen in layer3.addresses:
        ns.ipr.addr("add", index=index, address=address, prefixlen=prefixlen,
                    flags=IFA_F_NODAD if ":" in address else 0)
    for family, dst, prefixlen, gateway in layer3.routes:
        ns.ipr.route("add", dst=f"{dst}/{prefixlen}", gateway=gateway, oif=index, family=family)


def middle_namespace(name: str, registry: Registry) -> Namespace:
    """The (empty) middle namespace, registered for teardown; its own IPv6 is off so it stays quiet."""
    middle = Namespace.create(name, registry)
    middle.sysctl("net.ipv6.conf.all.disable_ipv6", "1")
    middle.sysctl("net.ipv6.conf.default.disable_ipv6", "1")
    return middle


def splice(switch_end: Interface, host_end: Interface, middle: Namespace, registry: Registry,
           host_upstream: bool) -> Splice:
    """Insert namespace `middle` (see middle_namespace) on the link switch_end <-> host_end.

    host_upstream: forward traffic comes from the host (a sender's link), so
    the host side becomes ``a``; otherwise (the receiver's link) it becomes ``b``.
    """
    sw = switch_end.ns
    name = switch_end.name
    index = switch_end.index
    info = sw.ipr.get_links(index)[0]
    kind = info.get_nested("IFLA_LINKINFO", "IFLA_INFO_KIND")
    if kind != "veth":
        raise LabError(f"cannot place an emulator on {sw.name}/{name}: it is a {kind or 'non-veth'} device, not a veth")
    master = info.get_attr("IFLA_MASTER")
    mtu = info.get_attr("IFLA_MTU") or 1500
    moved, new = ("a", "b") if host_upstream else ("b", "a")
    tmp = f"vnbmv{index}"[:15]
    layer3 = read_layer3(sw, index)
    with atomic():
        # Rename in place, move, rename again: the middle's names never clash with the switch's.
        sw.ipr.link("set", index=index, state="down")
        sw.ipr.link("set", index=index, ifname=tmp)
        sw.ipr.link("set", index=index, net_ns_fd=f"{netns.NETNS_DIR}/{middle.name}")
        middle.ipr.link("set", index=middle.index(tmp), ifname=moved)
        middle.link_up(moved)
        Link.connect(sw, name, middle, new, registry, mtu=mtu)
        if master:
            sw.ipr.link("set", index=sw.index(name), master=master)
        if layer3:
            restore_layer3(sw, name, layer3)
    result = Splice(middle, Interface(sw, name), host_end, moved, name, changeable_features(host_end, KERNEL_SEGMENTS),
                    layer3=layer3 or None)
    for end in (result.switch_end, host_end):
        set_features(end, {f: False for f in changeable_features(end, KERNEL_SEGMENTS)})
    return result


def unsplice(s: Splice) -> None:
    """Back to switch_end <-> host_end without the middle (the middle namespace stays, empty)."""
    sw = s.switch_end.ns
    info = sw.ipr.get_links(s.switch_end.index)[0]
    master = info.get_attr("IFLA_MASTER")
    with atomic():
        sw.ipr.link("del", index=s.switch_end.index)  # takes its peer in the middle with it
        m = s.middle
        idx = m.index(s.moved_name)
        m.ipr.link("set", index=idx, state="down")
        m.ipr.link("set", index=idx, net_ns_fd=f"{netns.NETNS_DIR}/{sw.name}")
        sw_idx = sw.index(s.moved_name)
        sw.ipr.link("set", index=sw_idx, ifname=s.original_name)
        if master:
            sw.ipr.link("set", index=sw_idx, master=master)
        sw.link_up(s.original_name)
        if s.layer3 is not None:  # what the device lost in the middle's namespace
            restore_layer3(sw, s.original_name, s.layer3)
    if s.host_features:
        set_features(s.host_end, s.host_features)
    if s.reverse_rps is not None and reverse_end(s) is s.host_end:
        _write_rps(s.host_end, s.reverse_rps)


# Receive steering (RPS, Documentation/networking/scaling.rst). A veth has no NAPI of its own: a frame the
# emulator sends into one is queued on the sending core's backlog, and the receiving side's stack runs in softirq
# on the emulator's core, at the end of its send call: for a frame of the forward direction, the receiver's TCP
# (and the ACK it sends back); for an ACK in the reverse direction, the bridge, the sender's TCP and the next
# segments it sends, up to their arrival at the emulator's socket. On a two-core machine that leaves the hosts'
# core a quarter idle while the emulator's core is saturated. RPS on the end that receives the reverse direction
# hands its share to the hosts' cores, and the two cores split the per-packet work. Measured in the bridged
# fidelity lab, offloads off, 10 ms each way (emulator/README.md, Capacity): 2.4-2.9 -> 2.5-3.7 Gbit/s for one
# flow (it varies from run to run), 1.4-1.6 -> 3.1-3.9 for eight. With both ends steered the hosts' core
# saturates instead. With the endpoints' offloads on, the ACKs of 64 KB frames are few and the hand-off is
# overhead (8 flows: 11.8-12.5 -> 7.9-8.4 Gbit/s): the userspace backend steers only while they are off.

def rps_mask(cpus: Iterable[int]) -> str:
    """`cpus` as the kernel's cpumask text: hex words of 32 CPUs, highest first, comma-separated."""
    bits = 0
    for c in cpus:
        bits |= 1 << c
    words = []
    while True:
        words.append(f"{bits & 0xFFFFFFFF:08x}")
        bits >>= 32
        if not bits:
            break
    return ",".join(reversed(words))


def _rps_path(end: Interface) -> str:
    return f"/sys/class/net/{end.name}/queues/rx-0/rps_cpus"


def _write_rps(end: Interface, mask: str) -> None:
    # The namespace's own sysfs shows its devices: `ip netns exec` mounts it. tee, not a shell.
    done = subprocess.run(["ip", "netns", "exec", end.ns.name, "tee", _rps_path(end)], input=mask + "\n",
                          capture_output=True, text=True, timeout=10)
    if done.returncode != 0:
        raise LabError(f"receive steering (RPS) on {end.ns.name}/{end.name} to CPUs {mask}: "
                       f"{done.stderr.strip() or f'tee exited {done.returncode}'}")


def read_rps(end: Interface) -> str | None:
    """The end's rps_cpus, or None when the kernel has no RPS (built without CONFIG_RPS: no such file)."""
    done = subprocess.run(["ip", "netns", "exec", end.ns.name, "cat", _rps_path(end)], capture_output=True,
                          text=True, timeout=10)
    if done.returncode != 0:
        if "No such file" in done.stderr:
            return None
        raise LabError(f"reading the receive steering (RPS) of {end.ns.name}/{end.name}: {done.stderr.strip()}")
    return done.stdout.strip()


def reverse_end(s: Splice) -> Interface:
    """The end outside the middle that receives the reverse direction (what the emulator sends out of ``a``)."""
    return s.host_end if s.moved_name == "a" else s.switch_end


def steer_receive(s: Splice, cpus: Iterable[int]) -> str | None:
    """Process the reverse direction's arrivals on `cpus` (the hosts' cores), not on the emulator's own. The
    mask set, or None when the kernel has no RPS (the work then stays on the emulator's core)."""
    end = reverse_end(s)
    before = read_rps(end)
    if before is None:
        return None
    if s.reverse_rps is None:
        s.reverse_rps = before
    mask = rps_mask(cpus)
    _write_rps(end, mask)
    return mask


def unsteer_receive(s: Splice) -> None:
    """The reverse direction's arrivals back where the kernel puts them (the mask before steer_receive)."""
    if s.reverse_rps is not None:
        _write_rps(reverse_end(s), s.reverse_rps)
