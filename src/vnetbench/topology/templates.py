"""The classic shapes, each a function from a few numbers to the graph a user could write out by hand.

Names are chosen so that a shape reads the same in every report: hosts ``h<i>`` (or a role: ``r``, ``s<i>``,
``src``, ``dst``), forwarding nodes ``x<i>``, links named after what they lead to. Every link's ``forward`` is
the way data goes in the shape's usual study (toward the receiver, the server, the root, the far end).
"""

from __future__ import annotations

from typing import Callable

from vnetbench.errors import ScenarioError
from vnetbench.topology.graph import Graph, Link, Node

FORWARDERS = ("switch", "router")
MAX_NODES = 20_000  # a bound checked before anything is made: 20,000 namespaces is far past what a laptop holds


def _forwarder(kind: str, template: str) -> str:
    if kind not in FORWARDERS:
        raise ScenarioError(f"topology {template}: node = {kind!r}; the forwarding nodes are a \"switch\" or a "
                            "\"router\"")
    return kind


def _count(value: int, key: str, template: str, least: int = 1, most: int = MAX_NODES) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
        raise ScenarioError(f"topology {template}: {key} = {value!r}; give a whole number from {least} to {most}")
    return value


def dumbbell(senders: int = 1, groups: list[tuple[str, int]] | None = None) -> Graph:
    """Senders behind a switch whose port toward the receiver is the bottleneck (the lab of every seed)::

        s1 ──┐
        ...  ├── sw ── bottleneck ──> r
        sN ──┘

    Links ``s1``..``sN`` (sender -> switch) and ``bottleneck`` (switch -> receiver). With ``groups`` (name
    prefix, senders), several such receivers and senders share the one switch, each group's names prefixed
    (``c-r``, ``c-s1``, link ``c-bottleneck``): the lab of a run over several environments (lab/topology.py)."""
    if groups is None:
        groups = [("", _count(senders, "senders", "dumbbell", most=64))]  # a scenario's dumbbell: 1 to 64
    nodes, links = [], []
    for prefix, count in groups:
        n = _count(count, "senders", "dumbbell", least=0, most=MAX_NODES - 2)
        nodes += [Node(f"{prefix}r")] + [Node(f"{prefix}s{i}") for i in range(1, n + 1)]
        links += [Link(f"{prefix}s{i}", f"{prefix}s{i}", "sw") for i in range(1, n + 1)]
        links.append(Link(f"{prefix}bottleneck", "sw", f"{prefix}r"))
    nodes.insert(1, Node("sw", "switch"))  # r, sw, s1, ...: the order the graph has always listed them in
    return Graph(nodes, links)


def star(leaves: int = 4, node: str = "switch", server: bool = True) -> Graph:
    """A centre ``x1`` and ``leaves`` hosts ``h1``..``hN``, each on a link of its own (named like it, leaf ->
    centre), so each can sit at its own distance; with ``server``, a host ``srv`` on link ``srv`` (centre ->
    server): seed 004's sites around one server::

        h1 ──┐
        h2 ──┼── x1 ──> srv
        hN ──┘
    """
    n = _count(leaves, "leaves", "star", most=MAX_NODES - 2)
    kind = _forwarder(node, "star")
    nodes = [Node("x1", kind)] + [Node(f"h{i}") for i in range(1, n + 1)]
    links = [Link(f"h{i}", f"h{i}", "x1") for i in range(1, n + 1)]
    if server:
        nodes.append(Node("srv"))
        links.append(Link("srv", "x1", "srv"))
    return Graph(nodes, links)


def linear(hops: int = 2, node: str = "router") -> Graph:
    """Two hosts ``h1`` and ``h2`` joined by a chain of ``hops`` links ``l1``..``lN`` (h1 -> h2) through
    ``hops - 1`` forwarding nodes ``x1``..: Mininet's linear shape, one host at each end::

        h1 ── l1 ── x1 ── l2 ── x2 ── ... ── lN ── h2
    """
    n = _count(hops, "hops", "linear", most=MAX_NODES - 2)
    kind = _forwarder(node, "linear")
    chain = ["h1"] + [f"x{i}" for i in range(1, n)] + ["h2"]
    nodes = [Node("h1"), Node("h2")] + [Node(f"x{i}", kind) for i in range(1, n)]
    links = [Link(f"l{i}", chain[i - 1], chain[i]) for i in range(1, n + 1)]
    return Graph(nodes, links)


def parking_lot(bottlenecks: int = 2, node: str = "router") -> Graph:
    """``bottlenecks`` links ``b1``..``bK`` in series between forwarding nodes ``x0``..``xK``; one long flow from
    ``src`` (at x0) to ``dst`` (at xK) crosses them all, and cross flow i from ``c<i>s`` (at x<i-1>) to
    ``c<i>r`` (at x<i>) crosses b<i> only (the congestion-control papers' parking lot)::

        src ── x0 ══ b1 ══ x1 ══ b2 ══ x2 ── dst
               │          │ │          │
              c1s       c1r c2s       c2r

    Each host's link is named like the host (host -> its node for senders, node -> host for receivers)."""
    k = _count(bottlenecks, "bottlenecks", "parking-lot", most=1000)
    kind = _forwarder(node, "parking-lot")
    nodes = [Node(f"x{i}", kind) for i in range(k + 1)] + [Node("src"), Node("dst")]
    links = [Link("src", "src", "x0")]
    links += [Link(f"b{i}", f"x{i - 1}", f"x{i}") for i in range(1, k + 1)]
    links.append(Link("dst", f"x{k}", "dst"))
    for i in range(1, k + 1):
        nodes += [Node(f"c{i}s"), Node(f"c{i}r")]
        links += [Link(f"c{i}s", f"c{i}s", f"x{i - 1}"), Link(f"c{i}r", f"x{i}", f"c{i}r")]
    return Graph(nodes, links)


def tree(depth: int = 2, fanout: int = 2, node: str = "switch") -> Graph:
    """A tree of forwarding nodes ``depth`` levels deep, each with ``fanout`` children, hosts as the leaves
    (Mininet's tree): ``x1`` is the root, ``x2``.. the next levels breadth-first, ``h1``..``hN`` the hosts;
    each link is named like its child and goes child -> parent (toward the root)::

                 x1
               /    \\
             x2      x3
            /  \\    /  \\
           h1  h2  h3  h4
    """
    d = _count(depth, "depth", "tree", most=20)
    f = _count(fanout, "fanout", "tree", most=MAX_NODES)
    kind = _forwarder(node, "tree")
    total = sum(f ** level for level in range(d + 1))
    if total > MAX_NODES:
        raise ScenarioError(f"topology tree: depth = {d} and fanout = {f} make {total:,} nodes; the most a lab "
                            f"may have is {MAX_NODES:,}")
    nodes, links = [Node("x1", kind)], []
    level, forwarders, hosts = ["x1"], 1, 0
    for depth_now in range(1, d + 1):
        below = []
        for parent in level:
            for _ in range(f):
                if depth_now == d:
                    hosts += 1
                    child = f"h{hosts}"
                    nodes.append(Node(child))
                else:
                    forwarders += 1
                    child = f"x{forwarders}"
                    nodes.append(Node(child, kind))
                links.append(Link(child, child, parent))
                below.append(child)
        level = below
    return Graph(nodes, links)


TEMPLATES: dict[str, Callable[..., Graph]] = {
    "dumbbell": dumbbell, "star": star, "linear": linear, "parking-lot": parking_lot, "tree": tree,
}
