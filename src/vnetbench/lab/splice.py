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
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vnetbench.errors import LabError
from vnetbench.lab import netns
from vnetbench.lab.nodes import Interface, Link, Namespace
from vnetbench.lab.offload import changeable_features, set_features
from vnetbench.lab.teardown import Registry, atomic

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

    @property
    def a(self) -> Interface:
        return Interface(self.middle, "a")

    @property
    def b(self) -> Interface:
        return Interface(self.middle, "b")


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
    result = Splice(middle, Interface(sw, name), host_end, moved, name, changeable_features(host_end, KERNEL_SEGMENTS))
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
    if s.host_features:
        set_features(s.host_end, s.host_features)
