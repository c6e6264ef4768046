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
from helpers import UNSHAPED_STREAMS, check_unshaped_streams
from one_namespace_place import IPV4, OneNamespacePlace

pytestmark = pytest.mark.lab

SCENARIO = f"""
name = "one-namespace"
[lab]
bottleneck = "unlimited"
senders = 2
[matrix]
load = [{{proto = "tcp", senders = 2}}, {{proto = "udp", offered = "50Mbit", senders = 1}}]
{UNSHAPED_STREAMS}[repeat]
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
        # two TCP streams and a paced UDP one over one namespace's loopback: no link, only the cores bound them
        check_unshaped_streams(store, run_id, trials=2 * 2)
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
