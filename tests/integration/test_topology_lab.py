"""Topology graphs made real (issue 31, first step): every shape comes up in namespaces, packets cross exactly
the routers its shortest path has (each decrements the TTL once, IPv4 and IPv6), a lab of hundreds of nodes
comes up and goes, and a failure half-way leaves nothing."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from vnetbench.errors import LabError
from vnetbench.lab import netns
from vnetbench.lab.graph_lab import build_graph
from vnetbench.topology import templates as T
from vnetbench.topology.graph import Graph, Link, Node
from helpers import ROOT, cli

pytestmark = pytest.mark.lab
PREFIX = "vnb-7e5701"  # a run's shape of name: the suite's leftover check sees it


def _ping(lab, src: str, dst: str, version: int) -> int:
    """The TTL (hop limit) of dst's replies as src receives them: 64 minus the routers on the way back."""
    out = subprocess.run(["ip", "netns", "exec", lab.ns_name(src), "ping", f"-{version}", "-c", "2", "-i", "0.2",
                          "-W", "2", lab.plan.address(dst, version)], capture_output=True, text=True, timeout=20)
    assert out.returncode == 0, f"{src} -> {dst} (IPv{version}): {out.stdout}{out.stderr}"
    ttls = {int(t) for t in re.findall(r"ttl=(\d+)", out.stdout)}
    assert len(ttls) == 1, out.stdout
    return ttls.pop()


def _ours() -> list[str]:
    return [n for n in netns.list_names() if n.startswith(PREFIX)]


@pytest.mark.parametrize("graph, pairs", [
    # A chain of 4 links: 3 routers between the hosts.
    (T.linear(hops=4), [("h1", "h2", 3)]),
    # The same chain of switches is one network: no router, no TTL spent.
    (T.linear(hops=4, node="switch"), [("h1", "h2", 0)]),
    # Seed 004's star of sites around a server, through a router.
    (T.star(leaves=6, node="router"), [("h1", "srv", 1), ("h6", "h3", 1)]),
    # Mininet's tree with routers: leaves under one parent cross it; leaves under different ones cross 3.
    (T.tree(depth=2, fanout=3, node="router"), [("h1", "h2", 1), ("h1", "h9", 3), ("h5", "h7", 3)]),
    # The parking lot: the long flow crosses every bottleneck's routers; a cross flow only its own two.
    (T.parking_lot(bottlenecks=3), [("src", "dst", 4), ("c2s", "c2r", 2), ("c1s", "dst", 4)]),
], ids=["linear-routers", "linear-switches", "star-router", "tree-routers", "parking-lot"])
def test_each_router_on_the_shortest_path_decrements_the_ttl_once(graph, pairs):
    lab = build_graph(PREFIX, graph)
    try:
        assert sorted(n[len(PREFIX) + 1:] for n in _ours()) == sorted(graph.nodes)
        for src, dst, routers in pairs:
            for version in (4, 6):
                assert _ping(lab, src, dst, version) == 64 - routers, (src, dst, version)
    finally:
        assert lab.teardown() == []
    assert _ours() == []


def _nft_tables(ns: str) -> str:
    return subprocess.run(["ip", "netns", "exec", ns, "nft", "list", "tables"], capture_output=True, text=True,
                          check=True).stdout


def test_a_star_of_300_hosts_comes_up_and_every_host_answers():
    lab = build_graph(PREFIX, T.star(leaves=300))
    try:
        assert len(_ours()) == 302
        # A network of more than 64 nodes: its switch drops the hosts' multicast reports (graph_lab's note).
        assert "table bridge vnb_switch" in _nft_tables(lab.ns_name("x1"))
        # Every host, from the server, in one sweep (ping's own sequence over many targets would take long).
        addrs = [lab.plan.address(f"h{i}") for i in range(1, 301)]
        script = "for a in " + " ".join(addrs) + "; do ping -c1 -W2 -q $a >/dev/null || echo LOST $a; done"
        out = subprocess.run(["ip", "netns", "exec", lab.ns_name("srv"), "sh", "-c", script],
                             capture_output=True, text=True, timeout=300)
        assert out.stdout.strip() == "" and out.returncode == 0, out.stdout[-500:] + out.stderr[-500:]
    finally:
        assert lab.teardown() == []
    assert _ours() == []


@pytest.mark.parametrize("fanout, quiet", [(3, []), (11, ["x1", "x12", "x2", "x7"])])
def test_a_tree_of_small_switches_drops_reports_when_the_tree_is_large(fanout, quiet):
    # Every switch of these trees has at most 12 ports; 121 hosts in one network flood each other all the same.
    lab = build_graph(PREFIX, T.tree(depth=2, fanout=fanout))
    try:
        with_rule = sorted(sw for sw in lab.graph.nodes if lab.graph.kind(sw) == "switch"
                           and "table bridge vnb_switch" in _nft_tables(lab.ns_name(sw)))
        assert [sw for sw in with_rule if sw in quiet] == quiet
        assert len(with_rule) == (0 if not quiet else 1 + fanout)
        assert _ping(lab, "h1", f"h{fanout * fanout}", 4) == 64 and _ping(lab, "h1", "h2", 6) == 64
    finally:
        assert lab.teardown() == []
    assert _ours() == []


def test_a_failure_half_way_leaves_nothing_and_names_the_link():
    # The kernel refuses a veth MTU above 65535 when it makes the link: after the namespaces exist.
    graph = Graph([Node("a"), Node("b"), Node("sw", "switch")],
                  [Link("ok", "a", "sw"), Link("huge", "sw", "b", mtu=70000)])
    with pytest.raises(LabError, match=r"link huge \(sw/b <-> b/eth0\)"):
        build_graph(PREFIX, graph)
    assert _ours() == []


def test_a_namespace_in_the_way_is_named_and_left_alone():
    netns.create(f"{PREFIX}-h2")
    try:
        with pytest.raises(LabError, match=f"namespace {PREFIX}-h2 already exists"):
            build_graph(PREFIX, T.linear(hops=2))
        assert _ours() == [f"{PREFIX}-h2"]
    finally:
        netns.remove(f"{PREFIX}-h2")


def test_clean_removes_what_a_killed_build_left():
    # A builder killed with SIGKILL once its tree stands: its namespaces stay, and `vnetbench clean` removes them.
    script = (f"import sys, time; from vnetbench.lab.graph_lab import build_graph; from vnetbench.topology import "
              f"templates as T; build_graph({PREFIX!r}, T.tree(depth=2, fanout=4, node='router')); "
              "print('up', flush=True); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout.readline().strip() == "up"
    finally:
        proc.kill()
        proc.wait()
    assert len(_ours()) == 1 + 4 + 16
    cli("clean")
    assert _ours() == []


def _ip(ns: str, *args: str) -> list[dict]:
    out = subprocess.run(["ip", "-j", "-n", ns, *args], capture_output=True, text=True, check=True)
    return __import__("json").loads(out.stdout)


def test_the_dumbbell_is_the_templates_graph_with_the_underlay_addresses():
    # Two environments side by side (bare and container, one sender each): one switch, every endpoint's veth
    # from the graph builder, named and addressed as every dumbbell has been (198.18.0.x/16 from the endpoint's
    # number, 2001:2::x/64; switch ports named after their endpoints, in br0; the variant's MTU on both ends).
    from vnetbench.lab.environments import Variant
    from vnetbench.lab.topology import build_dumbbell

    lab = build_dumbbell(PREFIX, 1, variants=[(Variant("bare"), 1), (Variant("container", mtu=1400), 1)])
    try:
        assert sorted(n[len(PREFIX) + 1:] for n in _ours()) == ["b-r", "b-s1", "c-r", "c-r-ctr", "c-s1", "c-s1-ctr",
                                                                "sw"]
        ports = {link["ifname"]: link for link in _ip(lab.ns_name("sw"), "link", "show")}
        for number, name, mtu in ((1, "b-r", 1500), (2, "b-s1", 1500), (3, "c-r", 1400), (4, "c-s1", 1400)):
            assert ports[name]["master"] == "br0" and ports[name]["mtu"] == mtu, ports[name]
            (eth0,) = _ip(lab.ns_name(name), "addr", "show", "dev", "eth0")
            assert eth0["mtu"] == mtu
            found = {(a["local"], a["prefixlen"]) for a in eth0["addr_info"] if a["scope"] == "global"}
            assert found == {(f"198.18.0.{number + 1}", 16), (f"2001:2::{number:x}", 64)}, (name, found)
            assert lab.ports[name].name == name and lab.uplinks[name].name == "eth0"
        assert _nft_tables(lab.ns_name("sw")) == ""  # a small network's switch is a plain bridge
        # ... and the endpoints reach each other across it, both IP versions.
        r, s = lab.endpoints["b-r"], lab.endpoints["c-s1"]
        for version in (4, 6):
            out = s.run(["ping", f"-{version}", "-c", "2", "-i", "0.2", "-W", "2", r.service_address(version)],
                        timeout=20)
            assert " 0% packet loss" in out.stdout, out.stdout
    finally:
        assert lab.teardown() == []
    assert _ours() == []

