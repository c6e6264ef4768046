"""`run --hosts`: the scenario's [hosts] table resolved against an inventory, and what a host run cannot do,
named before any connection is made; the commands a host node runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from vnetbench.errors import ScenarioError
from vnetbench.hosts import inventory
from vnetbench.hosts.inventory import InventoryHost
from vnetbench.hosts.node import WRAPPER, SshNode
from vnetbench.hosts.ssh import SshConnection
from vnetbench.lab import engines
from vnetbench.lab.teardown import Registry
from vnetbench.runner import hosts_bench
from vnetbench.scenario import load as L
from vnetbench.scenario import plan as P

INVENTORY = """all:
  children:
    servers:
      hosts:
        server-a: {ansible_host: 198.18.204.2}
        server-b: {ansible_host: 198.18.204.3}
    clients:
      hosts:
        client-1: {ansible_host: 198.18.204.6}
        client-2: {ansible_host: "2001:2::6"}
"""

SCENARIO = """name = "h"
[lab]
bottleneck = "unlimited"
senders = 1
[hosts]
receiver = "server-a"
senders = "clients"
[workload.stream]
tool = "iperf3"
[workload.rr]
tool = "sockperf"
"""


def place(tmp_path: Path, text: str = SCENARIO, *overrides: str) -> hosts_bench.Placement:
    (tmp_path / "inv.yml").write_text(INVENTORY)
    (tmp_path / "s.toml").write_text(text)
    configs = P.expand(L.load(str(tmp_path / "s.toml"), list(overrides)))
    return hosts_bench.placement(configs, inventory.load(tmp_path / "inv.yml"), "s.toml")


def test_endpoints_are_placed_by_host_or_group_with_their_addresses(tmp_path):
    p = place(tmp_path)
    assert p.receiver.name == "server-a" and [h.name for h in p.senders] == ["client-1"]  # as many as used
    assert p.addresses == {"server-a": "198.18.204.2", "client-1": "198.18.204.6"}
    given = place(tmp_path, SCENARIO.replace('senders = "clients"',
                                             'senders = "clients"\naddresses = { "server-a" = "198.18.205.1" }'))
    assert given.addresses["server-a"] == "198.18.205.1"  # a data-plane address beside SSH's


@pytest.mark.parametrize("change,needle", [
    (("[hosts]\nreceiver = \"server-a\"\nsenders = \"clients\"\n", ""), "needs a [hosts] table in the scenario"),
    (('receiver = "server-a"', 'receiver = "servers"'), "hosts.receiver = 'servers' names 2 hosts"),
    (('receiver = "server-a"', 'receiver = "nobody"'), "no host or group named 'nobody'"),
    (('senders = "clients"', 'senders = ["server-a"]'), "hosts.senders includes the receiver 'server-a'"),
    (('senders = 1', 'senders = 3'), "the scenario uses 3 senders but hosts.senders names 2"),
    (('senders = "clients"', 'senders = "clients"\naddresses = { "x" = "198.18.0.1" }'),
     "hosts.addresses names 'x', which is no endpoint"),
    (('senders = "clients"', 'senders = "clients"\ninterfaces = { "x" = "eth1" }'),
     "hosts.interfaces names 'x', which is no endpoint"),
    (('senders = "clients"', 'senders = "clients"\ninterfaces = { "server-a" = "a/b" }'),
     "hosts.interfaces.server-a = 'a/b' is not an interface name"),
    (('senders = 1', 'senders = 1\nenv = "container"'), "lab.env = 'container' needs the local lab"),
    (('senders = 1', 'senders = 1\noffload = "off"'), 'puts offloads off (lab.offload = "off") on server-a, and '),
    (('bottleneck = "unlimited"', 'bottleneck = "1Gbit"'),
     "puts link conditions on server-a (bottleneck: forward: rate 1Gbit, buffer 500kB), and "),
    (('senders = 1', 'senders = 1\ndelay = "5ms"'), "add `vnetbench_shape_interfaces: [IFACE]`"),
    (('senders = 1', 'senders = 1\nbackend = "userspace"\ndelay = "5ms"'),
     "backend = 'userspace': the emulator runs in the local lab only"),
    (('senders = 1', 'senders = 1\nbottleneck_schedule = "10Mbit/1s 20Mbit/1s"'),
     "only the userspace emulator does (in the local lab)"),
    (('senders = 1', 'senders = 1\nip_version = 6'), "server-a's address 198.18.204.2 is IPv4 but lab.ip_version = 6"),
])
def test_what_a_host_run_cannot_do_is_named_before_connecting(tmp_path, change, needle):
    text = SCENARIO.replace(*change)
    if "ip_version = 6" in text:
        text = text.replace('[workload.rr]\ntool = "sockperf"\n', "")  # Debian's sockperf speaks IPv4 only
    with pytest.raises(ScenarioError) as e:
        place(tmp_path, text)
    assert needle in str(e.value)


def test_an_address_is_checked_as_an_ip_in_the_scenario(tmp_path):
    from vnetbench.errors import ScenarioError as E

    with pytest.raises(E, match=r"hosts.addresses.server-a = 'not an ip' is not an IP address"):
        place(tmp_path, SCENARIO.replace('senders = "clients"', 'senders = "clients"\naddresses = { "server-a" = "not an ip" }'))


def test_the_hosts_need_every_workload_tool_ss_flock_ping_and_ip(tmp_path):
    (tmp_path / "s.toml").write_text(SCENARIO)
    configs = P.expand(L.load(str(tmp_path / "s.toml")))
    assert [t.command for t in hosts_bench.needed_tools(configs)] == ["ss", "flock", "ping", "ip", "iperf3",
                                                                     "sockperf"]


def test_a_host_node_runs_each_command_through_the_wrapper_as_literal_arguments(tmp_path):
    conn = SshConnection(InventoryHost("h", "198.18.0.10", user="bench", port=2222))
    try:
        node = SshNode("h", conn, Registry(), ipv4="198.18.0.10")
        argv = node.command(["iperf3", "-c", "$(id)", "a b"])
        assert argv[0] == "ssh" and argv[-2] == "198.18.0.10"
        # the host's login shell gets: sh -c WRAPPER vnb-exec iperf3 -c '$(id)' 'a b', each one word
        remote = argv[-1]
        assert remote.startswith("sh -c ") and remote.endswith(" vnb-exec iperf3 -c '$(id)' 'a b'")
        # the wrapper is the containers' one, with the host's PATH for its helpers
        assert WRAPPER == engines.EXEC_WRAPPER.replace("/bin/setsid", "setsid").replace(
            "/bin/taskset", "taskset").replace("/bin/sh -c", "sh -c").replace("in the container", "on this host")
    finally:
        conn.close()


def test_the_wrapper_runs_a_command_and_ends_it_when_its_input_closes(tmp_path):
    """What a host's sh does with the wrapper, run here: the exit status comes back; a command still running
    when the client goes (its input closes) is ended with its process group."""
    read_end, write_end = os.pipe()  # held open while it runs, as SshNode.run does
    try:
        done = subprocess.run(["sh", "-c", WRAPPER, "vnb-exec", "sh", "-c", "echo hi; exit 3"], capture_output=True,
                              text=True, timeout=10, stdin=read_end)
        missing = subprocess.run(["sh", "-c", WRAPPER, "vnb-exec", "no-such-tool-vnb"], capture_output=True,
                                 text=True, timeout=10, stdin=read_end)
    finally:
        os.close(read_end)
        os.close(write_end)
    assert (done.returncode, done.stdout) == (3, "hi\n")
    assert missing.returncode == 127 and "no-such-tool-vnb: command not found on this host" in missing.stderr
    marker = tmp_path / "still-running"
    proc = subprocess.Popen(["sh", "-c", WRAPPER, "vnb-exec", "sh", "-c", f"sleep 30; touch {marker}"],
                            stdin=subprocess.PIPE, start_new_session=True)
    proc.stdin.close()  # the ssh client went
    assert proc.wait(timeout=10) == 128 + 15  # SIGTERM, from the wrapper's watcher
    assert not marker.exists()


class LocalHost:
    """A host whose clock is `ahead` seconds ahead of this one's: its `date` answered by a local process
    (the transport is not what is tested here; the arithmetic and the choice of sample are)."""

    def __init__(self, ahead: float, text: str | None = None):
        self.ahead, self.text = ahead, text

    def run(self, argv, **kw):
        code = f"print({self.text!r})" if self.text else f"import time; print(repr(time.time() + {self.ahead}))"
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=10)


def test_a_hosts_clock_offset_is_measured_within_half_a_round_trip():
    for ahead in (0.0, 5.0, -2.5):
        clock = hosts_bench.clock_offset(LocalHost(ahead), samples=4)
        assert clock["samples"] == 4 and 0 < clock["uncertainty_ms"] < 1000
        assert abs(clock["offset_ms"] - ahead * 1e3) <= clock["uncertainty_ms"] + 0.001, clock
    odd = hosts_bench.clock_offset(LocalHost(0, text="1732550000.N"))
    assert odd["offset_ms"] is None and "a date without %N?" in odd["note"]


def test_one_way_delays_are_untrusted_when_the_clocks_are_known_loosely():
    from vnetbench.runner.fingerprint import ONE_WAY_TRUST_MS, clock_note

    tight = {"hosts": {"a": {"clock": {"offset_ms": 0.2, "uncertainty_ms": 0.3}}}}
    assert clock_note(tight) is None and clock_note({}) is None
    loose = {"hosts": {"a": {"clock": {"offset_ms": 0.2, "uncertainty_ms": 0.3}},
                       "b": {"clock": {"offset_ms": -12.34, "uncertainty_ms": 4.0}},
                       "c": {"clock": {"offset_ms": None, "uncertainty_ms": None, "note": "no %N"}}}}
    assert clock_note(loose) == ("One-way delays between hosts are untrusted: clock offsets to the controller "
                                 "b -12.3 ms ± 4.0; c not measured (no %N) "
                                 f"(trusted within {ONE_WAY_TRUST_MS:g} ms); round trips are unaffected.")


def test_plan_names_the_hosts_and_shapes_nothing_that_is_unlimited(tmp_path):
    import json

    from helpers import cli

    (tmp_path / "s.toml").write_text(SCENARIO)
    planned = json.loads(cli("plan", str(tmp_path / "s.toml"), "--json").stdout)
    assert planned["hosts"] == {"receiver": "server-a", "senders": ["clients"], "nodes": {}, "addresses": {},
                                "interfaces": {}, "wait_for_host": 30.0}
    if os.geteuid() == 0:  # the backends are chosen only where the kernel can be probed
        assert planned["links"]["choice"] == {}
    shown = " ".join(cli("plan", str(tmp_path / "s.toml")).stdout.split())
    assert "endpoints on real hosts (vnetbench run ... --hosts INVENTORY): receiver server-a, senders clients" in shown


@pytest.mark.parametrize("address, said", [
    ("fe80::1%$(reboot)", "hosts.addresses.server-a = 'fe80::1%$(reboot)': the scope id after '%' is not an interface name"),
    ("fe80::1%eth0\nrun: 0123456789ab", "hosts.addresses.server-a = 'fe80::1%eth0\\nrun: 0123456789ab': the scope id"),
    ("fe80::1%eth0;reboot", "the scope id after '%' is not an interface name"),
    ("127.0.0.1", "hosts.addresses.server-a = '127.0.0.1' is a loopback, unspecified or multicast address, not one "
                  "of server-a's own"),
    ("::", "is a loopback, unspecified or multicast address"),
])
def test_plan_refuses_an_address_that_is_not_one_a_host_could_have(tmp_path, address, said):
    """A scope id is an interface's name; an address of everyone's (loopback) or no one's is no host's: refused by
    `plan`, from the file and from --set, with the key and what it is."""
    from helpers import cli

    text = SCENARIO.replace('senders = "clients"', 'senders = "clients"\naddresses = { "server-a" = %s }'
                            % json.dumps(address))
    (tmp_path / "s.toml").write_text(text)
    (tmp_path / "plain.toml").write_text(SCENARIO)
    for argv in (["plan", str(tmp_path / "s.toml")],
                 ["plan", str(tmp_path / "plain.toml"), "--set", f"hosts.addresses.server-a={address}"]):
        refused = cli(*argv, check=False)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
        assert said in refused.stderr, refused.stderr
        assert "\nrun: 0123456789ab" not in refused.stderr + refused.stdout  # no line of its own


def test_plan_shows_every_address_traffic_is_sent_to(tmp_path):
    from helpers import cli

    (tmp_path / "s.toml").write_text(SCENARIO.replace(
        'senders = "clients"', 'senders = "clients"\naddresses = { "server-a" = "198.18.205.1", '
        '"client-1" = "fe80::6%data0" }\ninterfaces = { "server-a" = "data0" }'))
    shown = " ".join(cli("plan", str(tmp_path / "s.toml")).stdout.split())
    assert ("traffic to: server-a at 198.18.205.1, client-1 at fe80::6%data0, the other hosts at the inventory's "
            "address; each address given is checked to be on its host's interfaces") in shown, shown
    assert "server-a's traffic through its interface data0" in shown
    (tmp_path / "plain.toml").write_text(SCENARIO)
    assert "traffic to: every host at the inventory's address" in " ".join(cli("plan", str(tmp_path / "plain.toml")).stdout.split())


HOSTILE = "0123456789abcdef:.%$()`;|&<>'\" \n\t\\/*?!{}[]~#=-_" + "fe80" + "\x1b\u202e"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet=HOSTILE, min_size=1, max_size=40))
@example("198.18.0.9").via("accepted")
@example("fe80::1%eth0").via("accepted")
@example("fe80::1%eth0;reboot").via("refused")
@example("fe80::1%$(reboot)").via("refused")
def test_an_address_from_a_hostile_alphabet_is_refused_or_a_plain_address(tmp_path, text):
    """Whatever text a scenario gives as an address, `plan` refuses it in one line naming the key, or it is an
    IP address whose scope id (if any) is an interface name: nothing that a shell or a terminal would read as
    more than one word reaches a host or the operator."""
    import ipaddress
    import re

    path = tmp_path / "addr.toml"
    path.write_text(SCENARIO.replace('senders = "clients"', 'senders = "clients"\naddresses = { "server-a" = %s }'
                                     % json.dumps(text)))
    try:
        loaded = L.load(str(path), [])
    except ScenarioError as e:
        said = str(e)
        assert "hosts.addresses" in said, said
        # The value is quoted, never spliced: no escape, direction override or line of its own.
        assert "\x1b" not in said and "\u202e" not in said, said
        if "\n" in text:
            assert not re.search(r"\S\n|\n\S", text) or text not in said, said
        return
    given_address = loaded.scenario.hosts.addresses["server-a"]
    ip, _, scope = given_address.partition("%")
    ipaddress.ip_address(ip)
    assert scope == "" or re.fullmatch(r"[A-Za-z0-9_.-]{1,15}", scope), given_address
