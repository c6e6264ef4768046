"""Topology graphs: checks, the classic shapes, the address plan and routes (forwarding simulated hop by hop
from the routes alone, against shortest paths counted independently)."""

from __future__ import annotations

import ipaddress
import random
import struct
from collections import deque

import pytest

from vnetbench.errors import ScenarioError
from vnetbench.lab.graph_lab import _answers
from vnetbench.topology import templates as T
from vnetbench.topology.graph import V4_RANGE, V6_RANGE, Graph, Link, Node, Plan, _fold


def test_dumbbell_has_todays_names():
    g = T.dumbbell(senders=3).check()
    assert sorted(g.links) == ["bottleneck", "s1", "s2", "s3"]
    assert (g.links["bottleneck"].a, g.links["bottleneck"].b) == ("sw", "r")  # forward: toward the receiver
    assert all(g.links[f"s{i}"].a == f"s{i}" for i in (1, 2, 3))
    assert g.kind("sw") == "switch" and sorted(g.hosts()) == ["r", "s1", "s2", "s3"]


@pytest.mark.parametrize("shape, kw, nodes, links", [
    ("star", dict(leaves=5), 7, 6),
    ("star", dict(leaves=5, server=False), 6, 5),
    ("linear", dict(hops=1), 2, 1),
    ("linear", dict(hops=4), 5, 4),
    ("parking-lot", dict(bottlenecks=3), 4 + 2 + 6, 3 + 2 + 6),
    ("tree", dict(depth=2, fanout=3), 1 + 3 + 9, 12),
    ("tree", dict(depth=3, fanout=10, node="router"), 1111, 1110),
])
def test_templates_make_valid_graphs(shape, kw, nodes, links):
    g = T.TEMPLATES[shape](**kw)
    assert g.problems() == []
    assert (len(g.nodes), len(g.links)) == (nodes, links)


@pytest.mark.parametrize("call, says", [
    (lambda: T.linear(hops=0), "hops = 0"),
    (lambda: T.star(leaves=3, node="hub"), "node = 'hub'"),
    (lambda: T.tree(depth=5, fanout=20), "make 3,368,421 nodes"),
    (lambda: T.tree(depth=True), "depth = True"),
])
def test_templates_refuse_odd_parameters(call, says):
    with pytest.raises(ScenarioError, match=says):
        call()


def _problems(nodes, links):
    return "; ".join(Graph([Node(*n) for n in nodes], [Link(*lk) for lk in links]).problems())


def test_problems_are_named():
    assert "link 'x' joins 'c', which is no node" in _problems([("a",), ("b",)], [("x", "a", "c")])
    assert "joins 'a' to itself" in _problems([("a",), ("b",)], [("x", "a", "a"), ("y", "a", "b")])
    assert "node 'a' is declared twice" in _problems([("a",), ("a",), ("b",)], [("x", "a", "b")])
    assert "node '../x' is not a name" in _problems([("../x",), ("b",)], [("x", "../x", "b")])
    assert "node 'c' has no link" in _problems([("a",), ("b",), ("c",)], [("x", "a", "b")])
    loop = _problems([("a",), ("s1", "switch"), ("s2", "switch"), ("s3", "switch")],
                     [("1", "a", "s1"), ("2", "s1", "s2"), ("3", "s2", "s3"), ("4", "s3", "s1")])
    assert "link '4' closes a loop of switches" in loop
    assert "two links into one network" in _problems([("a",), ("b",), ("s1", "switch"), ("s2", "switch")],
                                                      [("1", "a", "s1"), ("2", "s1", "s2"), ("3", "a", "s2"),
                                                       ("4", "b", "s1")])
    assert "'c' cannot be reached from 'a'" in _problems([("a",), ("b",), ("c",)], [("1", "a", "b"), ("2", "b", "c")])
    assert "no host" in _problems([("r1", "router"), ("r2", "router")], [("1", "r1", "r2")])
    with pytest.raises(ScenarioError, match="topology: link 'x' joins 'c'"):
        Graph([Node("a")], [Link("x", "a", "c")]).check()


def test_addresses_are_in_the_benchmarking_ranges_unique_and_in_disjoint_subnets():
    plan = T.parking_lot(bottlenecks=4).plan()
    v4 = [ipaddress.ip_address(a) for a, _ in plan.addresses.values()]
    v6 = [ipaddress.ip_address(b) for _, b in plan.addresses.values()]
    assert all(a in V4_RANGE for a in v4) and all(b in V6_RANGE for b in v6)
    assert len(set(v4)) == len(v4) and len(set(v6)) == len(v6)
    nets = [s.v4 for s in plan.segments]
    assert all(not a.overlaps(b) for i, a in enumerate(nets) for b in nets[i + 1:])
    for seg in plan.segments:  # routers first: the gateway is the segment's first address
        routers = [m for m in seg.members if m.node.startswith("x")]
        if routers:
            assert plan.addresses[(routers[0].node, routers[0].ifname)][0] == str(seg.v4[1])


def test_a_big_switch_segment_gets_a_subnet_that_holds_it():
    plan = T.star(leaves=1000).plan()
    (seg,) = plan.segments
    assert seg.v4.prefixlen == 22 and len(seg.members) == 1001
    assert plan.routes == {n: [] for n in plan.interfaces}  # one subnet: nothing to route


def _owner(plan: Plan) -> dict[str, tuple[str, int]]:
    return {addr: (node, seg) for (node, ifname), pair in plan.addresses.items() for addr in pair
            for seg in [next(s.index for s in plan.segments for m in s.members
                             if (m.node, m.ifname) == (node, ifname))]}


def _forward(graph: Graph, plan: Plan, src: str, dst_addr: str) -> int | None:
    """Routers a packet from `src` to `dst_addr` crosses, using only the plan's addresses and routes; None if
    it is dropped or loops."""
    owner = _owner(plan)
    dst = ipaddress.ip_address(dst_addr)
    node, routers = src, 0
    for _ in range(64):
        own = {owner[plan.addresses[(node, i.ifname)][0]][1] for i in plan.interfaces[node]}
        if owner[dst_addr][1] in own:
            return routers
        if node != src and graph.kind(node) != "router":
            return None  # a host does not forward
        matches = [r for r in plan.routes[node] if dst in r.dst]
        if not matches:
            return None
        best = max(matches, key=lambda r: r.dst.prefixlen)
        node = owner[best.gateway][0]
        routers += 1
    return None


def _shortest(graph: Graph, plan: Plan, src: str, dst_addr: str) -> int:
    """Routers on the shortest path from `src` to the segment of `dst_addr` (a multi-homed host's address is
    reached on its own segment), counted on the graph of segments, independently of the routes."""
    target = _owner(plan)[dst_addr][1]
    segs: dict[str, list] = {}
    for seg in plan.segments:
        for m in seg.members:
            segs.setdefault(m.node, []).append(seg)
    dist, todo = {src: 0}, deque([src])
    best = None
    while todo:
        n = todo.popleft()
        if any(seg.index == target for seg in segs[n]):
            best = dist[n] if best is None else min(best, dist[n])
        for seg in segs[n]:
            for m in seg.members:
                if m.node not in dist and graph.kind(m.node) == "router":  # only routers carry it further
                    dist[m.node] = dist[n] + 1
                    todo.append(m.node)
    return best


def _random_graph(rng: random.Random) -> Graph:
    """A tree of routers and switches (a random parent for each), with extra router-to-router links
    (loops of routers are fine), hosts hung on forwarders."""
    nodes = [Node("f0", "router")]
    links = []
    for i in range(1, rng.randint(2, 12)):
        kind = rng.choice(["router", "router", "switch"])
        parent = rng.choice(nodes[:i])
        nodes.append(Node(f"f{i}", kind))
        links.append(Link(f"l{i}", f"f{i}", parent.name))
    routers = [n.name for n in nodes if n.kind == "router"]
    for j in range(rng.randint(0, 3)):
        a, b = rng.sample(routers, 2) if len(routers) > 1 else (None, None)
        if a:
            links.append(Link(f"e{j}", a, b))
    forwarders = [n.name for n in nodes]
    for h in range(rng.randint(2, 8)):
        nodes.append(Node(f"h{h}"))
        links.append(Link(f"a{h}", f"h{h}", rng.choice(forwarders)))
        if rng.random() < 0.25:  # multi-homed: a second link, to another forwarder (a host never forwards)
            links.append(Link(f"m{h}", f"h{h}", rng.choice(forwarders)))
    return Graph(nodes, links)


def _pairs(seed: int, graphs: int):
    """(graph, plan, source, destination, IP version) over `graphs` random graphs without problems (a host twice
    in one switch group cannot happen there; loops are of routers only), every ordered pair of their hosts."""
    rng = random.Random(seed)
    for _ in range(graphs):
        g = _random_graph(rng)
        if g.problems():
            continue
        plan = g.plan()
        for src in g.hosts():
            for dst in g.hosts():
                if src != dst:
                    for version in (4, 6):
                        yield g, plan, src, dst, version


def test_routes_deliver_every_packet_over_a_shortest_path():
    checked = 0
    for g, plan, src, dst, version in _pairs(7, 150):
        addr = plan.address(dst, version)
        assert _forward(g, plan, src, addr) == _shortest(g, plan, src, addr), (src, dst, version, g.links)
        checked += 1
    assert checked > 1000


def test_a_path_is_a_walk_of_links_that_crosses_the_routers_forwarding_counts():
    """Graph.path: consecutive links share a node, each crossed from the node the walk is at (forward = from the
    a end), from the source to the destination, through as many routers as forwarding hop by hop takes."""
    checked = 0
    for g, plan, src, dst, version in _pairs(11, 120):
        path = g.path(plan, src, dst, version)
        at, routers = src, 0
        for name, forward in path:
            link = g.links[name]
            assert (link.a if forward else link.b) == at, (src, dst, path)
            at = link.b if forward else link.a
            routers += g.kind(at) == "router"
        assert at == dst, (src, dst, path)
        assert routers == _forward(g, plan, src, plan.address(dst, version)), (src, dst, path)
        checked += 1
    assert checked > 1000


def test_routes_fold_and_hosts_take_a_default_route():
    plan = T.tree(depth=3, fanout=4, node="router").plan()
    assert all(len(plan.routes[h]) == 2 and plan.routes[h][0].dst.prefixlen == 0 for h in plan.routes
               if h.startswith("h"))
    # The root reaches each subtree through few prefixes, not one per segment.
    assert len(plan.routes["x1"]) < len(plan.segments) / 2


def test_fold_is_collapse_addresses():
    rng = random.Random(3)
    subnets = list(ipaddress.ip_network("198.18.0.0/22").subnets(new_prefix=30))
    for _ in range(200):
        nets = rng.sample(subnets, rng.randint(1, 120))
        assert _fold(nets) == list(ipaddress.collapse_addresses(nets))


def test_switch_ports_are_named_after_their_neighbour_when_it_fits():
    g = Graph([Node("a"), Node("a-very-long-host-name"), Node("sw", "switch")],
              [Link("1", "a", "sw"), Link("2", "a-very-long-host-name", "sw")])
    assert g.plan().ports == {("sw", "1"): "a", ("sw", "2"): "p1"}


def test_netlink_answers_are_read_with_their_errors():
    ok = struct.pack("=IHHII", 36, 2, 0, 1, 0) + struct.pack("=i", 0) + bytes(16)
    refused = struct.pack("=IHHII", 36, 2, 0, 2, 0) + struct.pack("=i", -17) + bytes(16)
    other = struct.pack("=IHHII", 20, 16, 0, 3, 0) + bytes(4)
    assert list(_answers(ok + other + refused)) == [(1, 0), (2, 17)]


def test_a_dumbbell_of_several_environments_shares_one_switch_each_with_its_bottleneck():
    g = T.dumbbell(groups=[("b-", 1), ("c-", 2)]).check()
    assert list(g.nodes)[:2] == ["b-r", "sw"]
    assert sorted(g.links) == ["b-bottleneck", "b-s1", "c-bottleneck", "c-s1", "c-s2"]
    assert (g.links["c-bottleneck"].a, g.links["c-bottleneck"].b) == ("sw", "c-r")
    plan = g.plan()
    assert len(plan.segments) == 1  # one network: every endpoint reaches every other on the switch
    assert plan.ports[("sw", "c-bottleneck")] == "c-r" and plan.ports[("sw", "b-s1")] == "b-s1"
    with pytest.raises(ScenarioError, match="senders = 65"):
        T.dumbbell(senders=65)  # a scenario's dumbbell has 1 to 64 senders


def test_the_dumbbell_lab_keeps_the_underlay_addresses():
    from vnetbench.lab.environments.base import Endpoint, underlay_addresses
    from vnetbench.lab.topology import _underlay_plan

    g = T.dumbbell(senders=2).check()
    endpoints = {name: Endpoint(name=name, number=n, cpu=None, mtu=1500) for n, name in
                 enumerate(["r", "s1", "s2"], start=1)}
    plan = _underlay_plan(g, endpoints)
    assert plan.address("r") == "198.18.0.2" and plan.address("s2", 6) == "2001:2::3"
    assert all(plan.addresses[(n, "eth0")] == underlay_addresses(e.number) for n, e in endpoints.items())
    assert set(plan.prefixlens.values()) == {(16, 64)} and plan.routes == {"r": [], "s1": [], "s2": []}
    assert str(plan.segments[0].v4) == "198.18.0.0/16"


def test_switches_drop_multicast_reports_by_the_size_of_their_network_not_their_ports():
    from vnetbench.lab.graph_lab import QUIET_SEGMENT_HOSTS, quiet_switches
    assert QUIET_SEGMENT_HOSTS == 64
    assert quiet_switches(T.tree(depth=2, fanout=3).plan()) == set()
    # 121 hosts under 12 switches of at most 12 ports each: one network, every switch quiet (a storm of about
    # 150 ms against 12 rules).
    assert quiet_switches(T.tree(depth=2, fanout=11).plan()) == {f"x{i}" for i in range(1, 13)}
    assert len(quiet_switches(T.tree(depth=3, fanout=10).plan())) == 111  # 1,000 hosts: 10 s of storm
    # 81 hosts storm for about 66 ms: less than 10 rules take (2x9), or 40 (4x3).
    assert quiet_switches(T.tree(depth=2, fanout=9).plan()) == set()
    assert quiet_switches(T.tree(depth=4, fanout=3).plan()) == set()
    assert quiet_switches(T.tree(depth=2, fanout=9, node="router").plan()) == set()
    # A star's centre and its leaves: 64 hosts are quiet enough, 65 are not.
    assert quiet_switches(T.star(leaves=63).plan()) == set()
    assert quiet_switches(T.star(leaves=64).plan()) == {"x1"}
