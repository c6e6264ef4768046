"""A containerlab topology file (``*.clab.yml``) as a graph: what users who have one already declared.

::

    name: sites                                  [topology]
    topology:                                    containerlab = "sites.clab.yml"
      nodes:                                     routers = ["r1"]
        a:  {kind: linux, image: alpine}
        r1: {kind: linux, image: frr}            a ── a-r1 ── r1 ── r1-br ── br ──┬── b
        br: {kind: bridge}                                                        └── c
        b:  {kind: linux}
        c:  {kind: linux}
      links:
        - endpoints: ["a:eth1", "r1:eth1"]
        - endpoints: ["r1:eth2", "br:r1"]
        - endpoints: ["br:b", "b:eth1"]
        - endpoints: ["br:c", "c:eth1"]

containerlab's ``linux`` nodes are hosts (or routers, those the scenario names in ``routers``: a container
running a routing daemon forwards); ``bridge`` and ``ovs-bridge`` nodes are switches. A node of any other
kind runs a network operating system's image, which vnetbench does not run: it is refused with the reason.
Links are the ``endpoints`` pairs (the short ``"node:interface"`` form and the long ``{node, interface}``
form), named ``A-B`` after their nodes (``A-B-2``, ... for a second link between the same two), with
``forward`` from the first endpoint. Interface names, images, addresses and everything else in the file are
the containerlab lab's: vnetbench names, addresses and routes its own. Endpoints on containerlab's host
(``host:...``) or management network (``mgmt-net:...``) have no counterpart in a lab of namespaces and are
refused.

The file is read as root the way a rate trace is (vnetbench.userfiles: a regular file within a size limit,
read within a time), parsed with PyYAML's safe loader, and parsed once while it stays the same.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from vnetbench import limits, units
from vnetbench.topology.graph import Graph, Link, Node
from vnetbench.userfiles import Kind, read_user_file

CONTAINERLAB = Kind("containerlab file", "give a containerlab topology file (*.clab.yml)",
                    limits.TOPOLOGY_FILE_BYTES, too_big="a lab of that size has more nodes than a machine holds")
HOST_KINDS = ("linux",)
SWITCH_KINDS = ("bridge", "ovs-bridge")
NOT_IN_A_LAB = ("host", "mgmt-net", "macvlan")  # containerlab's special endpoints: the machine, its management
_parsed: dict[tuple[str, tuple[int, ...]], tuple[dict[str, str], list[tuple[str, str, str]]]] = {}
_KEPT = 8


def read_graph(path: str | Path, routers: list[str] | tuple[str, ...] = (), mtu: int = 1500) -> Graph:
    """The graph of the containerlab file at `path`, with the linux nodes named in `routers` as routers.
    ValueError names the file and what in it vnetbench cannot run."""
    kinds, links = _read(path)
    shown = units.brief(str(path))
    unknown = [r for r in routers if r not in kinds]
    if unknown:
        raise ValueError(f"routers = {units.brief(list(routers))}: {shown} has no node {unknown[0]!r}")
    not_linux = [r for r in routers if kinds[r] not in HOST_KINDS]
    if not_linux:
        raise ValueError(f"routers = {units.brief(list(routers))}: {not_linux[0]!r} is a {kinds[not_linux[0]]} in "
                         f"{shown}; a router is one of its linux nodes")
    nodes = [Node(name, "switch" if kind in SWITCH_KINDS else "router" if name in routers else "host")
             for name, kind in kinds.items()]
    return Graph(nodes, [Link(name, a, b, mtu=mtu) for name, a, b in links])


def _read(path: str | Path) -> tuple[dict[str, str], list[tuple[str, str, str]]]:
    data, identity, shown = read_user_file(path, CONTAINERLAB)
    key = (os.path.realpath(path), identity)
    if key not in _parsed:
        if len(_parsed) >= _KEPT:
            _parsed.pop(next(iter(_parsed)))
        _parsed[key] = parse(data, shown)
    return _parsed[key]


def parse(data: bytes, shown: str) -> tuple[dict[str, str], list[tuple[str, str, str]]]:
    """({node: kind}, [(link name, a, b)]) of a containerlab file's bytes; ValueError says what is wrong where."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # plain data only; libyaml's where there is one
    try:
        # Aliases are refused before anything is built: a few hundred bytes of nested aliases unfold into
        # billions of nodes for whoever walks them
        for event in yaml.parse(data, Loader=loader):
            if isinstance(event, yaml.AliasEvent):
                raise ValueError(f"containerlab file {shown} line {event.start_mark.line + 1}: an alias (*name); "
                                 "write the value out")
        doc = yaml.load(data, Loader=loader)  # noqa: S506 (a safe loader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ValueError(f"containerlab file {shown} is not YAML{where}: "
                         f"{getattr(e, 'problem', None) or 'cannot be parsed'}") from None
    topology = doc.get("topology") if isinstance(doc, dict) else None
    if not isinstance(topology, dict) or not isinstance(topology.get("nodes"), dict):
        raise ValueError(f"containerlab file {shown} has no topology.nodes table: {CONTAINERLAB.hint}")
    default = _table(topology.get("defaults")).get("kind")
    kinds: dict[str, str] = {}
    refused: list[str] = []
    for name, node in topology["nodes"].items():
        kind = _table(node).get("kind", default)
        if not isinstance(name, str) or not isinstance(kind, str):
            raise ValueError(f"containerlab file {shown}: node {units.brief(name)} has no kind (kind: linux or "
                             "bridge)")
        if kind not in HOST_KINDS + SWITCH_KINDS:
            refused.append(f"{name} ({kind})")
        kinds[name] = kind
    if refused:
        raise ValueError(f"containerlab file {shown}: {_some(refused)} run a network operating system's image, "
                         f"which vnetbench does not run; it runs {' and '.join(HOST_KINDS)} nodes (as hosts, or "
                         f"routers) and {' and '.join(SWITCH_KINDS)} nodes (as switches)")
    links: list[tuple[str, str, str]] = []
    seen: dict[str, int] = {}
    for i, link in enumerate(topology.get("links") or [], start=1):
        ends = [_endpoint_node(e) for e in _table(link).get("endpoints") or []] if isinstance(link, dict) else []
        if len(ends) != 2 or None in ends:
            raise ValueError(f"containerlab file {shown}: link {i} is not a pair of endpoints "
                             "(endpoints: [\"node:interface\", \"node:interface\"])")
        a, b = ends  # type: ignore[misc]
        outside = [e for e in (a, b) if e in NOT_IN_A_LAB and e not in kinds]
        if outside:
            raise ValueError(f"containerlab file {shown}: link {i} ends on containerlab's {outside[0]!r}, which a lab "
                             "of namespaces does not have: remove the link, or join the node to a bridge node")
        missing = [e for e in (a, b) if e not in kinds]
        if missing:
            raise ValueError(f"containerlab file {shown}: link {i} ends on {missing[0]!r}, which is no node of it")
        base = f"{a}-{b}"
        seen[base] = seen.get(base, 0) + 1
        links.append((base if seen[base] == 1 else f"{base}-{seen[base]}", a, b))
    return kinds, links


def _endpoint_node(end: Any) -> str | None:
    """The node of an endpoint: ``"node:interface"`` or ``{node: ..., interface: ...}``."""
    if isinstance(end, str) and ":" in end:
        return end.split(":", 1)[0]
    if isinstance(end, dict) and isinstance(end.get("node"), str):
        return end["node"]
    return None


def _table(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _some(items: list[str], most: int = 4) -> str:
    return ", ".join(items[:most]) + (f" and {len(items) - most} more" if len(items) > most else "")
