"""The scenario's [topology] table: templates and written-out graphs, their endpoints, the link names the lab's
conditions may use, and the matrix over topology keys and link keys."""

from __future__ import annotations

import pytest

from vnetbench.errors import ScenarioError
from vnetbench.impair.model import LinkSpec
from vnetbench.scenario.load import load_text
from vnetbench.scenario.plan import expand

PROBE = """
[workload.probe]
tool = "ping"
duration = "1s"
"""


def _load(text: str):
    return load_text('name = "t"\n' + text + PROBE, "t.toml")


def test_a_template_gives_its_graph_and_its_usual_endpoints():
    s = _load('[topology]\ntemplate = "linear"\nhops = 3\n').scenario
    graph = s.topology.graph(s.lab.mtu)
    assert list(graph.links) == ["l1", "l2", "l3"]
    assert s.topology.endpoints(graph) == (["h1"], "h2")
    assert s.lab.bottleneck is None  # no link named bottleneck: the lab's default rate goes nowhere
    s = _load('[topology]\ntemplate = "star"\nleaves = 3\n').scenario
    assert s.topology.endpoints(s.topology.graph()) == (["h1", "h2", "h3"], "srv")
    s = _load('[topology]\ntemplate = "dumbbell"\nsenders = 2\n').scenario
    assert s.topology.endpoints(s.topology.graph()) == (["s1", "s2"], "r")
    assert s.lab.bottleneck == 100e6  # the dumbbell template has the bottleneck link the short-hands feed


def test_a_written_out_graph_and_its_endpoints():
    text = ('[topology]\nnodes = {a = "host", x = "router", b = "host", c = "host"}\n'
            'links = [{name = "la", a = "a", b = "x"}, {name = "lb", a = "x", b = "b"}, {name = "lc", a = "x", b = "c", mtu = 9000}]\n')
    with pytest.raises(ScenarioError, match="needs its endpoints: clients"):
        expand(_load(text))  # checked per configuration: a matrix may give them
    s = _load(text + 'clients = ["a", "c"]\nserver = "b"\n').scenario
    graph = s.topology.graph(s.lab.mtu)
    assert graph.links["lc"].mtu == 9000 and graph.links["la"].mtu == 1500
    assert s.topology.endpoints(graph) == (["a", "c"], "b")


@pytest.mark.parametrize("table, message", [
    ('template = "linear"\nleaves = 3', "leaves = 3 is a parameter of template 'star'"),
    ('template = "ring"', "template"),
    ('hops = 2', "give a template"),
    ('nodes = {a = "host"}', "needs both nodes"),
    ('template = "linear"\nnodes = {a = "host"}\nlinks = []', "keep one"),
    ('template = "linear"\nserver = "x1"', "server 'x1' is no host"),
    ('template = "linear"\nclients = ["h2"]\nserver = "h2"', "both a client and the server"),
    ('template = "star"\nleaves = 2\nclients = []', "at least one host"),
    ('nodes = {a = "host", b = "host"}\nlinks = [{name = "l", a = "a", b = "c"}]', "joins 'c', which is no node"),
    ('template = "linear"\nhops = 0', "hops = 0"),
])
def test_a_topology_that_cannot_be_built_is_refused_with_the_reason(table, message):
    with pytest.raises(ScenarioError, match=message):
        _load(f"[topology]\n{table}\n")


def test_link_conditions_name_the_topologys_links_and_the_short_hands_need_a_bottleneck():
    with pytest.raises(ScenarioError, match=r"lab.link.bottleneck: the topology has no link 'bottleneck' \(links: l1, l2\)"):
        _load('[topology]\ntemplate = "linear"\n[lab.link.bottleneck]\nforward = {delay = "1ms"}\n')
    with pytest.raises(ScenarioError, match='lab.delay applies to the link named "bottleneck"'):
        _load('[lab]\ndelay = "5ms"\n[topology]\ntemplate = "linear"\n')
    with pytest.raises(ScenarioError, match="a dumbbell's links are"):
        _load('[lab.link.l1]\nforward = {delay = "1ms"}\n')  # no topology: the dumbbell's names
    s = _load('[topology]\ntemplate = "linear"\n[lab.link.l2]\nforward = {delay = "1ms"}\n').scenario
    assert s.lab.link["l2"].forward.delay == pytest.approx(0.001)
    for env in ("docker", "podman"):
        # the host is a container whose network is the topology's links: nothing of an engine network's applies
        assert _load(f'[lab]\nenv = "{env}"\ncpu_quota = "50%"\n[topology]\ntemplate = "linear"\n').scenario.lab.env == env
        for key, value in (("network", '"bridge"'), ("network", '"host"'), ("publish", "true")):
            with pytest.raises(ScenarioError, match=f"lab.{key} = .* with lab.env = '{env}' on a \\[topology\\]: each "
                               "host is a container whose network is the topology's own links"):
                _load(f'[lab]\nenv = "{env}"\n{key} = {value}\n[topology]\ntemplate = "linear"\n')


def test_a_topologys_hosts_run_in_guests_only_where_each_has_one_link():
    assert _load('[lab]\nenv = "vm"\nnic = "e1000"\n[topology]\ntemplate = "linear"\n').scenario.lab.nic == "e1000"
    assert _load('[lab]\nenv = "overlay"\noverlay = "routed"\n[topology]\ntemplate = "tree"\n')
    # h2 sits on two links (to two routers); the workload runs from it
    two_links = ('[topology]\nnodes = {h1 = "host", h2 = "host", h3 = "host", x = "router", y = "router"}\n'
                 'links = [{name = "a", a = "h1", b = "x"}, {name = "b", a = "h2", b = "x"}, '
                 '{name = "c", a = "h2", b = "y"}, {name = "d", a = "y", b = "h3"}, {name = "e", a = "x", b = "y"}]\n')
    with pytest.raises(ScenarioError, match="host 'h2' of the topology has 2 links, and a guest takes over a host on "
                       "one link only"):
        _load(f'[lab]\nenv = "vm"\n{two_links}clients = ["h2"]\nserver = "h3"\n')
    # the same graph with its workload between the one-link hosts, and a workload of its own from h2 in bare
    assert _load(f'[lab]\nenv = "vm"\n{two_links}clients = ["h1"]\nserver = "h3"\n')
    with pytest.raises(ScenarioError, match="host 'h2'"):
        _load(f'[lab]\nenv = "vm"\n{two_links}clients = ["h1"]\nserver = "h3"\n'
              '[workload.x]\ntool = "ping"\nclients = ["h2"]\nserver = "h3"\n')


def test_a_topologys_hosts_run_in_containers_and_a_matrix_over_env_builds_a_graph_each():
    from vnetbench.runner.graph_bench import graph_key

    loaded = _load('[lab]\nenv = "container"\ncpu_quota = 0.5\n[topology]\ntemplate = "linear"\n')
    assert (loaded.scenario.lab.env, loaded.scenario.lab.cpu_quota) == ("container", 0.5)
    configs = expand(_load('[topology]\ntemplate = "linear"\n[matrix]\n"lab.env" = ["bare", "container"]\n'
                           '"link.l1.forward.delay" = ["1ms", "2ms"]\n'))
    # one graph per environment, the link's sweep on each
    assert len({graph_key(c) for c in configs}) == 2 and len(configs) == 4


def test_the_matrix_sweeps_a_topologys_link_and_its_clients():
    loaded = _load('[topology]\ntemplate = "star"\nleaves = 3\n'
                   '[matrix]\n"link.h2.forward.delay" = ["1ms", "20ms"]\n"topology.clients" = [["h1"], ["h1", "h3"]]\n')
    configs = expand(loaded)
    assert len(configs) == 4
    assert sorted({c.active_senders for c in configs}) == [1, 2]
    delays = sorted({c.scenario.lab.link["h2"].forward.delay for c in configs})
    assert delays == [pytest.approx(0.001), pytest.approx(0.02)]


def test_a_link_seen_from_its_other_end_swaps_its_directions():
    spec = LinkSpec.model_validate({"forward": {"delay": "5ms"}, "reverse": {"rate": "10Mbit"},
                                    "schedule": [{"at": "1s", "forward": {"rate": "1Mbit"}}]})
    back = spec.reversed()
    assert back.reverse.delay == pytest.approx(0.005) and back.forward.rate == 10e6
    assert back.schedule.steps[0].reverse.rate == 1e6 and back.schedule.steps[0].forward is None
    assert back.reversed() == spec


def test_plan_shows_the_graph_its_conditions_and_each_configurations_path():
    from vnetbench.runner.preview import topology_plan

    loaded = _load('[topology]\ntemplate = "linear"\nhops = 2\n[lab.link.l2]\nforward = {delay = "3ms"}\n'
                   '[matrix]\n"link.l1.reverse.delay" = ["1ms", "2ms"]\n')
    topo = topology_plan(expand(loaded))
    assert topo["nodes"] == {"h1": "host", "h2": "host", "x1": "router"}
    links = {x["name"]: x for x in topo["links"]}
    assert links["l1"]["conditions"] == ["reverse: delay 1ms", "reverse: delay 2ms"]  # as each configuration has it
    assert links["l2"]["conditions"] == ["forward: delay 3ms"] and (links["l2"]["a"], links["l2"]["b"]) == ("x1", "h2")
    assert topo["endpoints"] == [{"clients": ["h1"], "server": "h2", "workloads": ["probe"],
                                  "paths": {"h1": ["l1", "l2"]}}]
    assert topo["addresses"]["x1"]["eth0"]["ipv4"].startswith("198.18.")
    assert topo["routes"]["h1"] == ["0.0.0.0/0 via 198.18.0.1 dev eth0", "::/0 via 2001:2::1 dev eth0"]
    assert topology_plan(expand(_load(""))) is None  # the dumbbell


PARKING = """
[topology]
template = "parking-lot"
bottlenecks = 2
[lab.link.b1]
forward = {rate = "10Mbit"}
[lab.link.b2]
forward = {rate = "30Mbit"}
[workload.long]
tool = "iperf3"
clients = ["src"]
server = "dst"
[workload.cross1]
tool = "iperf3"
during = "long"
clients = ["c1s"]
server = "c1r"
[workload.cross2]
tool = "iperf3"
during = "long"
clients = ["c2s"]
server = "c2r"
"""


def test_workloads_between_their_own_hosts_have_max_min_fair_shares_for_theory():
    (config,) = expand(load_text('name = "p"\n' + PARKING, "p.toml"))
    scenario = config.scenario
    assert [p for p, _ in scenario.phases()] == ["long"]  # the cross flows run with it
    assert all(scenario.qualifies(w) for w in ("long", "cross1", "cross2"))
    # b1 is shared by the long flow and cross1 (5 each), b2 by the long flow (5) and cross2 (the rest)
    assert config.expected == {"throughput.rx_mbps@long": 5.0, "throughput.rx_mbps@cross1": 5.0,
                               "throughput.rx_mbps@cross2": 25.0}
    # an offered rate below the share is what that flow gets; the others share the rest
    slow = PARKING.replace('server = "c1r"\n', 'server = "c1r"\noffered = "2Mbit"\n')
    (config,) = expand(load_text('name = "p"\n' + slow, "p.toml"))
    assert config.offered_by == {"cross1": 2e6, "cross2": None}
    assert config.expected["throughput.rx_mbps@cross1"] == pytest.approx(2.0)
    assert config.expected["throughput.rx_mbps@long"] == pytest.approx(8.0)
    assert config.expected["throughput.rx_mbps@cross2"] == pytest.approx(22.0)


def test_plan_shows_each_workloads_path():
    from vnetbench.runner.preview import topology_plan

    topo = topology_plan(expand(load_text('name = "p"\n' + PARKING, "p.toml")))
    assert [(e["workloads"], e["paths"]) for e in topo["endpoints"]] == [
        (["long"], {"src": ["src", "b1", "b2", "dst"]}), (["cross1"], {"c1s": ["c1s", "b1", "c1r"]}),
        (["cross2"], {"c2s": ["c2s", "b2", "c2r"]})]


def test_a_workloads_own_hosts_are_checked_before_anything_is_built():
    with pytest.raises(ScenarioError, match="workload.cross1: client 'x1' is no host of the topology"):
        _load_parking(PARKING.replace('clients = ["c1s"]', 'clients = ["x1"]'))
    with pytest.raises(ScenarioError, match="workload.cross1: 'c1r' is both a client and the server"):
        _load_parking(PARKING.replace('clients = ["c1s"]', 'clients = ["c1r"]'))
    # two iperf3 streams at once between the same hosts: one server, one test at a time
    with pytest.raises(ScenarioError, match="workload.long and workload.cross1 both run iperf3 from src to dst at once"):
        _load_parking(PARKING.replace('clients = ["c1s"]\nserver = "c1r"', 'clients = ["src"]\nserver = "dst"'))
    # the same hosts one after the other are fine, and so are other clients to the same server
    _load_parking(PARKING.replace('during = "long"\nclients = ["c1s"]\nserver = "c1r"', 'clients = ["src"]\nserver = "dst"'))
    _load_parking(PARKING.replace('clients = ["c1s"]\nserver = "c1r"', 'clients = ["c1s"]\nserver = "dst"'))


def _load_parking(text: str):
    return expand(load_text('name = "p"\n' + text, "p.toml"))


def test_the_report_draws_a_declared_topology_in_layers_from_the_server():
    from xml.etree import ElementTree

    from vnetbench.report.html_topology import MAX_DRAWN, graph_layers, graph_svg
    from vnetbench.runner.preview import topology_record

    drawn = topology_record(_load_parking(PARKING))
    assert "addresses" not in drawn and drawn["routes_count"] > 0  # plan --json has them; a run keeps the count
    assert graph_layers(drawn["nodes"], drawn["links"], ["dst"]) == [
        ["dst"], ["x2"], ["c2r", "x1"], ["c1r", "c2s", "x0"], ["c1s", "src"]]
    svg = graph_svg(drawn)
    tree = ElementTree.fromstring(svg[:svg.index("</svg>") + 6])  # well-formed: every text escaped
    texts = [t.text for t in tree.iter("{http://www.w3.org/2000/svg}text")]
    assert {"src", "dst", "x0", "c1s"} <= set(texts)
    assert "b1: forward: rate 10Mbit" in texts  # a conditioned link says its conditions
    titles = [t.text for t in tree.iter("{http://www.w3.org/2000/svg}title")]
    assert "link b1: x0 -> x1; forward: rate 10Mbit; crossed by long, cross1" in titles
    assert "<code>cross2</code>: c2s → c2r via c2s → b2 → c2r" in svg
    # names a user chose are text, never markup
    drawn["nodes"]["<b>&"] = "host"
    drawn["links"].append({"name": "x<i>", "a": "<b>&", "b": "x0", "conditions": ["forward: delay 1ms"]})
    svg = graph_svg(drawn)
    tree = ElementTree.fromstring(svg[:svg.index("</svg>") + 6])
    assert "<b>&" in [t.text for t in tree.iter("{http://www.w3.org/2000/svg}text")]
    # a thousand leaves: those on conditioned links and the first others at their distance, the rest counted
    big = topology_record(expand(_load(f'[topology]\ntemplate = "star"\nleaves = {MAX_DRAWN + 700}\n'
                                       '[lab.link.h900]\nboth = {delay = "1ms"}\n')))
    svg = graph_svg(big)
    tree = ElementTree.fromstring(svg[:svg.index("</svg>") + 6])
    texts = [t.text for t in tree.iter("{http://www.w3.org/2000/svg}text")]
    assert "h900" in texts and "h1" in texts and "srv" in texts and "h500" not in texts
    assert f"+{MAX_DRAWN + 700 - 15:,} more" in texts
    assert any(t.startswith(f"17 of {MAX_DRAWN + 702:,} nodes drawn") for t in texts), texts[-1]


def test_a_matrix_over_the_graph_builds_one_graph_per_value_under_a_prefix_of_its_own():
    import shutil

    from vnetbench.runner.graph_bench import GraphBench, GraphsBench
    from vnetbench.runner.preview import topology_plan

    configs = expand(_load('[topology]\ntemplate = "linear"\n[lab.link.l1]\nboth = {delay = "1ms"}\n'
                           '[matrix]\n"topology.hops" = [1, 2, 4]\n"link.l1.both.delay" = ["1ms", "2ms"]\n'))
    assert len(configs) == 6
    bench = GraphBench.for_configs("vnb-abc123", configs)
    try:
        assert isinstance(bench, GraphsBench)
        # the first graph under the run's prefix, the others under <prefix>-g<k>+ (no node name has a "+")
        assert [b.run_prefix for b in bench.benches.values()] == ["vnb-abc123", "vnb-abc123-g1+", "vnb-abc123-g2+"]
        assert [len(b.configs) for b in bench.benches.values()] == [2, 2, 2]
        for c in configs:
            assert c in bench.of(c).configs and bench.of(c).topology.hops == c.scenario.topology.hops
    finally:
        for b in bench.benches.values():
            shutil.rmtree(b.workdir, ignore_errors=True)
    topo = topology_plan(configs)
    assert [len(g["links"]) for g in topo["graphs"]] == [1, 2, 4]
    assert topo["graphs"][2]["configurations"] == [{"topology.hops": 4, "link.l1.both.delay": "1ms"},
                                                   {"topology.hops": 4, "link.l1.both.delay": "2ms"}]
    assert topo["graphs"][1]["endpoints"][0]["paths"] == {"h1": ["l1", "l2"]}
    one = GraphBench.for_configs("vnb-abc123", configs[:2])  # one graph: one bench, as before
    shutil.rmtree(one.workdir, ignore_errors=True)
    assert isinstance(one, GraphBench)


def test_a_graph_whose_segments_reach_the_containers_subnets_is_refused_naming_both():
    from types import SimpleNamespace
    import ipaddress

    from vnetbench.errors import LabError
    from vnetbench.runner.graph_bench import _keep_apart

    def built(*v4):
        return SimpleNamespace(plan=SimpleNamespace(segments=[SimpleNamespace(v4=ipaddress.ip_network(n), v6=None)
                                                              for n in v4]))
    env = SimpleNamespace(kind="container")
    _keep_apart(built("198.18.0.0/30", "198.18.255.252/30"), env)  # the bottom of the range: apart
    with pytest.raises(LabError, match=r"segment 198\.19\.0\.0/30 overlaps the subnets container endpoints get"):
        _keep_apart(built("198.18.0.0/30", "198.19.0.0/30"), env)
