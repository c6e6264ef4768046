"""A third place needs only its own module and one registration line (issue 30): the toy of
tests/one_namespace_place.py (every endpoint in one namespace), added to vnetbench.runner.places.PLACES by one
line here and run through `vnetbench run` as a user would, measures, stores its endpoint -> node mapping,
refuses what it cannot do before building anything, and leaves nothing behind."""

from __future__ import annotations

import re

import pytest

from vnetbench import cli as vnetbench_cli
from vnetbench.lab.clean import leftovers
from vnetbench.runner import places
from vnetbench.store.db import Store
from one_namespace_place import IPV4, OneNamespacePlace

pytestmark = pytest.mark.lab

SCENARIO = """
name = "one-namespace"
[lab]
bottleneck = "unlimited"
senders = 2
[matrix]
load = [{proto = "tcp", senders = 2}, {proto = "udp", offered = "50Mbit", senders = 1}]
[workload.stream]
tool = "iperf3"
duration = "2s"
omit = "0s"
[workload.probe]
tool = "ping"
interval = "10ms"
during = "stream"
[repeat]
repetitions = 2
"""


@pytest.fixture
def registered(monkeypatch):
    """The one registration line a new place adds to PLACES (first: it answers only to its own option)."""
    monkeypatch.setattr(places, "PLACES", (OneNamespacePlace, *places.PLACES))


def vnetbench(capsys, *argv: str) -> tuple[int, str, str]:
    """`vnetbench ARGV` in this process (where the registration line holds): exit status, stdout, stderr."""
    status = vnetbench_cli.main(list(argv))
    out = capsys.readouterr()
    return status, out.out, out.err


def test_a_toy_place_runs_a_scenario_through_run(registered, capsys, tmp_path):
    scenario = tmp_path / "one.toml"
    scenario.write_text(SCENARIO)
    db = tmp_path / "r.db"
    status, out, err = vnetbench(capsys, "run", str(scenario), "--db", str(db), "--one-namespace", "--no-progress")
    assert status == 0, out + err
    run_id = out.strip().splitlines()[-1].split()[1]
    with Store(db) as store:
        trials = store.trials(run_id)
        assert len(trials) == 2 * 2 and all(t["status"] == "ok" for t in trials), \
            [t["reason"] for t in trials if t["status"] != "ok"]
        values = store.values(run_id)
        configs = {c["labels"]["proto"]: c for c in store.configurations(run_id)}
        udp, tcp = values[configs["udp"]["key"]], values[configs["tcp"]["key"]]
        # iperf3 paces UDP at the offered rate, and none of it is lost inside one namespace
        assert all(x == pytest.approx(50, rel=0.05) for x in udp["throughput.rx_mbps"]), udp["throughput.rx_mbps"]
        # two TCP streams over one namespace's loopback path: no link, only the cores bound them
        assert all(x > 500 for x in tcp["throughput.rx_mbps"]), tcp["throughput.rx_mbps"]
        assert all(0 < x < 2 for x in tcp["rtt.p50_ms"]), tcp["rtt.p50_ms"]
        where = store.run(run_id)["fingerprint"]["endpoints"]
    (variant,) = where.values()
    assert set(variant) == {"r", "s1", "s2"}
    assert len({w["node"] for w in variant.values()}) == 1 and all(
        re.fullmatch(r"one namespace vnb-[0-9a-f]{6}-one", w["node"]) and IPV4 in w["addresses"]
        for w in variant.values()), variant
    assert not [n for n in leftovers() if n.startswith(f"vnb-{run_id[:6]}")]
    status, out, _ = vnetbench(capsys, "clean", "--check", "--one-namespace")
    assert status == 0, out


def test_the_toy_place_refuses_link_conditions_before_building_anything(registered, capsys, tmp_path):
    scenario = tmp_path / "one.toml"
    scenario.write_text(SCENARIO.replace('bottleneck = "unlimited"', 'bottleneck = "100Mbit"'))
    before = set(leftovers())
    status, out, err = vnetbench(capsys, "run", str(scenario), "--db", str(tmp_path / "r.db"), "--one-namespace")
    assert status == 2 and "one namespace has no links to condition (bottleneck)" in err, out + err
    assert set(leftovers()) == before
    if (tmp_path / "r.db").exists():
        with Store(tmp_path / "r.db") as store:
            assert not store.runs()  # nothing stored
