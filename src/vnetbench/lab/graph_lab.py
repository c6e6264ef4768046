"""A topology graph (:mod:`vnetbench.topology.graph`) made real: a namespace per node, a veth pair per link,
a Linux bridge in each switch, forwarding in each router, the plan's addresses and routes.

Batched, because a 1,000-node lab must come up in seconds: every netlink request of a namespace is written
with pyroute2's message classes and sent in one write, on a socket opened inside that namespace (pyroute2's
IPRoute spends about 0.7 ms on each request and 5 ms on each namespace's socket, measured: 15 s for a 1,000-host
star, where the requests themselves take the kernel under 2 s). Interface indexes are chosen here, not asked
for: a request can name an interface before the kernel has answered the one that made it.

A switch floods: every multicast listener report a host sends at link-up reaches every other host of its
segment (the switches joined by switch-to-switch links, and everything on them), and a 1,000-host star spent
10 s in that storm. The storm grows with the square of the segment's members (a few reports a member, each to
every other: about 40 ms at 64, from the 1,000-host star's 10 s), and it is the segment that counts, not one
switch's ports: a tree of small switches floods every host of the tree. Where a segment of more than
QUIET_SEGMENT_HOSTS members would storm for longer than its switches' rules take to install (STORM_AT_QUIET_S
x (members / QUIET_SEGMENT_HOSTS)^2 against RULE_S a switch), its switches forward no multicast listener
report, IGMP report or router solicitation to their ports (an nftables rule in each switch's namespace, where
frames enter it: a drop after the flooding decision still cost a rule per port), as a snooping switch keeps
reports to its router ports; nothing in a lab listens to multicast, so nothing else changes. Measured in one
run of `bench/lab_setup.py --shapes`: a 3x10 tree of switches (1,000 hosts, 111 switches) came up in 8.9 s
with the rules and 11.8 without; a 4x3 tree (81 hosts, 40 switches) in 1.4 s with them and 1.2 without. A
smaller segment, a dumbbell's among them, is plain bridges with no rule on its frames' way and needs no
nftables. Switches have no addresses.

Teardown: every namespace is registered the moment it exists; removing a namespace removes its devices.
"""

from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

from vnetbench.errors import LabError
from vnetbench.lab import netns
from vnetbench.lab.netns import rtnl
from vnetbench.lab.teardown import Registry, atomic
from vnetbench.topology.graph import Graph, Plan, Route

NLMSG_ERROR = 2
IFF_UP = 1
IFA_F_NODAD = 0x02
RT_TABLE_MAIN, RTPROT_STATIC, RT_SCOPE_UNIVERSE, RTN_UNICAST = 254, 4, 0, 1
SO_RCVBUFFORCE = 33
CHUNK = 200  # requests per write: their answers fit the socket's receive buffer
# The switches of a larger segment may drop multicast reports where they enter (module note): where the
# segment's storm (STORM_AT_QUIET_S at QUIET_SEGMENT_HOSTS members, growing with their square) would last
# longer than one nft process a switch (RULE_S, 7-14 ms measured) takes.
QUIET_SEGMENT_HOSTS = 64
STORM_AT_QUIET_S = 0.041
RULE_S = 0.010
BRIDGE = "br0"
BRIDGE_INDEX = 2  # a switch's bridge; its ports and an IP node's interfaces count from 3

# A switch forwards no multicast listener report, IGMP report or router solicitation (see the module's note).
SWITCH_RULESET = """table bridge vnb_switch {
  chain prerouting {
    type filter hook prerouting priority 0; policy accept;
    icmpv6 type { mld-listener-report, mld2-listener-report, mld-listener-done, nd-router-solicit } drop
    ip protocol igmp drop
  }
}
"""

# Per-namespace settings, written before any interface exists ("default" then applies to each new one).
COMMON_SYSCTLS = {
    "net/ipv6/conf/default/accept_dad": "0",  # addresses usable at once (neighbour discovery waits otherwise)
    "net/ipv6/conf/all/accept_dad": "0",
    "net/ipv6/conf/default/router_solicitations": "0",  # no router advertisements here to ask for
    "net/ipv6/conf/default/accept_ra": "0",
}
SYSCTLS = {
    "host": COMMON_SYSCTLS,
    "router": {**COMMON_SYSCTLS, "net/ipv4/ip_forward": "1", "net/ipv6/conf/all/forwarding": "1"},
    # A bridge forwards frames: no IP of its own, no IPv6 chatter from its ports.
    "switch": {"net/ipv6/conf/default/disable_ipv6": "1", "net/ipv6/conf/all/disable_ipv6": "1"},
}


class Requests:
    """Netlink requests for one namespace, encoded by pyroute2 and sent together (:meth:`send`)."""

    def __init__(self, where: str):
        self.where = where
        self.messages: list[Any] = []
        self.said: list[str] = []  # what each request does, for the error that names it

    def _add(self, msg: Any, kind: int, create: bool, what: str) -> None:
        msg["header"]["type"] = kind
        nl = rtnl()
        msg["header"]["flags"] = nl.NLM_F_REQUEST | nl.NLM_F_ACK | (nl.NLM_F_CREATE | nl.NLM_F_EXCL if create else 0)
        msg["header"]["sequence_number"] = len(self.messages) + 1
        self.messages.append(msg)
        self.said.append(what)

    def up(self, index: int, what: str, master: int | None = None) -> None:
        nl = rtnl()
        msg = nl.ifinfmsg()
        msg["index"], msg["flags"], msg["change"] = index, IFF_UP, IFF_UP
        if master is not None:
            msg["attrs"] = [("IFLA_MASTER", master)]
        self._add(msg, nl.RTM_NEWLINK, False, what)

    def veth(self, name: str, index: int, ns_fd: int, peer: str, peer_index: int, peer_ns_fd: int, mtu: int,
             what: str) -> None:
        nl = rtnl()
        msg = nl.ifinfmsg()
        msg["index"] = index
        msg["attrs"] = [("IFLA_IFNAME", name), ("IFLA_MTU", mtu), ("IFLA_NET_NS_FD", ns_fd),
                        ("IFLA_LINKINFO", {"attrs": [("IFLA_INFO_KIND", "veth"), ("IFLA_INFO_DATA", {"attrs": [
                            ("VETH_INFO_PEER", {"index": peer_index, "attrs": [
                                ("IFLA_IFNAME", peer), ("IFLA_MTU", mtu), ("IFLA_NET_NS_FD", peer_ns_fd)]})]})]})]
        self._add(msg, nl.RTM_NEWLINK, True, what)

    def bridge(self, name: str, index: int, what: str) -> None:
        nl = rtnl()
        msg = nl.ifinfmsg()
        msg["index"] = index
        msg["attrs"] = [("IFLA_IFNAME", name), ("IFLA_LINKINFO", {"attrs": [("IFLA_INFO_KIND", "bridge")]})]
        self._add(msg, nl.RTM_NEWLINK, True, what)

    def address(self, index: int, address: str, prefixlen: int, what: str) -> None:
        nl = rtnl()
        msg = nl.ifaddrmsg()
        v6 = ":" in address
        msg["family"] = socket.AF_INET6 if v6 else socket.AF_INET
        msg["prefixlen"], msg["index"], msg["flags"] = prefixlen, index, IFA_F_NODAD if v6 else 0
        msg["attrs"] = [("IFA_LOCAL", address), ("IFA_ADDRESS", address)] if not v6 else [("IFA_ADDRESS", address)]
        self._add(msg, nl.RTM_NEWADDR, True, what)

    def route(self, route: Route, oif: int, what: str) -> None:
        nl = rtnl()
        msg = nl.rtmsg()
        msg["family"] = socket.AF_INET6 if route.dst.version == 6 else socket.AF_INET
        msg["dst_len"], msg["table"], msg["proto"] = route.dst.prefixlen, RT_TABLE_MAIN, RTPROT_STATIC
        msg["scope"], msg["type"] = RT_SCOPE_UNIVERSE, RTN_UNICAST
        attrs = [("RTA_GATEWAY", route.gateway), ("RTA_OIF", oif)]
        if route.dst.prefixlen:
            attrs.insert(0, ("RTA_DST", str(route.dst.network_address)))
        msg["attrs"] = attrs
        self._add(msg, nl.RTM_NEWROUTE, True, what)

    def send(self, sock: socket.socket) -> None:
        """Every request, CHUNK at a time, each chunk's answers read before the next is written; the first
        refusal ends it as a LabError naming the request and the kernel's reason."""
        for start in range(0, len(self.messages), CHUNK):
            chunk = self.messages[start:start + CHUNK]
            data = bytearray()
            for msg in chunk:
                msg.encode()
                data += msg.data
            sock.send(bytes(data))
            waiting = {m["header"]["sequence_number"] for m in chunk}
            while waiting:
                for seq, error in _answers(sock.recv(1 << 20)):
                    waiting.discard(seq)
                    if error:
                        raise LabError(f"{self.where}: {self.said[seq - 1]}: {os.strerror(error)}")


def _answers(data: bytes) -> Iterator[tuple[int, int]]:
    """(sequence number, errno) of each acknowledgement in one read (errno 0: done)."""
    offset = 0
    while offset + 16 <= len(data):
        length, kind, _, seq, _ = struct.unpack_from("=IHHII", data, offset)
        if kind == NLMSG_ERROR:
            (code,) = struct.unpack_from("=i", data, offset + 16)
            yield seq, -code
        offset += (length + 3) & ~3
        if length == 0:
            break


def _socket_in(ns_name: str | None) -> socket.socket:
    """A netlink socket bound to a namespace (the one it was opened in stays its own)."""
    def make() -> socket.socket:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, 0)  # NETLINK_ROUTE
        sock.bind((0, 0))
        sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 8 << 20)
        return sock

    if ns_name is None:
        return make()
    with netns.inside(ns_name):
        return make()


@dataclass
class GraphLab:
    """A realised graph: its namespaces by node, its plan, and what tears it down."""

    run_prefix: str
    graph: Graph
    plan: Plan
    registry: Registry
    namespaces: dict[str, str] = field(default_factory=dict)  # node -> namespace name
    index: dict[tuple[str, str], int] = field(default_factory=dict)  # (node, interface) -> ifindex

    def ns_name(self, node: str) -> str:
        return f"{self.run_prefix}-{node}"

    def teardown(self) -> list[str]:
        return self.registry.teardown()


def build_graph(run_prefix: str, graph: Graph, registry: Registry | None = None,
                provided: Mapping[str, str] | None = None, plan: Plan | None = None) -> GraphLab:
    """Make `graph` (checked) in namespaces named ``<run_prefix>-<node>``; everything made is torn down again
    if any step fails. `provided`: hosts whose namespace exists already, by name (a container an engine made,
    whose namespace is the host's own): their links are wired into it. `plan`: the graph's plan with
    addresses of the caller's (the dumbbell's, lab/topology.py); else the graph's own."""
    graph.check()
    registry = registry or Registry()
    lab = GraphLab(run_prefix, graph, plan or graph.plan(), registry)
    try:
        _namespaces(lab, provided or {})
        _links(lab)
        _configure(lab)
        _routes(lab)
    except BaseException:
        registry.teardown()
        raise
    return lab


def quiet_switches(plan: Plan) -> set[str]:
    """The switches that drop multicast reports: those of every segment of more than QUIET_SEGMENT_HOSTS
    members whose storm would outlast their rules' making (module note)."""
    def storms_longer(members: int, switches: int) -> bool:
        return STORM_AT_QUIET_S * (members / QUIET_SEGMENT_HOSTS) ** 2 > RULE_S * switches

    return {sw for seg in plan.segments
            if len(seg.members) > QUIET_SEGMENT_HOSTS and storms_longer(len(seg.members), len(seg.switches))
            for sw in seg.switches}


def _namespaces(lab: GraphLab, provided: Mapping[str, str]) -> None:
    taken = [n for n in lab.graph.nodes if n not in provided and netns.exists(lab.ns_name(n))]
    if taken:
        raise LabError(f"namespace {lab.ns_name(taken[0])} already exists: a run with this id is active, or run "
                       "`vnetbench clean`")
    quiet = quiet_switches(lab.plan)
    for node, spec in lab.graph.nodes.items():
        name = provided.get(node)
        if name is None:
            name = lab.ns_name(node)
            with atomic():
                netns.create(name)
                lab.registry.add(f"namespace {name}", lambda name=name: netns.remove(name))
        lab.namespaces[node] = name
        with netns.inside(name):
            for key, value in SYSCTLS[spec.kind].items():
                Path("/proc/sys", key).write_text(value)
        if node in quiet:
            netns.apply_ruleset(name, SWITCH_RULESET)


def _links(lab: GraphLab) -> None:
    """Every veth pair, from this namespace, each end made straight inside its node's namespace."""
    plan, graph = lab.plan, lab.graph
    next_index = {n: (BRIDGE_INDEX + 1) for n in graph.nodes}
    ends: list[tuple[str, str, int, str, str, int, int, str]] = []
    iface_of = {(i.node, i.link): i.ifname for ifs in plan.interfaces.values() for i in ifs}
    for link in graph.links.values():
        names = []
        for end in (link.a, link.b):
            ifname = plan.ports[(end, link.name)] if graph.kind(end) == "switch" else iface_of[(end, link.name)]
            lab.index[(end, ifname)] = next_index[end]
            next_index[end] += 1
            names.append((end, ifname, lab.index[(end, ifname)]))
        (a, a_if, a_ix), (b, b_if, b_ix) = names
        ends.append((a, a_if, a_ix, b, b_if, b_ix, link.mtu, link.name))
    root = _socket_in(None)
    try:
        for start in range(0, len(ends), CHUNK):
            chunk = ends[start:start + CHUNK]
            fds: dict[str, int] = {}
            try:
                for a, _, _, b, _, _, _, _ in chunk:
                    for n in (a, b):
                        if n not in fds:
                            fds[n] = os.open(f"{netns.NETNS_DIR}/{lab.namespaces[n]}", os.O_RDONLY | os.O_CLOEXEC)
                requests = Requests("making the topology's links")
                for a, a_if, a_ix, b, b_if, b_ix, mtu, name in chunk:
                    requests.veth(a_if, a_ix, fds[a], b_if, b_ix, fds[b], mtu,
                                  f"link {name} ({a}/{a_if} <-> {b}/{b_if})")
                requests.send(root)
            finally:
                for fd in fds.values():
                    os.close(fd)
    finally:
        root.close()


def _configure(lab: GraphLab) -> None:
    """Each namespace in one batch: its loopback, its bridge and ports (a switch), or its addresses (a host or
    a router), every interface up."""
    plan, graph = lab.plan, lab.graph
    for node, spec in graph.nodes.items():
        requests = Requests(f"configuring {spec.kind} {node} (namespace {lab.namespaces[node]})")
        requests.up(1, "loopback up")
        if spec.kind == "switch":
            requests.bridge(BRIDGE, BRIDGE_INDEX, f"bridge {BRIDGE}")
            for link in graph.links_of(node):
                port = plan.ports[(node, link.name)]
                requests.up(lab.index[(node, port)], f"port {port} into {BRIDGE}", master=BRIDGE_INDEX)
            requests.up(BRIDGE_INDEX, f"bridge {BRIDGE} up")
        else:
            for iface in plan.interfaces[node]:
                ix = lab.index[(node, iface.ifname)]
                v4, v6 = plan.addresses[(node, iface.ifname)]
                len4, len6 = plan.prefixlens[(node, iface.ifname)]
                requests.address(ix, v4, len4, f"address {v4}/{len4} on {iface.ifname}")
                requests.address(ix, v6, len6, f"address {v6}/{len6} on {iface.ifname}")
                requests.up(ix, f"{iface.ifname} up")
        sock = _socket_in(lab.namespaces[node])
        try:
            requests.send(sock)
        finally:
            sock.close()


def _routes(lab: GraphLab) -> None:
    """Routes last: a gateway must be on a link that is up."""
    for node, routes in lab.plan.routes.items():
        if not routes:
            continue
        requests = Requests(f"routes of {lab.graph.kind(node)} {node} (namespace {lab.namespaces[node]})")
        for route in routes:
            requests.route(route, lab.index[(node, route.ifname)], f"route {route.dst} via {route.gateway}")
        sock = _socket_in(lab.namespaces[node])
        try:
            requests.send(sock)
        finally:
            sock.close()
