"""containerlab topology files as graphs: linux nodes as hosts (or routers), bridges as switches, links named
after their ends; network OS kinds, endpoints outside a lab, aliases and files that are not topology files
refused with the reason."""

from __future__ import annotations

import os

import pytest

from vnetbench.errors import ScenarioError
from vnetbench.scenario.load import load_text
from vnetbench.scenario.plan import expand
from vnetbench.topology import containerlab as C

SITES = """
name: sites
topology:
  defaults:
    kind: linux
  nodes:
    a:  {image: alpine}
    r1: {kind: linux, image: quay.io/frrouting/frr:10.2.1}
    br: {kind: bridge}
    b:  {}
    c:  {kind: linux}
  links:
    - endpoints: ["a:eth1", "r1:eth1"]
    - endpoints: ["r1:eth2", "br:r1"]
    - endpoints: [{node: br, interface: b}, {node: b, interface: eth1}]
    - endpoints: ["br:c", "c:eth1"]
    - endpoints: ["br:c2", "c:eth2"]
"""


def _file(tmp_path, text: str):
    path = tmp_path / "lab.clab.yml"
    path.write_text(text)
    return path


def test_a_containerlab_file_is_a_graph_with_vnetbenchs_names(tmp_path):
    graph = C.read_graph(_file(tmp_path, SITES.replace('    - endpoints: ["br:c2", "c:eth2"]\n', "")),
                         routers=["r1"], mtu=9000)
    assert {n: node.kind for n, node in graph.nodes.items()} == {"a": "host", "r1": "router", "br": "switch",
                                                                 "b": "host", "c": "host"}
    assert [(x.name, x.a, x.b, x.mtu) for x in graph.links.values()] == [
        ("a-r1", "a", "r1", 9000), ("r1-br", "r1", "br", 9000), ("br-b", "br", "b", 9000), ("br-c", "br", "c", 9000)]
    assert graph.problems() == []
    plan = graph.plan()
    assert graph.path(plan, "a", "c") == [("a-r1", True), ("r1-br", True), ("br-c", True)]


def test_a_second_link_between_two_nodes_gets_a_number_and_the_graph_says_what_is_wrong(tmp_path):
    graph = C.read_graph(_file(tmp_path, SITES), routers=["r1"])
    assert list(graph.links)[-2:] == ["br-c", "br-c-2"]
    assert any("two links into one network" in p for p in graph.problems())  # c twice on br's network


@pytest.mark.parametrize("text, message", [
    (SITES.replace("kind: bridge", "kind: nokia_srlinux"), r"br \(nokia_srlinux\) run a network operating system's"),
    (SITES + '    - endpoints: ["a:eth9", "host:a-eth9"]\n', "ends on containerlab's 'host'"),
    (SITES + '    - endpoints: ["a:eth9", "mgmt-net:a-eth9"]\n', "ends on containerlab's 'mgmt-net'"),
    (SITES + '    - endpoints: ["a:eth9", "z:eth1"]\n', "link 6 ends on 'z', which is no node"),
    (SITES + '    - endpoints: ["a:eth9"]\n', "link 6 is not a pair of endpoints"),
    ("name: x\ntopology:\n  nodes: &n {a: {kind: linux}}\n  more: *n\n", "line 4: an alias"),
    ("name: x\nnodes: {a: {kind: linux}}\n", "has no topology.nodes table"),
    ("topology: [unclosed\n", "is not YAML at line 2"),
    ("name: x\ntopology:\n  nodes:\n    a: {image: alpine}\n", "node 'a' has no kind"),
])
def test_what_vnetbench_cannot_run_is_refused_with_the_reason(tmp_path, text, message):
    with pytest.raises(ValueError, match=message):
        C.read_graph(_file(tmp_path, text))


def test_routers_are_linux_nodes_of_the_file(tmp_path):
    path = _file(tmp_path, SITES)
    with pytest.raises(ValueError, match="has no node 'x9'"):
        C.read_graph(path, routers=["x9"])
    with pytest.raises(ValueError, match="'br' is a bridge"):
        C.read_graph(path, routers=["br"])


def test_only_a_regular_file_within_its_limit_is_read(tmp_path):
    with pytest.raises(ValueError, match="containerlab file '/proc/self/environ' is under /proc"):
        C.read_graph("/proc/self/environ")
    fifo = tmp_path / "fifo.clab.yml"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="is not a regular file"):
        C.read_graph(fifo)
    big = tmp_path / "big.clab.yml"
    with open(big, "wb") as f:
        f.truncate(C.CONTAINERLAB.limit.value + 1)
    with pytest.raises(ValueError, match="over the topology file size limit of 4 MiB"):
        C.read_graph(big)


def test_a_scenario_names_its_containerlab_file_and_conditions_its_links(tmp_path):
    path = _file(tmp_path, SITES.replace('    - endpoints: ["br:c2", "c:eth2"]\n', ""))
    text = (f'name = "t"\n[topology]\ncontainerlab = "{path}"\nrouters = ["r1"]\nclients = ["a"]\nserver = "c"\n'
            '[lab.link.a-r1]\nforward = {delay = "5ms"}\n[workload.probe]\ntool = "ping"\n')
    scenario = load_text(text, "t.toml").scenario
    assert scenario.topology.endpoints(scenario.topology.graph()) == (["a"], "c")
    with pytest.raises(ScenarioError, match="needs its endpoints"):
        expand(load_text(text.replace('clients = ["a"]\nserver = "c"\n', ""), "t.toml"))
    with pytest.raises(ScenarioError, match="lab.link.a-b: the topology has no link 'a-b'"):
        load_text(text.replace("lab.link.a-r1", "lab.link.a-b"), "t.toml")
    with pytest.raises(ScenarioError, match="routers names a containerlab file's linux nodes"):
        load_text('name = "t"\n[topology]\ntemplate = "linear"\nrouters = ["x1"]\n[workload.probe]\ntool = "ping"\n',
                  "t.toml")
    with pytest.raises(ScenarioError, match="template and containerlab each describe the graph"):
        load_text(text.replace("[topology]\n", '[topology]\ntemplate = "linear"\n'), "t.toml")


def test_the_docs_example_is_the_file_it_names():
    from helpers import ROOT

    doc = (ROOT / "docs/how-to/topologies.md").read_text()
    block = doc.split("```yaml\n", 1)[1].split("```", 1)[0]
    assert block == (ROOT / "docs/examples/sites.clab.yml").read_text()
    graph = C.read_graph(ROOT / "docs/examples/sites.clab.yml", routers=["r1"])
    assert graph.problems() == [] and sorted(graph.links) == ["a-r1", "br-b", "br-c", "r1-br"]
