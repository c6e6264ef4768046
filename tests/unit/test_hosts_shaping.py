"""Link conditions on real hosts, without a host: the inventory's opt-in, which host carries which link and
on which side, the backend a host's kernel allows, the tc commands, and what `clean --hosts` takes for ours."""

from __future__ import annotations

from pathlib import Path

import pytest

from vnetbench.errors import HostError
from vnetbench.hosts import clean, inventory, shaping
from vnetbench.impair import netem
from vnetbench.impair.model import LinkConditions, lab_links
from vnetbench.runner import hosts_bench
from vnetbench.scenario import load as L
from vnetbench.scenario import plan as P

INVENTORY = """all:
  hosts:
    server-a: {ansible_host: 198.18.204.2, vnetbench_shape_interfaces: [data0, "eth1"]}
    client-1: {ansible_host: 198.18.204.6}
    client-2: {ansible_host: 198.18.204.10, vnetbench_shape_interfaces: eth0}
"""

SCENARIO = """name = "h"
[lab]
bottleneck = "100Mbit"
buffer = "500kB"
senders = 1
[hosts]
receiver = "server-a"
senders = ["client-1"]
[workload.stream]
tool = "iperf3"
"""


def configs(tmp_path: Path, text: str = SCENARIO) -> list:
    (tmp_path / "s.toml").write_text(text)
    return P.expand(L.load(str(tmp_path / "s.toml")))


def inv(tmp_path: Path, text: str = INVENTORY) -> inventory.Inventory:
    (tmp_path / "inv.yml").write_text(text)
    return inventory.load(tmp_path / "inv.yml")


def test_the_opt_in_is_read_from_the_inventory_as_a_list_or_a_string(tmp_path):
    hosts = inv(tmp_path).hosts
    assert hosts["server-a"].shape_interfaces == ("data0", "eth1")
    assert hosts["client-1"].shape_interfaces == ()
    assert hosts["client-2"].shape_interfaces == ("eth0",)
    (tmp_path / "inv.ini").write_text("[servers]\nserver-a ansible_host=198.18.204.2 "
                                      "vnetbench_shape_interfaces=data0,eth1\n")
    assert inventory.load(tmp_path / "inv.ini").hosts["server-a"].shape_interfaces == ("data0", "eth1")


@pytest.mark.parametrize("value,needle", [
    ("[eth0, 'a/b']", "names 'a/b', which is no interface name"),
    ("[averyveryverylongname]", "which is no interface name"),
    ("{a: 1}", "give a list of interface names"),
])
def test_a_bad_opt_in_is_named_with_its_host(tmp_path, value, needle):
    with pytest.raises(inventory.InventoryError) as e:
        inv(tmp_path, f"all:\n  hosts:\n    h1: {{vnetbench_shape_interfaces: {value}}}\n")
    assert "host h1: vnetbench_shape_interfaces" in str(e.value) and needle in str(e.value)


def test_the_bottleneck_goes_on_the_receiver_and_a_senders_link_on_that_sender(tmp_path):
    text = SCENARIO.replace('senders = 1\n', 'senders = 1\n[lab.link.s1]\nforward = { rate = "50Mbit" }\n')
    place = hosts_bench.placement(configs(tmp_path, text), inv(tmp_path, INVENTORY.replace(
        "client-1: {ansible_host: 198.18.204.6}", "client-1: {ansible_host: 198.18.204.6, "
        "vnetbench_shape_interfaces: [data0]}")), "s.toml")
    assert {h: sorted(links) for h, links in place.shaped.items()} == {"server-a": ["bottleneck"],
                                                                      "client-1": ["s1"]}
    assert place.peers("server-a") == ["198.18.204.6"] and place.peers("client-1") == ["198.18.204.2"]
    # forward is the stream's data: it arrives at the receiver and leaves a sender
    assert shaping.side_of("forward", host_upstream=False) == "ingress"
    assert shaping.side_of("reverse", host_upstream=False) == "egress"
    assert shaping.side_of("forward", host_upstream=True) == "egress"
    assert shaping.ifb_name("vnb-0123ab", "ingress") == "vnb-0123ab-i"


def test_a_host_that_did_not_opt_in_is_named_before_connecting(tmp_path):
    text = SCENARIO.replace('senders = 1\n', 'senders = 1\n[lab.link.s1]\nreverse = { rate = "50Mbit" }\n')
    from vnetbench.errors import ScenarioError

    with pytest.raises(ScenarioError) as e:
        hosts_bench.placement(configs(tmp_path, text), inv(tmp_path), "s.toml")
    said = str(e.value)
    assert "puts link conditions on client-1 (s1: reverse: rate 50Mbit)" in said
    assert "add `vnetbench_shape_interfaces: [IFACE]`" in said


def test_a_scenario_without_conditions_changes_no_host(tmp_path):
    place = hosts_bench.placement(configs(tmp_path, SCENARIO.replace('"100Mbit"', '"unlimited"')),
                                  inv(tmp_path), "s.toml")
    assert place.shaped == {}
    assert "tc" not in [t.command for t in hosts_bench.needed_tools(configs(tmp_path, SCENARIO.replace(
        '"100Mbit"', '"unlimited"')))]
    assert "tc" in [t.command for t in hosts_bench.needed_tools(configs(tmp_path))]


def test_a_host_scenario_that_states_no_bottleneck_shapes_nothing(tmp_path):
    """No [lab] table (or one without `bottleneck`): the lab's default 100 Mbit/s is not put on a real host
    (it was, and the run was refused where the inventory did not allow shaping). Stated in the file, on the
    command line or in the matrix, it is."""
    bare = SCENARIO.replace('[lab]\nbottleneck = "100Mbit"\nbuffer = "500kB"\nsenders = 1\n', "")
    assert "[lab]" not in bare
    (tmp_path / "s.toml").write_text(bare)
    one = ["lab.senders=1"]  # one sender host: on the command line, the file has no [lab]
    nothing = P.expand(L.load(str(tmp_path / "s.toml"), one))
    assert [c.scenario.lab.bottleneck for c in nothing] == [None]
    assert hosts_bench.placement(nothing, inv(tmp_path), "s.toml").shaped == {}
    assert "tc" not in [t.command for t in hosts_bench.needed_tools(nothing)]
    stated = P.expand(L.load(str(tmp_path / "s.toml"), [*one, 'matrix.bottleneck=["20Mbit", "unlimited"]']))
    assert [c.scenario.lab.bottleneck for c in stated] == [20e6, None]
    assert set(hosts_bench.placement(stated, inv(tmp_path), "s.toml").shaped) == {"server-a"}
    assert [c.scenario.lab.bottleneck for c in P.expand(L.load(str(tmp_path / "s.toml"), [*one, "bottleneck=30Mbit"]))] \
        == [30e6]
    # The lab's own default is unchanged for a scenario without [hosts].
    lab_only = bare.replace('[hosts]\nreceiver = "server-a"\nsenders = ["client-1"]\n', "")
    assert [c.scenario.lab.bottleneck for c in configs(tmp_path, lab_only)] == [100e6]


def test_the_backend_is_what_the_hosts_kernel_has(tmp_path):
    def spec(text):
        return [lab_links(c.scenario.lab)["bottleneck"] for c in configs(tmp_path, text)]

    rate_only = spec(SCENARIO)
    with_delay = spec(SCENARIO.replace('senders = 1', 'senders = 1\ndelay = "5ms"'))
    both = {"tbf": None, "htb": None, "netem": None}
    no_netem = {"tbf": None, "htb": None, "netem": "not in this kernel"}
    assert shaping.host_backend("bottleneck", rate_only, no_netem, "tbf", "h: ") == "tbf"
    assert shaping.host_backend("bottleneck", rate_only, no_netem, "htb", "h: ") == "htb"
    assert shaping.host_backend("bottleneck", with_delay, both, "tbf", "h: ") == "netem"
    with pytest.raises(HostError) as e:
        shaping.host_backend("bottleneck", with_delay, no_netem, "tbf", "server-a: ")
    assert "server-a: link 'bottleneck'" in str(e.value) and "needs the netem qdisc" in str(e.value)
    assert "not in this kernel" in str(e.value)
    # a sweep gets one instrument, chosen over all it asks: delay 0 then 5 ms is netem for both
    swept = spec(SCENARIO.replace('senders = 1', 'senders = 1\n[matrix]\ndelay = ["0ms", "5ms"]'))
    assert len(swept) == 2 and shaping.host_backend("bottleneck", swept, both, "tbf", "h: ") == "netem"
    explicit = spec(SCENARIO.replace('senders = 1', 'senders = 1\nbackend = "netem"'))
    assert shaping.host_backend("bottleneck", explicit, both, "tbf", "h: ") is None  # nothing left to choose
    with pytest.raises(Exception, match="not available"):
        shaping.host_backend("bottleneck", explicit, no_netem, "tbf", "h: ")


def test_conditions_are_the_lab_kernel_backends_commands_on_the_ifb():
    cond = LinkConditions.model_validate({"rate": "100Mbit", "buffer": "500kB"})
    assert netem.rate_qdisc_commands("", "vnb-0123ab-i", cond, "tbf") == [
        ["tc", "qdisc", "add", "dev", "vnb-0123ab-i", "root", "handle", "1:", "tbf", "rate", "100000000bit",
         "burst", "12500", "limit", "500000"]]
    htb = netem.rate_qdisc_commands("", "x", cond, "htb")
    assert [c[1:4] for c in htb] == [["qdisc", "add", "dev"], ["class", "add", "dev"], ["qdisc", "add", "dev"]]
    assert htb[1][htb[1].index("classid") + 1] == "1:1" and htb[2][htb[2].index("handle") + 1] == "2:"
    delayed = LinkConditions.model_validate({"rate": "100Mbit", "buffer": "500kB", "delay": "5ms"})
    cmds = netem.commands("", "x", delayed)
    assert cmds[0][:8] == ["tc", "qdisc", "add", "dev", "x", "root", "handle", "1:"] and "netem" in cmds[0]
    assert cmds[1][5:9] == ["parent", "1:1", "handle", "10:"]  # the rate qdisc under netem, as in the lab


# `tc -j filter show dev data0 ingress` with one run's steering (tc 6.x), recorded on this machine.
OUR_FILTERS = [
    {"protocol": "ip", "pref": 1, "kind": "u32", "chain": 0},
    {"protocol": "ip", "pref": 1, "kind": "u32", "chain": 0, "options": {"fh": "800:", "ht_divisor": 1}},
    {"protocol": "ip", "pref": 1, "kind": "u32", "chain": 0, "options": {
        "fh": "800::800", "order": 2048, "key_ht": "800", "bkt": "0", "not_in_hw": True,
        "match": {"value": "c612fa02", "mask": "ffffffff", "offmask": "", "off": 12},
        "actions": [{"order": 1, "kind": "mirred", "mirred_action": "redirect", "direction": "egress",
                     "to_dev": "vnb-abcdef-i", "control_action": {"type": "stolen"}, "index": 1, "ref": 1,
                     "bind": 1}]}},
]


def test_clean_takes_only_steering_to_vnetbench_ifbs_of_runs_not_measuring():
    assert clean._steering_only(OUR_FILTERS, skip=())
    assert clean._steering_only([], skip=())  # a clsact whose filters were never added
    assert not clean._steering_only(OUR_FILTERS, skip=("vnb-abcdef",))  # a run measuring now
    theirs = [dict(f) for f in OUR_FILTERS]
    theirs[2] = {**theirs[2], "options": {**theirs[2]["options"], "actions": [
        {**theirs[2]["options"]["actions"][0], "to_dev": "ifb0"}]}}
    assert not clean._steering_only(theirs, skip=())
    assert not clean._steering_only([*OUR_FILTERS, {"protocol": "all", "pref": 49152, "kind": "bpf"}], skip=())


def test_plan_says_where_a_host_scenarios_links_are_made(tmp_path):
    import json

    from helpers import cli

    (tmp_path / "s.toml").write_text(SCENARIO)
    shown = " ".join(cli("plan", str(tmp_path / "s.toml")).stdout.split())
    assert "links: on the hosts, with each host's kernel qdiscs" in shown and "bottleneck on the receiver's interface" in shown
    assert "--hosts INVENTORY can start" in shown or "before it can run here" in shown  # not root: says so
    (tmp_path / "u.toml").write_text(SCENARIO.replace('senders = 1\n', 'senders = 1\nbackend = "userspace"\n'))
    planned = json.loads(cli("plan", str(tmp_path / "u.toml"), "--json").stdout)
    assert any("the emulator runs in the local lab only" in p for p in planned["problems"])


def test_offloads_off_needs_every_endpoint_opted_in_and_ethtool(tmp_path):
    from vnetbench.errors import ScenarioError

    text = SCENARIO.replace('bottleneck = "100Mbit"', 'bottleneck = "unlimited"').replace(
        'senders = 1\n', 'senders = 1\n[matrix]\noffload = ["on", "off"]\n')
    with pytest.raises(ScenarioError) as e:
        hosts_bench.placement(configs(tmp_path, text), inv(tmp_path), "s.toml")
    assert 'puts offloads off (lab.offload = "off") on client-1, and ' in str(e.value)
    both = INVENTORY.replace("client-1: {ansible_host: 198.18.204.6}",
                             "client-1: {ansible_host: 198.18.204.6, vnetbench_shape_interfaces: [data0]}")
    place = hosts_bench.placement(configs(tmp_path, text), inv(tmp_path, both), "s.toml")
    assert place.offload_hosts == ["server-a", "client-1"] and place.shaped == {}
    assert place.changes("client-1")
    assert "ethtool" in [t.command for t in hosts_bench.needed_tools(configs(tmp_path, text))]


def test_clean_restores_only_offload_lines_a_run_could_have_written():
    assert clean._restore_ok(["data0", "tso", "on", "gso", "on", "gro", "off"])
    assert not clean._restore_ok(["data0"])  # nothing to restore
    assert not clean._restore_ok(["data0", "tso"])  # a pair cut short
    assert not clean._restore_ok(["data0", "speed", "10"])  # not an offload
    assert not clean._restore_ok(["a/b", "tso", "on"])  # not an interface name
    assert not clean._restore_ok(["data0", "tso", "$(id)"])


class RecordingConnection:
    """Stands in for a host's SshConnection where only the commands are checked (the integration tests run
    them on real hosts): records each argv, answers success (and, asked for a device, that it is gone)."""

    def __init__(self):
        from vnetbench.hosts.inventory import InventoryHost

        self.host = InventoryHost("server-a", "198.18.204.2")
        self.name = self.host.name
        self.commands: list[list[str]] = []

    def run(self, argv, timeout=30.0, pin=False, root=False):
        import subprocess

        command = list(argv)[4:] if argv[:2] == ["sh", "-c"] else list(argv)  # with_sbin(argv)
        self.commands.append(command)
        if command[:3] == ["ip", "link", "show"]:  # a deleted device is gone
            return subprocess.CompletedProcess(argv, 1, "", 'Device "x" does not exist.')
        return subprocess.CompletedProcess(argv, 0, "[]", "")

    def where(self):
        return "host server-a"


@pytest.mark.parametrize("ip_version,match", [(4, ["protocol", "ip", "prio", "1", "u32", "match", "ip", "src",
                                                   "198.18.205.6/32"]),
                                              (6, ["protocol", "ipv6", "prio", "1", "u32", "match", "ip6", "src",
                                                   "2001:2::6/128"])])
def test_the_receivers_steering_sends_only_the_senders_traffic_through_the_runs_ifb(ip_version, match):
    from vnetbench.lab.teardown import Registry

    conn = RecordingConnection()
    peer = "198.18.205.6" if ip_version == 4 else "2001:2::6"
    registry = Registry()
    link = shaping.HostLink("bottleneck", conn, shaping.InterfaceFacts("data0", 1500, []), [peer], ip_version,
                            "vnb-0123ab", registry, host_upstream=False)
    assert link.steer("forward") == "vnb-0123ab-i" and link.steer("forward") == "vnb-0123ab-i"  # made once
    assert conn.commands == [
        ["ip", "link", "add", "name", "vnb-0123ab-i", "mtu", "1500", "type", "ifb"],
        ["ip", "link", "set", "dev", "vnb-0123ab-i", "up"],
        ["tc", "qdisc", "add", "dev", "data0", "clsact"],
        ["tc", "filter", "add", "dev", "data0", "ingress", *match, "action", "mirred", "egress", "redirect",
         "dev", "vnb-0123ab-i"]]
    assert len(registry.undo) == 1  # one undo, registered before the first command
    conn.commands.clear()
    assert registry.teardown() == []
    assert conn.commands[:2] == [["tc", "qdisc", "del", "dev", "data0", "clsact"],
                                 ["ip", "link", "del", "dev", "vnb-0123ab-i"]]  # the steering first, then its IFB
