"""The endpoint -> node mapping a run stores (its fingerprint's "endpoints"), as `show` and the report give it.

The lab tests check what a real lab and real hosts store (test_lifecycle, test_hosts_run); these check the
rendering: every place's entries alike, a run with several environments a line each, and whatever a shared
database holds there printed as text (markup escaped, odd types shown rather than a crash).
"""

from __future__ import annotations

from helpers import cli
from vnetbench.lab.nodes import placement_entry
from vnetbench.report import html as html_report
from vnetbench.report.html_synthetic import make_run
from vnetbench.report.terminal import endpoint_lines, endpoint_places
from vnetbench.store.db import Store

LAB = {
    "bare": {"r": placement_entry("namespace vnb-abc123-r", "198.18.0.1", "2001:2::1", "r-eth0", 1),
             "s1": placement_entry("namespace vnb-abc123-s1", "198.18.0.11", "", "s1-eth0", 0)},
    "docker": {"r": placement_entry("docker container vnb-abc123-dk-r (namespace vnb-abc123-dk-r)", "198.18.0.2",
                                    "", "eth0", 1, published="198.18.1.1")},
}
HOSTS = {"bare": {"r": placement_entry("host alice (ssh vnb@198.18.5.1 port 2222)", "198.18.5.1", "", None, None),
                  "s1": placement_entry("host bob (ssh 198.18.5.2)", "198.18.5.2", "", "eth1", None)}}


def test_each_endpoint_has_the_same_keys_wherever_it_runs():
    for mapping in (LAB, HOSTS):
        for endpoints in mapping.values():
            for entry in endpoints.values():
                assert {"node", "addresses", "interface", "cpu"} <= set(entry)
    assert LAB["bare"]["s1"]["addresses"] == ["198.18.0.11"]  # no empty address listed


def test_one_line_per_environment_naming_node_addresses_interface_and_cpu():
    lines = endpoint_lines({"endpoints": LAB})
    assert lines == [
        "endpoints (bare): r = namespace vnb-abc123-r (198.18.0.1 2001:2::1, interface r-eth0, cpu 1); "
        "s1 = namespace vnb-abc123-s1 (198.18.0.11, interface s1-eth0, cpu 0)",
        "endpoints (docker): r = docker container vnb-abc123-dk-r (namespace vnb-abc123-dk-r) "
        "(198.18.0.2, interface eth0, cpu 1)",
    ]
    # one environment: no environment named; a host without a known interface or pinned CPU says neither
    assert endpoint_lines({"endpoints": HOSTS}) == [
        "endpoints: r = host alice (ssh vnb@198.18.5.1 port 2222) (198.18.5.1); "
        "s1 = host bob (ssh 198.18.5.2) (198.18.5.2, interface eth1)"]
    assert endpoint_lines({}) == []  # a run stored before the mapping was


def test_whatever_a_database_holds_there_is_text():
    odd = {"endpoints": {"bare": {"r": {"node": 7, "addresses": "198.18.0.1", "cpu": 0}, "s1": "x"}, "v": [1]}}
    assert endpoint_places(odd) == [("bare", "r", "7", "", "", "0")]
    assert endpoint_places({"endpoints": "nothing"}) == []


def test_show_and_the_report_give_the_mapping_escaped(tmp_path):
    db = tmp_path / "r.db"
    hostile = {"bare": {"r": placement_entry("namespace <b>x</b> [red]y[/]", "198.18.0.1", "", "r-eth0", 1)}}
    with Store(db) as store:
        make_run(store, "endpoints001", matrix={"proto": ["udp"]}, repetitions=2, duration_s=2,
                 fingerprint={"endpoints": LAB})
        make_run(store, "endpoints002", matrix={"proto": ["udp"]}, repetitions=2, duration_s=2,
                 fingerprint={"endpoints": hostile})
        page = html_report.render_report(store, ["endpoints001"])
        hostile_page = html_report.render_report(store, ["endpoints002"])
    assert "<h3>Endpoints</h3>" in page
    for cell in ("docker", "namespace vnb-abc123-s1", "198.18.0.1 2001:2::1", "s1-eth0"):
        assert f"<td>{cell}</td>" in page, cell
    assert "endpoints.bare" not in page  # not flattened into the fingerprint's table as well
    assert "<td>namespace &lt;b&gt;x&lt;/b&gt; [red]y[/]</td>" in hostile_page
    shown = cli("show", "endpoints001", "--db", str(db)).stdout
    assert "endpoints (bare): r = namespace vnb-abc123-r (198.18.0.1 2001:2::1, interface r-eth0, cpu 1)" in \
        " ".join(shown.split())
    shown = " ".join(cli("show", "endpoints002", "--db", str(db)).stdout.split())
    assert "endpoints: r = namespace <b>x</b> [red]y[/] (198.18.0.1" in shown  # markup printed as it is
