"""Scenarios on declared topologies (issue 31), measured: over a chain of routers a round trip takes the sum of
the hops' delays both ways, in IPv4 and IPv6; TCP fills the narrowest hop of a chain; in a star each leaf's
round trip is its own link's; in a parking lot each bottleneck carries the flows that cross it; a run leaves
nothing behind, and a killed one is cleaned and resumed."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

from vnetbench.lab import netns
from vnetbench.store.db import Store
from helpers import BUSY_LINK_FILL, ROOT, cli, run_id_of, run_scenario, stored_trials, two_hop_chain

pytestmark = pytest.mark.lab

# l1 adds 4 ms on the way out, l3 5 ms each way, l2 nothing (the kernel's forwarding alone): 14 ms a round
# trip. Any delay applied in a direction it is not declared in, or left out, moves it by 4 ms or more.
CHAIN = """
name = "chain"
[topology]
template = "linear"
hops = 3
[lab.link.l1]
forward = {delay = "4ms"}
[lab.link.l3]
both = {delay = "5ms"}
[matrix]
ip_version = [4, 6]
[workload.probe]
tool = "ping"
interval = "20ms"
duration = "2s"
[repeat]
repetitions = 2
warmup = 0
"""
CHAIN_RTT_MS = 4 + 2 * 5


def _by_label(store: Store, run_id: str, label: str) -> dict:
    values = store.values(run_id)
    return {str(c["labels"][label]): values[c["key"]] for c in store.configurations(run_id)}


def _nothing_left(run_id: str) -> None:
    assert not [n for n in netns.list_names() if n.startswith(netns.run_prefix(run_id))]


def test_over_a_chain_of_routers_a_round_trip_is_the_sum_of_the_hops_delays(tmp_path):
    run_id, db = run_scenario(tmp_path, CHAIN)
    with Store(db) as store:
        trials = store.trials(run_id, with_raw=True)
        assert all(t["status"] == "ok" for t in trials), [t["reason"] for t in trials]
        by_version = _by_label(store, run_id, "ip_version")
    assert sorted(by_version) == ["4", "6"]
    for version, v in by_version.items():
        # Delay is a floor: no echo comes back sooner than the declared sum; the fastest of each trial's 100
        # is within the routers' forwarding of it, the median within a scheduling slice (two emulators spin on
        # two cores, one of them kept busy: 14.1-14.2 ms both, measured). A hop's delay counted in a direction
        # it is not declared in would add 4 ms or more
        assert all(CHAIN_RTT_MS - 0.05 <= x <= CHAIN_RTT_MS + 1.5 for x in v["rtt.min_ms"]), (version, v["rtt.min_ms"])
        assert all(x <= CHAIN_RTT_MS + 3.0 for x in v["rtt.p50_ms"]), (version, v["rtt.p50_ms"])
        # nothing is lost on the links; ping misses only the replies still on their way when its deadline ends it
        # (the last one or two of about 95 requests)
        assert max(v.get("link.lost_packets", [0.0])) == 0, (version, v)
        assert all(x <= 0.03 for x in v["rtt.loss_ratio"]), (version, v["rtt.loss_ratio"])
    # the trial ran between the topology's own hosts, through its links as declared
    for t in trials:
        assert t["raw"]["cores"]["endpoints"].keys() == {"h1", "h2"}, t["raw"]["cores"]
    _nothing_left(run_id)


NARROW = """
name = "narrowest"
[topology]
template = "linear"
hops = 3
node = "switch"
[lab.link.l1]
forward = {rate = "80Mbit"}
[lab.link.l2]
forward = {rate = "30Mbit", buffer = "100kB"}
[lab.link.l3]
forward = {rate = "60Mbit"}
[workload.stream]
tool = "iperf3"
duration = "4s"
omit = "1s"
[repeat]
repetitions = 2
warmup = 0
"""


def test_tcp_fills_the_narrowest_hop_of_a_chain(tmp_path):
    run_id, db = run_scenario(tmp_path, NARROW)
    with Store(db) as store:
        trials = store.trials(run_id)
        assert all(t["status"] == "ok" for t in trials), [t["reason"] for t in trials]
        (v,) = store.values(run_id).values()
    # 30 Mbit/s of frames carry 30 x 1448/1514 = 28.7 Mbit/s of TCP payload; a 100 kB queue keeps the
    # link busy (the window outgrows it), the other hops are faster and never queue
    # (measured with one core kept busy: 28.58-28.69); at least what a busy machine keeps a link filled
    assert all(BUSY_LINK_FILL * 28.7 <= x <= 29.0 for x in v["throughput.rx_mbps"]), v["throughput.rx_mbps"]
    _nothing_left(run_id)


STAR = """
name = "sites"
[topology]
template = "star"
leaves = 3
[lab.link.h1]
both = {delay = "2ms"}
[lab.link.h2]
both = {delay = "9ms"}
[lab.link.h3]
both = {delay = "5ms"}
[matrix]
"topology.clients" = [["h1"], ["h2"], ["h3"]]
[workload.probe]
tool = "ping"
interval = "20ms"
duration = "2s"
[repeat]
repetitions = 2
warmup = 0
"""


def test_in_a_star_each_leafs_round_trip_is_its_own_links(tmp_path):
    run_id, db = run_scenario(tmp_path, STAR)
    with Store(db) as store:
        trials = store.trials(run_id)
        assert all(t["status"] == "ok" for t in trials), [t["reason"] for t in trials]
        by_client = _by_label(store, run_id, "topology.clients")
    own = {"h1": 4.0, "h2": 18.0, "h3": 10.0}  # its link's delay, both ways; the server's link is plain
    assert len(by_client) == 3
    for clients, v in by_client.items():
        (leaf,) = [h for h in own if h in str(clients)]
        # one emulator on the path: its floor, and the median within a scheduling slice (measured with one core
        # kept busy: 0.08-0.11 ms above it); another leaf's link would put it 6 ms or more off
        assert all(own[leaf] - 0.05 <= x <= own[leaf] + 1.0 for x in v["rtt.min_ms"]), (leaf, v["rtt.min_ms"])
        assert all(x <= own[leaf] + 3.0 for x in v["rtt.p50_ms"]), (leaf, v["rtt.p50_ms"])
    medians = {leaf: float(np.median(v["rtt.p50_ms"])) for clients, v in by_client.items()
               for leaf in own if leaf in str(clients)}
    assert medians["h1"] < medians["h3"] < medians["h2"], medians
    _nothing_left(run_id)


# The congestion-control papers' parking lot: the long flow crosses both bottlenecks, each cross flow one. Max-min
# fair shares: 5 / 5 Mbit/s on b1, the long flow's 5 and 25 for cross2 on b2. A ping on the long flow's path
# during them, between hosts of its own choosing too.
PARKING = """
name = "parking"
[topology]
template = "parking-lot"
bottlenecks = 2
[lab.link.b1]
forward = {rate = "10Mbit", buffer = "50kB"}
[lab.link.b2]
forward = {rate = "30Mbit", buffer = "100kB"}
[workload.long]
tool = "iperf3"
duration = "5s"
clients = ["src"]
server = "dst"
[workload.cross1]
tool = "iperf3"
during = "long"
duration = "5s"
clients = ["c1s"]
server = "c1r"
[workload.cross2]
tool = "iperf3"
during = "long"
duration = "5s"
clients = ["c2s"]
server = "c2r"
[workload.probe]
tool = "ping"
during = "long"
interval = "50ms"
clients = ["c1s"]
server = "dst"
[repeat]
repetitions = 2
warmup = 0
"""
GOODPUT = 1448 / 1514  # TCP payload of a full frame


def test_in_a_parking_lot_each_bottleneck_is_shared_by_the_flows_that_cross_it(tmp_path):
    run_id, db = run_scenario(tmp_path, PARKING)
    with Store(db) as store:
        trials = store.trials(run_id, with_raw=True)
        assert all(t["status"] == "ok" for t in trials), [t["reason"] for t in trials]
        ((key, v),) = store.values(run_id).items()
        (config,) = store.configurations(run_id)
    long, cross1, cross2 = (np.array(v[f"throughput.rx_mbps@{w}"]) for w in ("long", "cross1", "cross2"))
    # Each bottleneck is full, and carries exactly the flows whose paths cross it: a flow routed around b1, or
    # through b2 as well, would break the sums (measured with one core kept busy, 20 trials: b1 9.38-9.45, b2
    # 28.4-28.5 of 9.56 and 28.7; a busier CI machine: b2 25.96-27.3): never above a link, at least what a busy
    # machine keeps a link filled (BUSY_LINK_FILL); a flow on the wrong path would leave one link half empty
    assert all(BUSY_LINK_FILL * 10 * GOODPUT <= x <= 10 * GOODPUT * 1.01 for x in long + cross1), (long, cross1)
    assert all(BUSY_LINK_FILL * 30 * GOODPUT <= x <= 30 * GOODPUT * 1.01 for x in long + cross2), (long, cross2)
    # Max-min fairness is the theory the run states; TCP through drop-tail queues departs from it the known way
    # (Floyd 1991): the flow that crosses more congested links gets less than its share, never more, and is
    # not starved (measured: long 1.0-3.1, cross1 6.4-8.4, cross2 25.4-27.5)
    theory = config["expected"]
    assert theory["throughput.rx_mbps@long"] == theory["throughput.rx_mbps@cross1"] == 5.0, theory
    assert theory["throughput.rx_mbps@cross2"] == 25.0, theory
    assert all(0.1 * 5 <= x <= 5 * 1.05 for x in long), long
    assert all(x > y for x, y in zip(cross2, cross1)), (cross1, cross2)
    # how evenly the flows got their shares, each trial: Jain's index over measured / max-min share (measured:
    # 0.73-0.88)
    parts = np.array([long / 5, cross1 / 5, cross2 / 25])
    jain = parts.sum(axis=0) ** 2 / (3 * (parts ** 2).sum(axis=0))
    assert np.allclose(v["flows.maxmin_fairness"], jain, rtol=1e-9), (v["flows.maxmin_fairness"], jain)
    assert all(1 / 3 < x <= 1 for x in jain), jain
    # the probe ran between its own hosts, c1s to dst, through both queues: more than b1's full 40 ms (50 kB at
    # 10 Mbit/s) alone, less than it and b2's 26.7 ms together (measured: 54.6-56.2 ms)
    assert all(40 < x <= 40 + 26.7 + 3 for x in v["rtt.p50_ms"]), v["rtt.p50_ms"]
    assert "rtt.p50_ms@probe" not in v, sorted(v)  # the only ping: its metrics keep their names
    for t in trials:
        assert set(t["raw"]["cores"]["endpoints"]) >= {"src", "dst", "c1s", "c1r", "c2s", "c2r"}, t["raw"]["cores"]
    _nothing_left(run_id)


def test_with_fair_queues_a_parking_lots_flows_get_their_max_min_shares(tmp_path):
    """The same parking lot with fair queueing on both bottlenecks (the userspace emulator's "fq"): each link
    serves its flows in turn, and the flows converge to their max-min fair shares, 5 / 5 / 25 Mbit/s of frames."""
    fair = PARKING.replace('buffer = "50kB"}', 'buffer = "50kB", queue = "fq"}').replace(
        'buffer = "100kB"}', 'buffer = "100kB", queue = "fq"}')
    run_id, db = run_scenario(tmp_path, fair)
    with Store(db) as store:
        trials = store.trials(run_id, with_raw=True)
        assert all(t["status"] == "ok" for t in trials), [t["reason"] for t in trials]
        (v,) = store.values(run_id).values()
    long, cross1, cross2 = (np.array(v[f"throughput.rx_mbps@{w}"]) for w in ("long", "cross1", "cross2"))
    # Through drop-tail queues the long flow got 1.0-3.1 (the test above); here max-min within noise: each flow
    # within 10 % of its share of the payload rate, 4.78 and 23.9 (measured with one core kept busy, 20 trials:
    # long 4.65-4.71, cross1 4.69-4.73, cross2 23.78-23.85; flows.maxmin_fairness 0.9999)
    assert all(abs(x - 5 * GOODPUT) <= 0.1 * 5 * GOODPUT for x in long), long
    assert all(abs(x - 5 * GOODPUT) <= 0.1 * 5 * GOODPUT for x in cross1), cross1
    assert all(abs(x - 25 * GOODPUT) <= 0.1 * 25 * GOODPUT for x in cross2), cross2
    assert all(x >= 0.95 for x in v["flows.maxmin_fairness"]), v["flows.maxmin_fairness"]
    _nothing_left(run_id)


# A matrix over the graph itself: chains of 1, 2 and 4 hops, each a graph of its own built side by side, with an
# emulator on l1 in every one (1 ms each way).
HOPS = """
name = "hops"
[topology]
template = "linear"
[lab.link.l1]
both = {delay = "1ms"}
[matrix]
"topology.hops" = [1, 2, 4]
[workload.probe]
tool = "ping"
interval = "20ms"
duration = "2s"
[repeat]
repetitions = 2
warmup = 0
"""


def test_a_matrix_over_the_graph_measures_each_graph_with_the_others_idle(tmp_path):
    run_id, db = run_scenario(tmp_path, HOPS)
    with Store(db) as store:
        trials = store.trials(run_id, with_raw=True)
        assert all(t["status"] == "ok" for t in trials), [t["reason"] for t in trials]
        by_hops = _by_label(store, run_id, "topology.hops")
        fp = store.run(run_id)["fingerprint"]
    assert sorted(by_hops) == ["1", "2", "4"]
    for hops, v in by_hops.items():
        # l1's 2 ms round trip, whatever the routers add (measured with one core kept busy, 60 trials: 2.01-2.02)
        assert all(2.0 - 0.05 <= x <= 2.0 + 1.0 for x in v["rtt.min_ms"]), (hops, v["rtt.min_ms"])
        # one emulator spins (this graph's); the other graphs' are idle, or two or three cores would be busy
        # (measured: 100.4-102.5)
        assert all(x < 150 for x in v["cpu.util_pct"]), (hops, v["cpu.util_pct"])
    assert [len(g["links"]) for g in fp["topology"]["graphs"]] == [1, 2, 4]
    assert len(fp["endpoints"]) == 3  # each graph's hosts
    _nothing_left(run_id)


def test_a_killed_topology_run_is_cleaned_and_resumed(tmp_path, no_leftovers):
    """SIGKILL while a chain of routers with two emulators on it measures: `vnetbench clean --run` removes its
    every namespace (the nodes' and the emulators'), and the run resumes to completion on a new lab."""
    scenario = tmp_path / "chain.toml"
    scenario.write_text(CHAIN)
    db = tmp_path / "r.db"
    proc = subprocess.Popen([sys.executable, "-m", "vnetbench", "run", "--no-calibration", str(scenario), "--db", str(db),
                             "--no-progress"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while stored_trials(db) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert stored_trials(db) >= 2, proc.communicate(timeout=60)
    finally:
        proc.kill()  # SIGKILL: no teardown at all
        proc.communicate(timeout=10)
    with Store(db) as store:
        run_id = store.runs()[-1]["id"]
    prefix = netns.run_prefix(run_id) + "-"
    left = sorted(n for n in netns.list_names() if n.startswith(prefix))
    assert {f"{prefix}{n}" for n in ("h1", "h2", "x1", "x2", "e+l1", "e+l3")} <= set(left), left
    cleaned = cli("clean", "--run", run_id)
    assert f"removed {len(left)} namespaces" in cleaned.stdout, cleaned.stdout
    assert not [n for n in netns.list_names() if n.startswith(prefix)]
    resumed = cli("run", "--resume", run_id[:6], "--db", str(db), "--no-progress")
    assert run_id_of(resumed) == run_id
    with Store(db) as store:
        trials = store.trials(run_id)
        assert store.run(run_id)["status"] == "completed"
    assert len(trials) == 2 * 2 and all(t["status"] == "ok" for t in trials), [t["reason"] for t in trials]
    _nothing_left(run_id)



# The same chain with its workload hosts bare and in containers (vnetbench's Docker-bridge model: each host's
# namespace the container's node, NAT to a namespace behind it): l1 the bottleneck, l2 5 ms each way.
CONTAINED = two_hop_chain("contained", '[matrix]\n"lab.env" = ["bare", "container"]\nip_version = [4, 6]\n')


def test_a_topologys_hosts_in_containers_measure_the_same_links(tmp_path):
    run_id, db = run_scenario(tmp_path, CONTAINED)
    with Store(db) as store:
        trials = store.trials(run_id)
        assert all(t["status"] == "ok" for t in trials), [t["reason"] for t in trials]
        endpoints = store.run(run_id)["fingerprint"]["endpoints"]
        values = store.values(run_id)
        configs = {(c["labels"]["lab.env"], str(c["labels"]["ip_version"])): values[c["key"]]
                   for c in store.configurations(run_id)}
    assert len(configs) == 4
    # each environment on a graph of its own: bare hosts are the graph's namespaces; a container's is behind
    # its host's, reached at the host's addresses
    bare, contained = (next(v for k, v in endpoints.items() if k.startswith(env)) for env in ("bare", "container"))
    assert all(not e["node"].endswith("-ctr") and e["public"] is None for e in bare.values()), bare
    assert all(e["node"].endswith(f"-{h}-ctr") and e["public"] == " ".join(bare[h]["addresses"])
               for h, e in contained.items()), contained
    for key, v in configs.items():
        # the delay is a floor both ways (10 ms); a container adds its NAT and bridge, microseconds
        assert all(10 - 0.05 <= x <= 10 + 1.5 for x in v["rtt.min_ms"]), (key, v["rtt.min_ms"])
        assert all(x <= 10 + 3.0 for x in v["rtt.p50_ms"]), (key, v["rtt.p50_ms"])
        # 30 Mbit/s of frames: 28.7 Mbit/s of TCP payload over IPv4 (1448 of 1514 bytes), 28.4 over IPv6 (1428);
        # the 100 kB queue keeps the link busy (a busier CI machine: 25.6 over IPv6), as far as a busy machine does
        assert all(BUSY_LINK_FILL * 28.4 <= x <= 29.0 for x in v["throughput.rx_mbps"]), (key, v["throughput.rx_mbps"])
    _nothing_left(run_id)


# The same chain with its workload hosts in the overlays and in guests: VXLAN between the hosts' namespaces across
# the router; routed container blocks, which the router learns (as Calico's BGP tells the fabric); QEMU guests
# that take over their hosts' addresses and routes. l2's emulator is spliced onto h2's own link end (neither end
# is a switch), the device a VXLAN node sends from.
ELSEWHERE = """
name = "elsewhere"
[topology]
template = "linear"
hops = 2
node = "router"
[lab.link.l1]
forward = {rate = "30Mbit", buffer = "100kB"}
[lab.link.l2]
both = {delay = "5ms"}
[matrix]
env = [ENVS]
ip_version = [4, 6]
[workload.probe]
tool = "ping"
interval = "20ms"
duration = "1s"
[workload.stream]
tool = "iperf3"
duration = "2s"
omit = "1s"
[repeat]
repetitions = 2
warmup = 0
"""
# TCP payload of 30 Mbit/s of full frames: 1448 (IPv4) or 1428 (IPv6) of 1514 bytes; VXLAN takes 50 of the 1500
# for its own headers, so 1398 or 1378
ELSEWHERE_MBPS = {("vxlan", "4"): 30 * 1398 / 1514, ("vxlan", "6"): 30 * 1378 / 1514,
                  ("routed", "4"): 30 * 1448 / 1514, ("routed", "6"): 30 * 1428 / 1514}


def test_a_topologys_hosts_in_overlays_and_guests_cross_its_router(tmp_path):
    from vnetbench.lab import environments
    from vnetbench.lab.environments import Variant

    envs = ['{env = "overlay", overlay = "vxlan"}', '{env = "overlay", overlay = "routed"}']
    guests = not environments.problems([Variant("vm")])
    if guests:
        envs.append('{env = "vm"}')
    run_id, db = run_scenario(tmp_path, ELSEWHERE.replace("ENVS", ", ".join(envs)))
    with Store(db) as store:
        trials = store.trials(run_id)
        assert all(t["status"] == "ok" for t in trials), [t["reason"] for t in trials]
        values = store.values(run_id)
        configs = {(c["labels"].get("overlay") or c["labels"]["env"], str(c["labels"]["ip_version"])):
                   (values[c["key"]], c["lab_state"]["environment"]) for c in store.configurations(run_id)}
    assert len(configs) == 2 * len(envs)
    for (env, version), (v, state) in configs.items():
        hosts = state["hosts"]
        # the declared 2 x 5 ms is a floor, whatever carries the packets
        assert all(10 - 0.05 <= x for x in v["rtt.min_ms"]), (env, version, v["rtt.min_ms"])
        if env == "vm":
            # The guests run under TCG here (no KVM): a full-speed stream needs more CPU than one emulated core
            # has beside a busy one, so l1's rate is a ceiling. The guests route through x1 in both versions.
            assert all(1 <= x <= 29.0 for x in v["throughput.rx_mbps"]), (env, version, v["throughput.rx_mbps"])
            assert hosts["h1"]["routes"] == {"0.0.0.0/0": "198.18.0.1", "::/0": "2001:2::1"}, hosts["h1"]
            continue
        # a bridge and a forward cost the overlays under 0.1 ms a round trip
        assert all(x <= 10 + 1.5 for x in v["rtt.min_ms"]), (env, version, v["rtt.min_ms"])
        expected = ELSEWHERE_MBPS[(env, version)]
        # no trial above the link; at it, the trial that kept it full (a trial falls short by a transient of its
        # own: one of 1 s came out 25.5 in CI, 2.8 under the link)
        assert all(x <= expected + 0.3 for x in v["throughput.rx_mbps"]), (env, version, expected, v["throughput.rx_mbps"])
        assert max(v["throughput.rx_mbps"]) >= expected - 1.0, (env, version, expected, v["throughput.rx_mbps"])
        if env == "vxlan":
            # each node's tunnel goes to the other's address, on the router's other side
            assert hosts["h1"]["vxlan_remotes"] == hosts["h2"]["underlay_address"][:1], hosts
        else:
            # each node reaches the other's block through x1, and x1 through the node itself
            assert hosts["h1"]["routes"] == {hosts["h2"]["block"][0]: "198.18.0.1"}, hosts
            (router,) = state["fabric_routes"].values()
            assert router == {**{h["block"][0]: h["underlay_address"][0] for h in hosts.values()},
                              **{h["block"][1]: h["underlay_address"][1] for h in hosts.values()}}, router
    _nothing_left(run_id)
