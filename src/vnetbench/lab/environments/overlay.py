"""`overlay`: containers on different nodes joined across an underlay.

``overlay = "vxlan"`` — the model of Docker's overlay driver, Flannel (vxlan
backend) and Weave's fast datapath: one L2 segment for the containers of all
nodes, carried between nodes in VXLAN (UDP 4789) over the underlay::

    [ container ns ]             [ node ns ]                                         underlay
      eth0 198.19.S.n ──veth── veth0 ─ ovbr0 ─ vxlan0 (VNI, dstport 4789, local 198.18.0.x) ── eth0 ── [ switch ]
      MTU = underlay MTU - 50    FDB: 00:00:00:00:00:00 -> every other node's underlay address
                                 (head-end replication for flooding; unicast MACs are learnt)

``overlay = "routed"`` — Calico's model: no encapsulation; each node owns a
container block and routes to the other nodes' blocks via their underlay
addresses (static routes here, BGP in Calico)::

    [ container ns ]                 [ node ns, forwarding on ]
      eth0 198.19.k.2 ──veth── veth0 198.19.k.1    route 198.19.j.0/24 via node j   eth0 ── [ switch ]

The underlay is the lab's switch, so whatever impairs a node's link (the
bottleneck, an emulated delay) acts on the encapsulated traffic, as on a WAN.

On a declared topology the underlay is the graph: each node is a host's namespace as the graph wired it, and
nodes may be routers apart. VXLAN crosses them as any UDP does. Routed, every node and every router of the
graph gets a route to each node's block via its own next hop toward that node's address (what BGP between
Calico's nodes and the fabric's routers would install); on one segment that is the node itself, as above.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from vnetbench.lab.environments.base import (EnvironmentOptions, SUBNET_V4_PREFIXLEN, SUBNET_V6_PREFIXLEN, Attached, Capability,
                                             Endpoint, LabContext, NamespaceEnvironment, WiredNamespace, Subnet,
                                             add_default_routes, add_route, wired_namespace, enable_forwarding,
                                             new_namespace, namespace_node, register)
from vnetbench.lab.nodes import Interface, Link, Namespace

VXLAN_PORT = 4789  # IANA
VXLAN_OVERHEAD_V4 = 50  # outer Ethernet 14 + IPv4 20 + UDP 8 + VXLAN 8
BRIDGE = "ovbr0"
VXLAN_DEV = "vxlan0"
VNI_BASE = 4096


class OverlayOptions(EnvironmentOptions):
    overlay: Literal["vxlan", "routed"] | None = Field(default=None, description="env=overlay: VXLAN (Docker "
                                                       "overlay, Flannel, Weave) or routing (Calico); default vxlan")


@register
class OverlayEnvironment(NamespaceEnvironment):
    kind = "overlay"
    tag = "o"
    Options = OverlayOptions
    probes_kernel = True

    @classmethod
    def capabilities(cls, variant: Any | None, kernel: dict[str, str | None] | None) -> list[Capability]:
        """VXLAN devices (probed in the kernel) and routing (always); `variant` None: both modes."""
        mode = None if variant is None else (variant.overlay or "vxlan")
        caps = []
        if mode in (None, "vxlan"):
            err = kernel.get("vxlan") if kernel is not None else None
            caps.append(Capability("overlay (vxlan)", err is None,
                                   "VXLAN devices (UDP 4789) in a per-node bridge" if err is None else
                                   f"the kernel cannot create a VXLAN device: {err}",
                                   "" if err is None else "a kernel with CONFIG_VXLAN (module vxlan)"))
        if mode in (None, "routed"):
            caps.append(Capability("overlay (routed)", True, "per-node container blocks, static routes"))
        return caps

    def __init__(self, ctx: LabContext, variant: Any):
        super().__init__(ctx, variant)
        self.mode = variant.overlay or "vxlan"
        self.nodes: list[tuple[WiredNamespace, Subnet | None, Attached]] = []
        self.segment: Subnet | None = None  # vxlan: the one overlay subnet of this variant
        self.vni: int | None = None
        self.fabric_routes: dict[str, dict[str, str]] = {}  # routed: router namespace -> {block: next hop}

    def inner_mtu(self, underlay_mtu: int) -> int:
        return underlay_mtu - VXLAN_OVERHEAD_V4 if self.mode == "vxlan" else underlay_mtu

    def attach(self, endpoint: Endpoint) -> Attached:
        ctx, reg = self.ctx, self.ctx.registry
        node = wired_namespace(ctx, endpoint.name)
        ctr = new_namespace(ctx, f"{endpoint.name}-ctr")
        mtu = self.inner_mtu(endpoint.mtu)
        link = Link.connect(node.ns, "veth0", ctr, "eth0", reg, mtu=mtu)
        enable_forwarding(node.ns)
        facts: dict[str, Any] = {"env": "overlay", "overlay": self.mode, "node_netns": node.ns.name,
                                 "container_netns": ctr.name, "underlay_address": [node.ipv4, node.ipv6],
                                 "container_mtu": mtu}
        extra_ifaces: list[Interface] = []
        block: Subnet | None = None
        if self.mode == "vxlan":
            if self.segment is None:
                self.segment = ctx.new_subnet()
                self.vni = VNI_BASE + self.segment.index
            n = len(self.nodes) + 2  # .1 is left free, as a gateway would use it
            c4, c6 = self.segment.v4(n), self.segment.v6(n)
            node.ns.ipr.link("add", ifname=BRIDGE, kind="bridge")
            bridge = Interface(node.ns, BRIDGE)
            # Not bound to the underlay interface (no vxlan_link): the kernel deletes a VXLAN device whose lower
            # device leaves the namespace, and an emulator spliced onto a topology's host-side link end moves
            # that end away. The unicast flood entries below name no device either: routing picks the way out.
            node.ns.ipr.link("add", ifname=VXLAN_DEV, kind="vxlan", vxlan_id=self.vni, vxlan_port=VXLAN_PORT,
                             vxlan_local=node.ipv4, vxlan_learning=1)
            vxlan = Interface(node.ns, VXLAN_DEV)
            vxlan.set_mtu(mtu)
            for dev in (vxlan, link.a):
                node.ns.ipr.link("set", index=dev.index, master=bridge.index)
            bridge.set_mtu(mtu)
            vxlan.up()
            bridge.up()
            link.b.add_address(f"{c4}/{SUBNET_V4_PREFIXLEN}")
            link.b.add_address(f"{c6}/{SUBNET_V6_PREFIXLEN}")
            facts.update({"vni": self.vni, "dstport": VXLAN_PORT, "segment": [self.segment.cidr4, self.segment.cidr6]})
            extra_ifaces = [bridge, vxlan]
        else:
            block = ctx.new_subnet()
            gw4, gw6, c4, c6 = block.v4(1), block.v6(1), block.v4(2), block.v6(2)
            link.a.add_address(f"{gw4}/{SUBNET_V4_PREFIXLEN}")
            link.a.add_address(f"{gw6}/{SUBNET_V6_PREFIXLEN}")
            link.b.add_address(f"{c4}/{SUBNET_V4_PREFIXLEN}")
            link.b.add_address(f"{c6}/{SUBNET_V6_PREFIXLEN}")
            add_default_routes(ctr, link.b, gw4, gw6)
            facts["block"] = [block.cidr4, block.cidr6]
        facts["container_address"] = [c4, c6]
        host = namespace_node(endpoint, ctr, reg, link.b, c4, c6, env_facts=facts)
        host.extra["node"] = node
        att = Attached(node=host, port=node.port, uplink=node.iface,
                       offload_ifaces=[link.b, link.a, *extra_ifaces, node.iface])
        self.nodes.append((node, block, att))
        self.attached.append(att)
        return att

    def finish(self) -> None:
        """Join the nodes: VXLAN flood entries, or routes to each other's container blocks."""
        for node, _block, att in self.nodes:
            peers = [(n, b) for n, b, _ in self.nodes if n is not node]
            if self.mode == "vxlan":
                index = node.ns.index(VXLAN_DEV)
                for peer, _ in peers:
                    node.ns.ipr.fdb("append", ifindex=index, lladdr="00:00:00:00:00:00", dst=peer.ipv4)
                att.node.env_facts["vxlan_remotes"] = [p.ipv4 for p, _ in peers]
            else:
                routes = {cidr: next_hop(node.ns, address) for peer, block in peers
                          for cidr, address in ((block.cidr4, peer.ipv4), (block.cidr6, peer.ipv6))}
                for cidr, via in routes.items():
                    add_route(node.ns, cidr, via)
                att.node.env_facts["routes"] = {k: v for k, v in routes.items() if ":" not in k}
        if self.mode == "routed":
            for router in self.ctx.routers:
                learnt = self.fabric_routes[router.name] = {}
                for node, block, _att in self.nodes:
                    for cidr, address in ((block.cidr4, node.ipv4), (block.cidr6, node.ipv6)):  # type: ignore[union-attr]
                        learnt[cidr] = next_hop(router, address)
                        add_route(router, cidr, learnt[cidr])

    def vxlan_counters(self) -> dict[str, dict[str, int]]:
        """{host name: {tx_packets, rx_packets, tx_bytes, rx_bytes}} of each node's VXLAN device."""
        out = {}
        for node, _, att in self.nodes:
            if self.mode != "vxlan":
                continue
            msg = node.ns.ipr.get_links(node.ns.index(VXLAN_DEV))[0]
            stats = msg.get_attr("IFLA_STATS64") or msg.get_attr("IFLA_STATS")
            out[att.node.name] = {k: stats[k] for k in ("tx_packets", "rx_packets", "tx_bytes", "rx_bytes")}
        return out

    def counters(self) -> dict[str, dict[str, int]]:
        """Per trial, before and after (runner/recorders.py): the VXLAN devices' packets and bytes; nothing
        per host in routed mode, which has no device of its own."""
        return self.vxlan_counters()

    def facts(self) -> dict[str, Any]:
        out: dict[str, Any] = {"env": "overlay", "overlay": self.mode}
        if self.mode == "vxlan":
            out.update({"vni": self.vni, "dstport": VXLAN_PORT, "encapsulation_overhead": VXLAN_OVERHEAD_V4,
                        "model": "VXLAN in a per-node bridge, head-end replication (Docker overlay / Flannel / Weave)"})
        else:
            out["model"] = "per-node container blocks, static routes via underlay addresses (Calico, no BGP)"
            if self.fabric_routes:
                out["fabric_routes"] = self.fabric_routes
        return out


def next_hop(ns: Namespace, address: str) -> str:
    """Whom `ns` hands a packet for `address` to: its route's gateway, or `address` itself where that is on one
    of its links."""
    found = ns.ipr.route("get", dst=address, family=10 if ":" in address else 2)
    gateway = found[0].get_attr("RTA_GATEWAY") if found else None
    return gateway or address
