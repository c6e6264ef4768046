"""A containerlab topology file run as a scenario's topology (issue 31, item 7): its linux nodes as hosts and a
router, its bridge as a switch, conditions on its links declared beside it; each client's round trip is the
delays on its own path."""

from __future__ import annotations

import pytest

from vnetbench.lab import netns
from vnetbench.store.db import Store
from helpers import run_scenario

pytestmark = pytest.mark.lab

CLAB = """
name: sites
topology:
  nodes:
    a:  {kind: linux, image: alpine}
    r1: {kind: linux, image: quay.io/frrouting/frr:10.2.1}
    br: {kind: bridge}
    b:  {kind: linux, image: alpine}
    c:  {kind: linux, image: alpine}
  links:
    - endpoints: ["a:eth1", "r1:eth1"]
    - endpoints: ["r1:eth2", "br:r1"]
    - endpoints: ["br:b", "b:eth1"]
    - endpoints: ["br:c", "c:eth1"]
"""

# a-r1 adds 3 ms each way; br-c 4 ms toward c (the replies to c). b's round trip to a: 6 ms; c's: 10 ms.
SCENARIO = """
name = "clab-sites"
[topology]
containerlab = "{path}"
routers = ["r1"]
server = "a"
[matrix]
"topology.clients" = [["b"], ["c"]]
[lab.link.a-r1]
both = {{delay = "3ms"}}
[lab.link.br-c]
forward = {{delay = "4ms"}}
[workload.probe]
tool = "ping"
interval = "20ms"
duration = "2s"
[repeat]
repetitions = 2
warmup = 0
"""


def test_each_client_of_a_containerlab_topology_meets_the_delays_of_its_own_path(tmp_path):
    clab = tmp_path / "sites.clab.yml"
    clab.write_text(CLAB)
    run_id, db = run_scenario(tmp_path, SCENARIO.format(path=clab))
    with Store(db) as store:
        trials = store.trials(run_id, with_raw=True)
        assert all(t["status"] == "ok" for t in trials), [t["reason"] for t in trials]
        values = store.values(run_id)
        by_client = {c["labels"]["topology.clients"][0]: values[c["key"]] for c in store.configurations(run_id)}
    own = {"b": 6.0, "c": 10.0}
    assert sorted(by_client) == ["b", "c"]
    for client, v in by_client.items():
        # the delays are a floor; the fastest echo within the router's forwarding of it, the median within a
        # scheduling slice (one or two emulators spin on two cores)
        assert all(own[client] - 0.05 <= x <= own[client] + 1.0 for x in v["rtt.min_ms"]), (client, v["rtt.min_ms"])
        assert all(x <= own[client] + 3.0 for x in v["rtt.p50_ms"]), (client, v["rtt.p50_ms"])
    # the endpoints are the file's nodes
    assert {name for t in trials for name in t["raw"]["cores"]["endpoints"]} == {"a", "b", "c"}
    assert not [n for n in netns.list_names() if n.startswith(netns.run_prefix(run_id))]
