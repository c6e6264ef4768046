"""A lab's network as a graph: nodes (hosts, switches, routers), links between them, and what follows from
the graph alone: its layer-2 segments, an address plan and the routes.

Pure: nothing here touches the machine. :mod:`vnetbench.lab.graph_lab` realises a graph in namespaces;
:mod:`vnetbench.topology.templates` makes the classic shapes.

Vocabulary, one meaning each:

- a **node** is a place packets are handled: a ``host`` (an endpoint that runs workloads, never forwards),
  a ``switch`` (an L2 bridge, no address) or a ``router`` (an IP forwarder with its own routing table);
- a **link** joins two nodes; its conditions (:class:`vnetbench.impair.model.LinkSpec`) are per direction,
  ``forward`` being from its ``a`` end to its ``b`` end;
- a **segment** is what shares one IP subnet: the links that meet at a group of switches joined by
  switch-to-switch links, or one link between two IP nodes (hosts and routers);
- an **interface** is one IP node's end of one link: ``eth0``, ``eth1``, ... in the order of the graph's links.

Addresses come from the benchmarking ranges only (198.18.0.0/15, RFC 2544; 2001:2::/48, RFC 5180): one IPv4
subnet sized to its segment and one IPv6 /64 per segment. Routes are the shortest paths in router hops
(ties broken by name, so the same graph always gets the same routes), aggregated per next hop.
"""

from __future__ import annotations

import ipaddress
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal

from vnetbench.errors import ScenarioError
from vnetbench.scenario.names import name_problem

NodeKind = Literal["host", "switch", "router"]
NODE_KINDS: tuple[str, ...] = ("host", "switch", "router")
IP_KINDS = ("host", "router")  # the kinds that have addresses

V4_RANGE = ipaddress.ip_network("198.18.0.0/15")
V6_RANGE = ipaddress.ip_network("2001:2::/48")
V4_MAX_PREFIXLEN = 30  # a point-to-point segment: two addresses, its network and broadcast
IFNAME_MAX = 15  # Linux interface names (IFNAMSIZ - 1)
NODE_NAME_MAX = 40  # namespaces are named vnb-<run>-<node>; keep names readable in `ip netns` and tcpdump
IPNet = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class Node:
    name: str
    kind: NodeKind = "host"


@dataclass(frozen=True)
class Link:
    """Two nodes joined; ``spec`` (a LinkSpec, or None for a plain link) reads ``forward`` as a -> b."""

    name: str
    a: str
    b: str
    spec: Any = None
    mtu: int = 1500


@dataclass(frozen=True)
class Interface:
    """One IP node's end of one link."""

    node: str
    link: str
    ifname: str


@dataclass
class Segment:
    """What shares one subnet: ``links`` (all of a switch group's, or one link) and the IP nodes' interfaces
    on it (routers first: the first router's address is the segment's first, the hosts' gateway)."""

    index: int
    links: list[str]
    members: list[Interface]
    switches: list[str] = field(default_factory=list)
    v4: ipaddress.IPv4Network | None = None
    v6: ipaddress.IPv6Network | None = None


@dataclass(frozen=True)
class Route:
    dst: IPNet  # 0.0.0.0/0 or ::/0: the default route
    gateway: str
    ifname: str


@dataclass
class Plan:
    """A graph's segments with their subnets, every interface's addresses and every IP node's routes."""

    segments: list[Segment]
    interfaces: dict[str, list[Interface]]  # IP node -> its interfaces, in link order
    addresses: dict[tuple[str, str], tuple[str, str]]  # (node, ifname) -> (IPv4, IPv6)
    prefixlens: dict[tuple[str, str], tuple[int, int]]  # (node, ifname) -> subnet prefix lengths
    routes: dict[str, list[Route]]  # IP node -> its routes beyond its own segments
    ports: dict[tuple[str, str], str]  # (switch, link) -> the name of its port

    def address(self, node: str, version: int = 4) -> str:
        """A node's first address: what a workload toward it connects to."""
        first = self.interfaces[node][0]
        return self.addresses[(node, first.ifname)][0 if version == 4 else 1]


class Graph:
    """Nodes and links, checked when made: :meth:`problems` lists everything wrong at once."""

    def __init__(self, nodes: Iterable[Node], links: Iterable[Link]):
        self.nodes: dict[str, Node] = {}
        self.links: dict[str, Link] = {}
        self._duplicates: list[str] = []
        self._links_of: dict[str, list[Link]] = {}
        for n in nodes:
            if n.name in self.nodes:
                self._duplicates.append(f"node {n.name!r} is declared twice")
            self.nodes[n.name] = n
        for link in links:
            if link.name in self.links:
                self._duplicates.append(f"link {link.name!r} is declared twice")
            self.links[link.name] = link
            for end in dict.fromkeys((link.a, link.b)):
                self._links_of.setdefault(end, []).append(link)

    def kind(self, node: str) -> str:
        return self.nodes[node].kind

    def links_of(self, node: str) -> list[Link]:
        return self._links_of.get(node, [])

    def hosts(self) -> list[str]:
        return [n for n, node in self.nodes.items() if node.kind == "host"]

    # ------------------------------------------------------------------ checks

    def problems(self) -> list[str]:
        out = list(self._duplicates)
        for name, node in self.nodes.items():
            problem = name_problem(name, "node")
            if problem:
                out.append(problem)
            elif len(name) > NODE_NAME_MAX:
                out.append(f"node {name!r} is {len(name)} characters long: keep node names to {NODE_NAME_MAX}")
            if node.kind not in NODE_KINDS:
                out.append(f"node {name!r} is of kind {node.kind!r}: a node is a host, a switch or a router")
        for name, link in self.links.items():
            problem = name_problem(name, "link")
            if problem:
                out.append(problem)
            for end in (link.a, link.b):
                if end not in self.nodes:
                    out.append(f"link {name!r} joins {end!r}, which is no node of the topology "
                               f"(nodes: {_some(self.nodes)})")
            if link.a == link.b:
                out.append(f"link {name!r} joins {link.a!r} to itself")
        if out:
            return out
        for name in self.nodes:
            if not self.links_of(name):
                out.append(f"node {name!r} has no link: join it to the rest, or remove it")
        out += self._loop_problems()
        if out:
            return out
        segments = self._segments()
        out += self._double_attachment_problems(segments)
        if not out:
            out += self._reachability_problems(segments)
        return out

    def check(self, where: str = "topology") -> "Graph":
        problems = self.problems()
        if problems:
            raise ScenarioError(f"{where}: " + "; ".join(problems))
        return self

    def _loop_problems(self) -> list[str]:
        """Switches joined in a ring flood a broadcast for ever (a Linux bridge runs no spanning tree)."""
        parent: dict[str, str] = {n: n for n, node in self.nodes.items() if node.kind == "switch"}

        def find(x: str) -> str:
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        out = []
        for link in self.links.values():
            if self.kind(link.a) == "switch" and self.kind(link.b) == "switch":
                ra, rb = find(link.a), find(link.b)
                if ra == rb:
                    out.append(f"link {link.name!r} closes a loop of switches ({link.a} ... {link.b}): bridges here "
                               "run no spanning tree, so a broadcast would circle for ever; remove a link of the "
                               "loop or put a router in it")
                else:
                    parent[ra] = rb
        return out

    def _double_attachment_problems(self, segments: list[Segment]) -> list[str]:
        out = []
        for seg in segments:
            seen: dict[str, str] = {}
            for m in seg.members:
                if m.node in seen:
                    out.append(f"{self.kind(m.node)} {m.node!r} has two links into one network (links "
                               f"{seen[m.node]!r} and {m.link!r}): it would have two addresses in one subnet; "
                               "keep one")
                seen[m.node] = m.link
        return out

    def _reachability_problems(self, segments: list[Segment]) -> list[str]:
        hosts = self.hosts()
        if not hosts:
            return ["the topology has no host: workloads run on hosts"]
        reached = self._reachable_from(hosts[0], segments)
        lost = [h for h in hosts if h not in reached]
        if lost:
            return [f"host{'s' if len(lost) > 1 else ''} {_some(lost)} cannot be reached from {hosts[0]!r}: "
                    "a host does not forward, so join them through a switch or a router"]
        return []

    def _reachable_from(self, host: str, segments: list[Segment]) -> set[str]:
        """IP nodes a packet from `host` can reach: hosts are reached but forward nothing."""
        by_node: dict[str, list[Segment]] = {}
        for seg in segments:
            for m in seg.members:
                by_node.setdefault(m.node, []).append(seg)
        seen, todo = {host}, deque([host])
        while todo:
            node = todo.popleft()
            if node != host and self.kind(node) == "host":
                continue
            for seg in by_node[node]:
                for m in seg.members:
                    if m.node not in seen:
                        seen.add(m.node)
                        todo.append(m.node)
        return seen

    # --------------------------------------------------------------- segments

    def _interfaces(self) -> dict[str, list[Interface]]:
        out: dict[str, list[Interface]] = {n: [] for n, node in self.nodes.items() if node.kind in IP_KINDS}
        for link in self.links.values():
            for end in (link.a, link.b):
                if end in out:
                    out[end].append(Interface(end, link.name, f"eth{len(out[end])}"))
        return out

    def _segments(self) -> list[Segment]:
        """Segments in the order a depth-first walk from the first node meets them (so that a subtree's
        segments get neighbouring subnets, and routes toward it fold into few prefixes)."""
        interfaces = self._interfaces()
        end_of = {(i.node, i.link): i for ifs in interfaces.values() for i in ifs}
        # Switch groups: switches joined by switch-to-switch links.
        group: dict[str, int] = {}
        for start in self.nodes:
            if self.kind(start) != "switch" or start in group:
                continue
            group[start] = len(set(group.values()))
            todo = [start]
            while todo:
                sw = todo.pop()
                for link in self.links_of(sw):
                    other = link.b if link.a == sw else link.a
                    if self.kind(other) == "switch" and other not in group:
                        group[other] = group[start]
                        todo.append(other)
        raw: dict[Any, Segment] = {}
        for link in self.links.values():
            ka, kb = self.kind(link.a), self.kind(link.b)
            key: Any = ("group", group[link.a]) if ka == "switch" else ("group", group[link.b]) if kb == "switch" \
                else ("link", link.name)
            seg = raw.setdefault(key, Segment(index=-1, links=[], members=[]))
            seg.links.append(link.name)
            for end in (link.a, link.b):
                if self.kind(end) == "switch":
                    if end not in seg.switches:
                        seg.switches.append(end)
                else:
                    seg.members.append(end_of[(end, link.name)])
        # Order: a depth-first walk over nodes and segments from the first node, so that a subtree's segments
        # are neighbours (and its routes fold).
        segs_of: dict[str, list[Segment]] = {}
        for seg in raw.values():
            for n in [m.node for m in seg.members] + seg.switches:
                segs_of.setdefault(n, []).append(seg)
        ordered: list[Segment] = []
        placed: set[int] = set()
        seen: set[str] = set()
        for start in self.nodes:
            if start in seen:
                continue
            seen.add(start)
            stack = [iter(segs_of.get(start, []))]
            while stack:
                seg = next(stack[-1], None)
                if seg is None:
                    stack.pop()
                    continue
                if id(seg) in placed:
                    continue
                placed.add(id(seg))
                ordered.append(seg)
                for n in [m.node for m in seg.members] + seg.switches:
                    if n not in seen:
                        seen.add(n)
                        stack.append(iter(segs_of.get(n, [])))
        for i, seg in enumerate(ordered):
            seg.index = i
            seg.members.sort(key=lambda m: 0 if self.kind(m.node) == "router" else 1)  # stable: link order kept
        return ordered

    # ------------------------------------------------------------------- plan

    def plan(self) -> Plan:
        """Subnets, addresses and routes. Call on a graph without problems."""
        segments = self._segments()
        _give_subnets(segments)
        interfaces = self._interfaces()
        addresses, prefixlens = {}, {}
        for seg in segments:
            for number, m in enumerate(seg.members, start=1):
                addresses[(m.node, m.ifname)] = (str(seg.v4[number]), str(seg.v6[number]))  # type: ignore[index]
                prefixlens[(m.node, m.ifname)] = (seg.v4.prefixlen, seg.v6.prefixlen)  # type: ignore[union-attr]
        plan = Plan(segments=segments, interfaces=interfaces, addresses=addresses, prefixlens=prefixlens,
                    routes={}, ports=self._ports())
        plan.routes = _routes(self, plan)
        return plan

    def path(self, plan: Plan, src: str, dst: str, version: int = 4) -> list[tuple[str, bool]]:
        """The links a packet from `src` to `dst`'s first address crosses, in order, each with whether it crosses
        it forward (from its a end): IP hop by IP hop as the plan's routes send it (the longest prefix that
        holds the address), and within a segment along its switches (a tree: one way only)."""
        target = ipaddress.ip_address(plan.address(dst, version))
        at = 0 if version == 4 else 1
        owner = {addrs[at]: key for key, addrs in plan.addresses.items()}
        segment_of = {(m.node, m.ifname): seg for seg in plan.segments for m in seg.members}
        dst_node, dst_ifname = owner[str(target)]
        out: list[tuple[str, bool]] = []
        node = src
        for _ in range(len(self.nodes)):
            if node == dst_node:
                return out
            if node != src and self.kind(node) != "router":
                break  # a host forwards nothing
            here = [i for i in plan.interfaces[node]
                    if target in (segment_of[(node, i.ifname)].v4 if version == 4 else segment_of[(node, i.ifname)].v6)]
            if here:
                leave, nxt, arrive = here[0], dst_node, dst_ifname
            else:
                routes = [r for r in plan.routes.get(node, []) if r.dst.version == version and target in r.dst]
                if not routes:
                    break
                best = max(routes, key=lambda r: r.dst.prefixlen)
                nxt, arrive = owner[best.gateway]
                leave = next(i for i in plan.interfaces[node] if i.ifname == best.ifname)
            into = next(i for i in plan.interfaces[nxt] if i.ifname == arrive)
            out += self._segment_path(node, leave.link, nxt, into.link)
            node = nxt
        raise ScenarioError(f"topology: no route from {src!r} to {dst!r} ({target}) in the plan")

    def _segment_path(self, src: str, first: str, dst: str, last: str) -> list[tuple[str, bool]]:
        """Links from IP node `src` (leaving on link `first`) to IP node `dst` (arriving on link `last`) within
        one segment: the link itself, or the switches' tree between the two links' switches."""
        if first == last:
            return [(first, self.links[first].a == src)]
        link_in, link_out = self.links[first], self.links[last]
        start = link_in.b if link_in.a == src else link_in.a
        end = link_out.b if link_out.a == dst else link_out.a
        previous: dict[str, tuple[str, str] | None] = {start: None}  # switch -> (link, switch) it was reached by
        todo = deque([start])
        while todo and end not in previous:
            sw = todo.popleft()
            for link in self.links_of(sw):
                other = link.b if link.a == sw else link.a
                if self.kind(other) == "switch" and other not in previous:
                    previous[other] = (link.name, sw)
                    todo.append(other)
        between: list[tuple[str, bool]] = []
        sw = end
        while previous.get(sw) is not None:
            name, before = previous[sw]  # type: ignore[misc]
            between.append((name, self.links[name].a == before))
            sw = before
        return [(first, link_in.a == src), *reversed(between), (last, link_out.a == end)]

    def _ports(self) -> dict[tuple[str, str], str]:
        """Each switch's port names: the node at the other end when that name fits and is unique there,
        else ``p<n>`` (a switch's ports are its links, in the graph's order)."""
        out = {}
        for sw, node in self.nodes.items():
            if node.kind != "switch":
                continue
            links = self.links_of(sw)
            others = [link.b if link.a == sw else link.a for link in links]
            for n, (link, other) in enumerate(zip(links, others)):
                fits = len(other) <= IFNAME_MAX and others.count(other) == 1 and other not in ("br0", "lo")
                out[(sw, link.name)] = other if fits else f"p{n}"
        return out


def _some(names: Iterable[str], most: int = 6) -> str:
    names = list(names)
    shown = ", ".join(repr(n) for n in names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _give_subnets(segments: list[Segment]) -> None:
    """IPv4: the smallest subnet that holds a segment's members (big ones first, so each is aligned), from
    198.18.0.0/15 upward; IPv6: the i-th segment's /64 is 2001:2:0:i::/64."""
    if len(segments) > 2 ** 16:
        raise ScenarioError(f"the topology has {len(segments)} segments: 2001:2::/48 holds 65,536 /64 subnets")
    sizes = [min(V4_MAX_PREFIXLEN, 32 - math.ceil(math.log2(len(s.members) + 2))) for s in segments]
    cursor = int(V4_RANGE.network_address)
    end = int(V4_RANGE.broadcast_address) + 1
    for seg, prefixlen in sorted(zip(segments, sizes), key=lambda sp: (sp[1], sp[0].index)):
        block = 2 ** (32 - prefixlen)
        if cursor + block > end:
            raise ScenarioError(f"the topology needs more IPv4 addresses than 198.18.0.0/15 holds "
                                f"({len(segments)} segments)")
        seg.v4 = ipaddress.IPv4Network((cursor, prefixlen))
        cursor += block
    base = int(V6_RANGE.network_address)
    for seg in segments:
        seg.v6 = ipaddress.IPv6Network((base + (seg.index << 64), 64))


def _routes(graph: Graph, plan: Plan) -> dict[str, list[Route]]:
    """Every IP node's routes to the segments it is not on: shortest paths in router hops.

    Routers forward, hosts do not: a path goes from the source to a router on one of its segments, then
    router to router, to a router on the destination's segment. Breadth-first from each router over the
    router graph gives each router's first hop toward each other router; a destination segment is then
    reached through its nearest router (ties: the lower name). Routes to one next hop fold into as few
    prefixes as cover them exactly; a node whose every route has one next hop gets a default route."""
    seg_of_iface = {(m.node, m.ifname): seg for seg in plan.segments for m in seg.members}
    routers = sorted(n for n in plan.interfaces if graph.kind(n) == "router")
    segments_of = {n: [seg_of_iface[(n, i.ifname)] for i in ifs] for n, ifs in plan.interfaces.items()}
    routers_on = {seg.index: sorted(m.node for m in seg.members if graph.kind(m.node) == "router")
                  for seg in plan.segments}
    member_on = {(seg.index, m.node): m for seg in plan.segments for m in seg.members}

    # hop[r][t] = (the first router after r toward t, the segment between them), dist[r][t] in router hops
    dist: dict[str, dict[str, int]] = {}
    hop: dict[str, dict[str, tuple[str, Segment]]] = {}
    for r in routers:
        dist[r], hop[r] = {r: 0}, {}
        todo = deque([r])
        while todo:
            x = todo.popleft()
            for seg in segments_of[x]:
                for y in routers_on[seg.index]:
                    if y not in dist[r]:
                        dist[r][y] = dist[r][x] + 1
                        hop[r][y] = hop[r][x] if x != r else (y, seg)
                        todo.append(y)

    routes: dict[str, list[Route]] = {}
    for node, own in segments_of.items():
        gateways = routers_on[own[0].index]
        if graph.kind(node) == "host" and len(own) == 1 and len(gateways) == 1:
            # The common host: one interface, one router beside it. Everything else is through that router.
            gw = member_on[(own[0].index, gateways[0])]
            ifname = plan.interfaces[node][0].ifname
            beyond = any(routers_on[s.index] for s in plan.segments if s is not own[0])
            routes[node] = [Route(ipaddress.ip_network(default), plan.addresses[(gw.node, gw.ifname)][v], ifname)
                            for v, default in ((0, "0.0.0.0/0"), (1, "::/0"))] if beyond else []
            continue
        routes[node] = _node_routes(graph, plan, node, own, routers_on, member_on, seg_of_iface, dist, hop)
    return routes


def _node_routes(graph: Graph, plan: Plan, node: str, own: list[Segment], routers_on: dict[int, list[str]],
                 member_on: dict[tuple[int, str], Interface], seg_of_iface: dict[tuple[str, str], Segment],
                 dist: dict[str, dict[str, int]], hop: dict[str, dict[str, tuple[str, Segment]]]) -> list[Route]:
    own_ids = {s.index for s in own}
    # Where this node can hand a packet: itself (a router), or a router on one of its own segments.
    starts = [(node, None)] if graph.kind(node) == "router" else \
        [(g, seg) for seg in own for g in routers_on[seg.index]]
    by_next: dict[tuple[str, str], list[IPNet]] = {}
    for seg in plan.segments:
        if seg.index in own_ids or not routers_on[seg.index]:
            continue
        best: tuple[int, str, str, Segment] | None = None
        for g, via in starts:
            for target in routers_on[seg.index]:
                d = dist[g].get(target)
                if d is None:
                    continue
                nxt, on = hop[g][target] if via is None else (g, via)
                if best is None or (d, target, nxt) < best[:3]:
                    best = (d, target, nxt, on)
        if best is None:
            continue
        _, _, nxt, on = best
        gw = member_on[(on.index, nxt)]
        mine = next(i for i in plan.interfaces[node] if seg_of_iface[(node, i.ifname)] is on)
        v4, v6 = plan.addresses[(gw.node, gw.ifname)]
        by_next.setdefault((v4, mine.ifname), []).append(seg.v4)  # type: ignore[arg-type]
        by_next.setdefault((v6, mine.ifname), []).append(seg.v6)  # type: ignore[arg-type]
    out: list[Route] = []
    for (gateway, ifname), nets in sorted(by_next.items()):
        out += [Route(net, gateway, ifname) for net in _fold(nets)]
    return out


def _fold(nets: list[IPNet]) -> list[IPNet]:
    """The fewest prefixes covering exactly `nets` (of one IP version): ipaddress.collapse_addresses' result,
    by merging integer ranges first (collapse_addresses takes 20 s for a 1,000-node tree's routes)."""
    ranges = sorted((int(n.network_address), int(n.broadcast_address)) for n in nets)
    merged: list[list[int]] = []
    for first, last in ranges:
        if merged and first <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], last)
        else:
            merged.append([first, last])
    make = ipaddress.IPv4Address if nets[0].version == 4 else ipaddress.IPv6Address
    return [net for first, last in merged for net in ipaddress.summarize_address_range(make(first), make(last))]
