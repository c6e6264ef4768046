"""A declared topology on real hosts (`run --hosts` with a [topology] table): its host nodes placed by
hosts.nodes, each host's own link made on its interface, and what real hosts cannot be (a link between two
switches or routers with conditions, a host with two links, a matrix over the shape) named before any
connection is made."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import cli
from vnetbench.errors import ScenarioError
from vnetbench.hosts import inventory
from vnetbench.lab.teardown import Registry
from vnetbench.runner import hosts_bench
from vnetbench.runner.hosts_topology import HostsTopologyLab, topology_placement
from vnetbench.scenario import load as L
from vnetbench.scenario import plan as P

INVENTORY = """all:
  hosts:
    server-a: {ansible_host: 198.18.204.2, vnetbench_shape_interfaces: [data0]}
    site-1: {ansible_host: 198.18.204.6, vnetbench_shape_interfaces: [data0]}
    site-2: {ansible_host: 198.18.204.10, vnetbench_shape_interfaces: [data0]}
    site-3: {ansible_host: 198.18.204.14}
  children:
    pair:
      hosts:
        site-1:
        site-2:
"""

# seed 004's shape: sites around one server, each at its own distance; h1's link slowed, outbound
STAR = """name = "sites"
[topology]
template = "star"
leaves = 2
[hosts]
nodes = { srv = "server-a", h1 = "site-1", h2 = "site-2" }
[lab.link.h1]
forward = { rate = "20Mbit" }
[workload.stream]
tool = "iperf3"
"""


def configs_of(tmp_path: Path, text: str, *overrides: str) -> list:
    (tmp_path / "s.toml").write_text(text)
    return P.expand(L.load(str(tmp_path / "s.toml"), list(overrides)))


def place(tmp_path: Path, text: str = STAR, *overrides: str) -> hosts_bench.Placement:
    (tmp_path / "inv.yml").write_text(INVENTORY)
    return topology_placement(configs_of(tmp_path, text, *overrides), inventory.load(tmp_path / "inv.yml"),
                              "s.toml")


def test_a_topologys_hosts_are_placed_by_node_and_each_carries_its_own_link(tmp_path):
    p = place(tmp_path)
    assert {n: h.name for n, h in p.nodes.items()} == {"srv": "server-a", "h1": "site-1", "h2": "site-2"}
    assert [h.name for h in p.hosts] == ["server-a", "site-1", "site-2"]  # the server first, as a receiver
    # h1's link goes h1 -> x1: forward is site-1's egress; srv's goes x1 -> srv: its forward enters server-a
    assert p.upstream("site-1", "h1") is True and p.upstream("server-a", "srv") is False
    assert list(p.shaped) == ["site-1"] and list(p.shaped["site-1"]) == ["h1"]
    # a host's one link carries all it exchanges: every other endpoint's address is steered
    assert p.peers("site-1") == ["198.18.204.2", "198.18.204.10"]
    assert p.addresses == {"server-a": "198.18.204.2", "site-1": "198.18.204.6", "site-2": "198.18.204.10"}


def test_only_the_nodes_the_workloads_run_on_are_placed(tmp_path):
    text = STAR.replace("leaves = 2", "leaves = 3").replace('[workload.stream]\ntool = "iperf3"\n',
                                                            '[workload.stream]\ntool = "iperf3"\nclients = ["h1"]\n')
    p = place(tmp_path, text)
    assert list(p.nodes) == ["srv", "h1"]  # h2 (placed) and h3 (not) run nothing: no host is touched for them


@pytest.mark.parametrize("change,needle", [
    (('nodes = { srv = "server-a", h1 = "site-1", h2 = "site-2" }', 'nodes = { srv = "server-a", h1 = "site-1" }'),
     "the workloads run on 'h2', which hosts.nodes places on no host: add h2 = \"INVENTORY HOST\""),
    (('h2 = "site-2"', 'h2 = "site-1"'), "hosts.nodes places h1 and h2 both on site-1: a host is one endpoint"),
    (('h2 = "site-2"', 'h2 = "pair"'), "hosts.nodes.h2 = 'pair' names 2 hosts (site-1, site-2); name one"),
    (('h2 = "site-2"', 'h2 = "nobody"'), "no host or group named 'nobody'"),
    # conditions only where a host of the run stands: not between the star's centre and a host no one runs on
    (("leaves = 2", "leaves = 3"), None),
    (('h1 = "site-1", h2 = "site-2"', 'h1 = "site-3", h2 = "site-2"'),
     "does not let vnetbench change site-3's interfaces"),
    (('forward = { rate = "20Mbit" }', 'forward = { rate = "20Mbit" }\nbackend = "userspace"'),
     "backend = 'userspace': the emulator runs in the local lab only"),
    (("[workload.stream]", 'env = "container"\n[workload.stream]'), None),
])
def test_what_real_hosts_cannot_be_is_named_before_connecting(tmp_path, change, needle):
    text = STAR.replace(*change)
    if "leaves = 3" in text and "h3" not in text:
        text = text.replace("[lab.link.h1]", "[lab.link.h3]\nboth = { rate = \"5Mbit\" }\n[lab.link.h1]")
        needle = "link 'h3' joins h3 (host) and x1 (switch): host 'h3' runs none of the workloads"
        text = text.replace('[workload.stream]\ntool = "iperf3"\n', '[workload.stream]\ntool = "iperf3"\n'
                            'clients = ["h1", "h2"]\n')
    if 'env = "container"' in text:
        text = text.replace('env = "container"\n[workload.stream]', '[workload.stream]').replace(
            "[lab.link.h1]", '[lab]\nenv = "container"\n[lab.link.h1]')
        needle = "lab.env = 'container' needs the local lab"
    with pytest.raises(ScenarioError) as e:
        place(tmp_path, text)
    assert needle in str(e.value), str(e.value)


def test_a_node_no_workload_runs_on_stands_for_no_host(tmp_path):
    text = STAR.replace("leaves = 2", "leaves = 3").replace(
        '[workload.stream]\ntool = "iperf3"\n', '[workload.stream]\ntool = "iperf3"\nclients = ["h1", "h2"]\n')
    with pytest.raises(ScenarioError, match="hosts.addresses names 'site-3', which runs none of the workloads' nodes"):
        place(tmp_path, text.replace('h2 = "site-2" }', 'h2 = "site-2", h3 = "site-3" }\n[hosts.addresses]\n'
                                                         'site-3 = "198.18.205.14"'))
    assert list(place(tmp_path, text.replace('h2 = "site-2" }', 'h2 = "site-2", h3 = "site-3" }')).nodes) == \
        ["srv", "h1", "h2"]


def test_a_link_between_two_routers_has_no_host_to_carry_its_conditions(tmp_path):
    text = """name = "chain"
[topology]
template = "linear"
hops = 3
[hosts]
nodes = { h1 = "site-1", h2 = "server-a" }
[lab.link.l2]
forward = { rate = "10Mbit" }
[workload.stream]
tool = "iperf3"
"""
    with pytest.raises(ScenarioError) as e:
        place(tmp_path, text)
    assert ("link 'l2' joins x1 (router) and x2 (router): the network between the real hosts is what it is; on real "
            "hosts a link's conditions go on the interface of a host the workloads run on (l1, l3)") in str(e.value)
    # the hops at the ends are the hosts' own: there they go, outbound on h1, inbound on server-a
    p = place(tmp_path, text.replace("[lab.link.l2]", "[lab.link.l1]") + "[lab.link.l3]\nforward = { rate = "
              "\"30Mbit\" }\n")
    assert {h: list(links) for h, links in p.shaped.items()} == {"site-1": ["l1"], "server-a": ["l3"]}
    assert p.upstream("site-1", "l1") is True and p.upstream("server-a", "l3") is False


def test_two_hosts_joined_straight_make_their_link_once_on_its_a_end(tmp_path):
    text = """name = "pair"
[topology]
nodes = { a = "host", b = "host" }
links = [ { name = "wire", a = "a", b = "b" } ]
[hosts]
nodes = { a = "site-1", b = "server-a" }
[lab.link.wire]
both = { rate = "10Mbit" }
[workload.stream]
tool = "iperf3"
clients = ["a"]
server = "b"
"""
    p = place(tmp_path, text)
    assert {h: list(links) for h, links in p.shaped.items()} == {"site-1": ["wire"]}
    lab = HostsTopologyLab("vnb-x", Registry(), link_of={"a": "wire"}, outward={"a": True})
    assert lab.path_links("b", ["a"]) == {"a": "wire"}
    # a -> b leaves a's end forward; b -> a crosses the same link backward
    assert lab.route("a", "b") == [("a", True)] and lab.route("b", "a") == [("a", False)]


def test_a_host_with_two_links_or_a_link_of_its_own_mtu_is_not_a_real_host(tmp_path):
    text = """name = "two"
[topology]
nodes = { a = "host", m = "host", b = "host", s1 = "switch", r1 = "router" }
links = [ { name = "a", a = "a", b = "s1" }, { name = "left", a = "m", b = "s1" },
          { name = "right", a = "m", b = "r1" }, { name = "up", a = "s1", b = "r1" },
          { name = "b", a = "r1", b = "b" } ]
clients = ["m"]
server = "b"
[hosts]
nodes = { a = "site-1", m = "site-2", b = "server-a" }
[workload.stream]
tool = "iperf3"
"""
    with pytest.raises(ScenarioError, match=r"topology host 'm' has 2 links \(left, right\); on a real host it has one "
                                            "interface toward its peers"):
        place(tmp_path, text)
    jumbo = STAR.replace("template = \"star\"\nleaves = 2", 'nodes = { h1 = "host", srv = "host" }\nlinks = [ { name = '
                         '"h1", a = "h1", b = "srv", mtu = 9000 } ]').replace(', h2 = "site-2"', "")
    with pytest.raises(ScenarioError, match="link 'h1' declares mtu = 9000; a real host's interface keeps its own MTU"):
        place(tmp_path, jumbo.replace('tool = "iperf3"\n', 'tool = "iperf3"\nclients = ["h1"]\nserver = "srv"\n'))


def test_a_matrix_over_the_shape_is_refused_on_hosts_and_over_the_links_is_not(tmp_path):
    with pytest.raises(ScenarioError, match=r"the matrix changes the topology's shape \(2 graphs\)"):
        place(tmp_path, STAR + '[matrix]\n"topology.leaves" = [2, 3]\n')
    p = place(tmp_path, STAR + '[matrix]\n"link.h1.forward.rate" = ["10Mbit", "20Mbit"]\n"link.h2.forward.rate" = '
                               '["5Mbit"]\n')
    assert {h: len(links["h1" if h == "site-1" else "h2"]) for h, links in p.shaped.items()} == {"site-1": 2,
                                                                                                  "site-2": 1}


@pytest.mark.parametrize("text,needle", [
    (STAR.replace('nodes = { srv = "server-a", h1 = "site-1", h2 = "site-2" }', 'receiver = "server-a"\nsenders = '
                  '["site-1"]'),
     "hosts.receiver places a dumbbell's endpoint; a [topology]'s hosts are placed by node"),
    (STAR.replace('nodes = { srv = "server-a", h1 = "site-1", h2 = "site-2" }', 'wait_for_host = "10s"'),
     "a [topology] on real hosts needs hosts.nodes, the inventory host each of its host nodes runs on"),
    (STAR.replace('srv = "server-a"', 'x1 = "server-a"'), "hosts.nodes.x1: 'x1' is a switch of the topology"),
    (STAR.replace('srv = "server-a"', 'nowhere = "server-a"'), "hosts.nodes.nowhere: 'nowhere' is no node of"),
    ('name = "d"\n[hosts]\nnodes = { r = "server-a" }\n[workload.stream]\ntool = "iperf3"\n',
     "hosts.nodes places the hosts of a [topology] table, and this scenario declares none"),
    ('name = "d"\n[hosts]\nsenders = ["site-1"]\n[workload.stream]\ntool = "iperf3"\n',
     "[hosts] names no receiver: give receiver = \"HOST\""),
])
def test_a_hosts_table_that_does_not_fit_its_shape_is_refused_when_loaded(tmp_path, text, needle):
    (tmp_path / "s.toml").write_text(text)
    with pytest.raises(ScenarioError) as e:
        L.load(str(tmp_path / "s.toml"))
    assert needle in str(e.value), str(e.value)


def test_plan_says_where_each_node_runs_and_which_host_carries_each_link(tmp_path):
    (tmp_path / "s.toml").write_text(STAR)
    planned = json.loads(cli("plan", str(tmp_path / "s.toml"), "--json").stdout)
    assert planned["hosts"]["nodes"] == {"srv": "server-a", "h1": "site-1", "h2": "site-2"}
    shown = " ".join(cli("plan", str(tmp_path / "s.toml")).stdout.split())
    assert "endpoints on real hosts (vnetbench run ... --hosts INVENTORY): srv on server-a, h1 on site-1, h2 on " \
           "site-2" in shown, shown
    assert "h1 on host h1's interface" in shown, shown
