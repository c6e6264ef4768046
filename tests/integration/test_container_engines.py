"""`env = "docker"` and `env = "podman"` against a real dockerd and a real Podman API service (started by
these tests in namespaces of their own): endpoints are the engine's containers on its own bridge network,
carry traffic both ways, are measured beside bare, are limited by the engine, and leave nothing behind,
after a normal end and after a kill -9 followed by `vnetbench clean`, which never touches a container or
network it did not make. What only Docker has (the userland proxy) is tested on Docker only."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

import engine_daemon
from helpers import ROOT, cli, run_id_of, stored_run_id, two_hop_chain
from vnetbench.lab import cgroups, engines, netns
from vnetbench.lab.environments import Variant
from vnetbench.lab.topology import build_dumbbell
from vnetbench.store.db import Store
from vnetbench.workloads import iperf3, ping

pytestmark = [pytest.mark.lab]

DOCKER_ONLY = pytest.mark.parametrize("engine_host", ["docker"], indirect=True)


@pytest.fixture(scope="module", params=["docker", "podman"])
def engine_host(request):
    """A real engine of each kind for this module, (kind, url); DOCKER_HOST or CONTAINER_HOST points vnetbench
    (and its subprocesses) at it."""
    kind = request.param
    why = engine_daemon.missing(kind)
    if why:
        pytest.skip(why)
    variable = engines.URL_VARIABLES[kind]
    old = os.environ.get(variable)
    with engine_daemon.engine(kind) as url:
        os.environ[variable] = url
        try:
            yield kind, url
        finally:
            if old is None:
                os.environ.pop(variable, None)
            else:
                os.environ[variable] = old


def ours_in_engine(engine_host: tuple[str, str], prefix: str = "vnb-") -> list[str]:
    """Every container and network carrying vnetbench's run label in the test's engine (named `prefix`...)."""
    out = []
    for what in ("container", "network"):
        listing = subprocess.run([*engines.client_argv(*engine_host), what, "ls", *(["-a"] if what == "container" else []),
                                  "--filter", f"label={engines.LABEL_RUN}", "--format",
                                  "{{.Names}}" if what == "container" else "{{.Name}}"],
                                 capture_output=True, text=True, check=True).stdout.split()
        out += [f"{what} {name}" for name in listing if name.startswith(prefix)]
    return out


@pytest.fixture(scope="class")
def pair(engine_host):
    kind, _ = engine_host
    prefix = f"vnb-k{os.getpid() % 10000}"
    t0 = time.perf_counter()
    lab = build_dumbbell(prefix, 1, variants=[(Variant(kind), 1)])
    bringup = time.perf_counter() - t0
    try:
        yield lab, bringup
    finally:
        errors = lab.teardown()
        assert not errors, errors
        assert not [n for n in os.listdir("/var/run/netns") if n.startswith(prefix + "-")]
        assert not ours_in_engine(engine_host), "containers or networks left in the engine"
        assert not engines.cni_state(prefix), "CNI's bookkeeping of the network left behind"


_SCRATCH = tempfile.TemporaryDirectory(prefix="vnbtest-")  # removed when the test process ends


def _scratch(name: str) -> tuple[Path, Path]:
    d = Path(tempfile.mkdtemp(dir=_SCRATCH.name))
    return d / f"{name}.out", d / f"{name}.err"


def assert_traffic_both_ways(r, s, ip_version: int) -> None:
    """Echo requests both ways and a TCP stream from the sender to the receiver, all inside the containers."""
    for a, b in ((s, r), (r, s)):
        out = a.run(["ping", f"-{ip_version}", "-D", "-n", "-i", "0.01", "-c", "20", "-W", "1",
                     b.service_address(ip_version)], timeout=15)
        result = ping.parse(out.stdout)  # -D: iputils' ping, not busybox's applet of the same name
        assert result.received == result.transmitted == 20, out.stdout[-300:] + out.stderr[-300:]
        assert 0 < float(result.rtt_ms.mean()) < 5
    # A sender's TCP stream to the receiver, through the engine's bridge or the lab's switch.
    srv = r.popen(["iperf3", "-s", "-1", "-p", "5201"], *_scratch("srv"), pin=False)
    try:
        deadline = time.monotonic() + 10
        while ":5201" not in r.run(["ss", "-Hltn"]).stdout:
            assert time.monotonic() < deadline and srv.poll() is None, "iperf3 server did not listen"
            time.sleep(0.05)
        spec = iperf3.ClientSpec(server=r.service_address(ip_version), port=5201, proto="tcp", duration=1, omit=0,
                                 rate_bps=None, congestion_control="cubic", length=None, ip_version=ip_version)
        out = s.run(iperf3.client_command(spec), timeout=20)
        tcp = iperf3.parse_client(out.stdout)
        # Two containers on one bridge, veth to veth: tens of Gbit/s on this machine (39 seen); a busy
        # core halves it at worst, a path that is broken or shaped by mistake gives far less.
        assert tcp.received_bps > 1e9, tcp.received_bps
    finally:
        srv.kill()
        srv.wait()


class TestTwoContainers:
    """A receiver and a sender in containers, built once for these tests (and gone before the next ones)."""

    @pytest.mark.parametrize("ip_version", [4, 6])
    def test_containers_carry_traffic_both_ways_on_the_engines_network(self, pair, ip_version):
        lab, _ = pair
        assert_traffic_both_ways(lab.endpoints["r"], lab.endpoints["s1"], ip_version)

    def test_the_path_is_the_engines_own(self, pair, engine_host):
        lab, bringup = pair
        r = lab.endpoints["r"]
        facts = r.facts()
        assert facts["env"] == engine_host[0] and facts["image"].startswith(engines.IMAGE_REPOSITORY + ":")
        inspect = json.loads(subprocess.run([*engines.client_argv(*engine_host), "inspect", facts["container"]],
                                            capture_output=True, text=True, check=True).stdout)[0]
        assert list(inspect["NetworkSettings"]["Networks"]) == [facts["network"]]
        assert inspect["Config"]["Labels"][engines.LABEL_RUN] == lab.run_prefix
        # The receiver's link is the engine's veth on the engine's bridge: that is where conditions attach.
        port = lab.ports["r"]
        assert port.name.startswith("veth") and netns.is_foreign(port.ns.name)
        master = port.ns.ipr.get_links(port.index)[0].get_attr("IFLA_MASTER")
        assert port.ns.ipr.get_links(master)[0].get_attr("IFLA_IFNAME") == facts["network"]
        env = lab.groups[next(iter(lab.groups))].env
        assert env.facts()["version"] and env.facts()["image"]["tools"]["iperf3"]
        # Two containers from a cached image (the first test built it): well under a second each.
        assert next(iter(lab.bringup_s.values())) < 6.0, lab.bringup_s


    def test_a_command_ends_inside_the_container_when_its_client_is_killed(self, pair):
        lab, _ = pair
        r = lab.endpoints["r"]
        proc = r.popen(["sleep", "987"], *_scratch("sleep"), pin=False)
        deadline = time.monotonic() + 10
        while "987" not in r.run(["ps"]).stdout:
            assert time.monotonic() < deadline, "the command never started"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)  # the client only: `docker exec` alone would leave sleep running
        proc.wait()
        while "987" in r.run(["ps"]).stdout:
            assert time.monotonic() < deadline + 5, "the command outlived its client"
            time.sleep(0.05)
        assert r.run(["sh", "-c", "exit 7"]).returncode == 7  # a command's status comes through


@pytest.mark.parametrize("ip_version", [4, 6])
def test_containers_on_their_host_network_sit_on_the_labs_switch_as_bare_hosts_do(engine_host, ip_version,
                                                                                  no_leftovers):
    """network = "host": no engine network at all; each container's own namespace is wired to the lab's switch
    with the underlay addresses a bare endpoint has."""
    kind, _ = engine_host
    prefix = f"vnb-h{os.getpid() % 10000}"
    lab = build_dumbbell(prefix, 1, variants=[(Variant(kind, network="host"), 1)])
    try:
        r, s = lab.endpoints["r"], lab.endpoints["s1"]
        assert r.address(4).startswith("198.18.") and r.address(6).startswith("2001:2::")
        assert r.facts()["network"].startswith("host") and r.ns.name == f"{prefix}-r"
        assert sorted(ours_in_engine(engine_host, prefix)) == [f"container {prefix}-r", f"container {prefix}-s1"]
        port = lab.ports["r"]  # on the lab's switch, like a bare endpoint's, not the engine's
        assert not netns.is_foreign(port.ns.name)
        master = port.ns.ipr.get_links(port.index)[0].get_attr("IFLA_MASTER")
        assert port.ns.ipr.get_links(master)[0].get_attr("IFLA_IFNAME") == "br0"
        assert_traffic_both_ways(r, s, ip_version)
    finally:
        errors = lab.teardown()
        assert not errors, errors
    assert not ours_in_engine(engine_host, prefix)


REFUSED = """
name = "refused"
[lab]
senders = 1
bottleneck = "unlimited"
[matrix]
env = [{env = "bare"}, ENGINE_VARIANT]
[workload.rr]
tool = "sockperf"
duration = "1s"
"""


def refused(engine_host, tmp_path, variant: str) -> str:
    """What `vnetbench run` says of a scenario with this engine variant beside bare; it must build nothing."""
    scenario = tmp_path / "s.toml"
    scenario.write_text(REFUSED.replace("ENGINE_VARIANT", variant.replace("KIND", engine_host[0])))
    proc = cli("run", str(scenario), "--db", str(tmp_path / "r.db"), "--no-progress", check=False, timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert not ours_in_engine(engine_host)
    return proc.stdout + proc.stderr


@pytest.mark.parametrize("variant, needle", [
    ('{env = "KIND", network = "overlay"}', "network=overlay"),
    ('{env = "KIND", network = "host", publish = true}', "no ports to publish"),
])
def test_what_the_engine_cannot_give_is_said_before_anything_is_built(engine_host, tmp_path, variant, needle,
                                                                      no_leftovers):
    assert needle in refused(engine_host, tmp_path, variant)


@DOCKER_ONLY
def test_a_userland_proxy_setting_the_engine_does_not_have_is_refused(engine_host, tmp_path, no_leftovers):
    said = refused(engine_host, tmp_path, '{env = "docker", publish = true, userland_proxy = false}')
    assert "runs with --userland-proxy=true" in said and "start a dockerd with --userland-proxy=false" in said


def test_an_engine_beside_bare_through_the_cli(engine_host, tmp_path, no_leftovers):
    kind, _ = engine_host
    db = tmp_path / "r.db"
    # marked as the built-in marks it: an engine that answers is measured, not left out
    proc = cli("run", "virt-compare", "--db", str(db), "--no-progress",
               "--set", f'env=[{{env="bare"}},{{env="{kind}",if_available=true}}]',
               "--set", 'load=[{proto="tcp",parallel=1},{proto="udp",offered="10Mbit"}]', "--set", 'offload=["on"]',
               "--set", "duration=2s", "--set", "workload.stream.omit=0s", "--set", "repetitions=2",
               "--set", "repeat.warmup=false", timeout=600)
    run_id = run_id_of(proc)
    store = Store(db)
    trials = store.trials(run_id)
    assert len(trials) == 2 * 2 * 2 and all(t["status"] == "ok" for t in trials), \
        [t["reason"] for t in trials if t["status"] != "ok"]
    assert "relative to env=bare" in proc.stdout and kind in proc.stdout
    assert "Left out" not in proc.stderr and "left_out" not in store.run(run_id)["fingerprint"]
    values = store.values(run_id)
    engine_configs = [c for c in store.configurations(run_id) if c["labels"]["env"] == kind]
    assert len(engine_configs) == 2
    for c in engine_configs:
        state = c["lab_state"]["environment"]
        assert state["env"] == state["engine"] == kind and state["version"] and state["image"]["digest"]
        got = values[c["key"]]
        assert len(got["rtt.p50_ms"]) == 2 and all(0 < x < 5 for x in got["rtt.p50_ms"])  # ping, in containers
        if c["labels"]["proto"] == "udp":
            assert all(x == pytest.approx(10, rel=0.1) for x in got["throughput.rx_mbps"])
        else:
            assert all(x > 1000 for x in got["throughput.rx_mbps"])  # 39 Gbit/s seen on this machine
        # the containers' own CPU, from their cgroups: a part of the machine's busy time
        print(c["labels"], "container", got["cpu.container_pct"], "util", got["cpu.util_pct"])
        assert all(0 < x <= u + 1 for x, u in zip(got["cpu.container_pct"], got["cpu.util_pct"])), got
    # Every process said what it used in CPU, in the containers (the exec wrapper's `times`) as on bare
    # namespaces (rusage): the probe's share of the trial is counted apart, the same way in both
    for c in store.configurations(run_id):
        assert len(values[c["key"]]["cpu.probe_pct"]) == 2, c["labels"]
    for c in store.configurations(run_id):
        assert ("cpu.container_pct" in values[c["key"]]) == (c["labels"]["env"] == kind), c["labels"]
    for t in store.trials(run_id, with_raw=True):
        if "container" in t["raw"]["cpu"].get("parts_pct", {}):  # each container by its endpoint
            assert set(t["raw"]["cpu"]["parts_pct"]["container"]) == {f"{kind[0]}-r", f"{kind[0]}-s1"}, t["raw"]["cpu"]
        used = t["raw"]["process_cpu_pct"]  # "workload/host": the hosts are named after their group (b-s1, p-s1)
        assert {k.partition("/")[0] for k in used} == {"stream", "probe"}, used
        # ping is one thread: at most a core over its life (at 10 ms it used under a tick: `times` says 0.00)
        assert all(0 <= v <= 102 for k, v in used.items() if k.startswith("probe/")), used
    store.close()
    assert not ours_in_engine(engine_host)


def test_clean_removes_what_a_killed_run_left_and_nothing_else(engine_host, tmp_path, no_leftovers):
    kind, _ = engine_host
    engine = engines.connect(kind)
    image = engines.tools_image(engine)
    # The user's own container and network: no vnetbench label, so never ours.
    theirs = engine.client.networks.create("users-net", driver="bridge")
    mine = engine.client.containers.run(image.tag, ["sleep", "600"], name="users-box", detach=True, init=True,
                                        network="users-net", ulimits=engine.ulimits() or None)
    try:
        db = tmp_path / "r.db"
        proc = subprocess.Popen([sys.executable, "-m", "vnetbench", "run", "--no-calibration", "virt-compare", "--db", str(db),
                                 "--no-progress", "--set", f'env=[{{env="{kind}"}}]', "--set", 'offload=["on"]',
                                 "--set", 'load=[{proto="tcp",parallel=1}]', "--set", "duration=5s",
                                 "--set", "repetitions=5"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

        deadline = time.monotonic() + 120
        while not (stored_run_id(db) and len([o for o in ours_in_engine(engine_host) if o.startswith("container")]) == 2):
            assert time.monotonic() < deadline and proc.poll() is None, \
                proc.stderr.read().decode()[-2000:] if proc.poll() is not None else "timeout"
            time.sleep(0.2)
        time.sleep(2.0)  # a trial is running: tools inside the containers
        proc.send_signal(signal.SIGKILL)  # no teardown at all
        proc.communicate(timeout=10)
        prefix = netns.run_prefix(stored_run_id(db))
        left = ours_in_engine(engine_host, prefix)
        assert len(left) == 3, left  # two containers and their network
        out = cli("clean", "--run", stored_run_id(db))
        assert "container engine objects" in out.stdout, out.stdout
        assert not ours_in_engine(engine_host) and not engines.cni_state(prefix)
        assert not [n for n in os.listdir("/var/run/netns") if n.startswith(prefix)]
        # The user's own are untouched, and the engine (whose namespace the run had named) still answers.
        mine.reload()
        assert mine.status == "running"
        assert engine.client.networks.get("users-net").name == "users-net"
        assert cli("clean", "--check").returncode == 0
    finally:
        mine.remove(force=True)
        theirs.remove()


def cpu_seconds(dirs: dict) -> tuple[float, int]:
    """A cgroup's CPU time used so far and its throttled periods, as the kernel counts them (v2 or v1)."""
    stat = dict(line.split() for line in (dirs["cpu"] / "cpu.stat").read_text().splitlines())
    if "usage_usec" in stat:  # v2: one file says both
        return int(stat["usage_usec"]) / 1e6, int(stat["nr_throttled"])
    usage = int((Path(str(dirs["cpu"]).replace("/cpu/", "/cpuacct/", 1)) / "cpuacct.usage").read_text())
    return usage / 1e9, int(stat["nr_throttled"])


def test_a_container_the_engine_limits_to_half_a_cpu_gets_half_a_cpu(engine_host, no_leftovers):
    """`cpu_quota = 0.5` is the engine's --cpus 0.5: CFS bandwidth control, 50 ms per 100 ms period. Over any
    stretch of wall time W the container's processes get at most W/2 of CPU, plus one period's quota for a
    stretch that starts and ends mid-period, and a tick at each end; the kernel counts the throttled periods.
    (A ratio of events/s against an unlimited container is not a bound: on a busy machine the unlimited one
    gets less than a CPU, and the ratio rises towards 1; two of ten such runs under a busy core did.)"""
    prefix = f"vnb-q{os.getpid() % 10000}"
    variant = Variant(engine_host[0], cpu_quota=0.5, memory_limit=256 * 2**20)
    lab = build_dumbbell(prefix, 1, variants=[(variant, 1)])
    try:
        r = lab.endpoints["r"]
        facts = r.facts()["limits"]
        assert facts["engine"] == {"NanoCpus": 500_000_000, "CpusetCpus": "", "Memory": 256 * 2**20}
        cgroup = facts["cgroup"]  # what the kernel was told, v1 or v2
        assert cgroup.get("cpu.max", f"{cgroup.get('cpu.cfs_quota_us')} {cgroup.get('cpu.cfs_period_us')}") \
            == "50000 100000"
        dirs = cgroups.dirs_of(r.container.attrs["State"]["Pid"])
        used0, throttled0 = cpu_seconds(dirs)
        t0 = time.monotonic()
        # busybox's shell spinning for 1-2 s (whole seconds of its own clock), inside the container's cgroup
        out = r.run(["sh", "-c", "end=$(($(date +%s) + 2)); while [ $(date +%s) -lt $end ]; do :; done"], timeout=20)
        wall = time.monotonic() - t0
        used, throttled = cpu_seconds(dirs)
        assert out.returncode == 0, out.stderr
        assert used - used0 <= 0.5 * wall + 0.05 + 0.02, (used - used0, wall)
        # Throttled periods, unless the machine was so busy the loop never even reached its quota.
        assert throttled - throttled0 >= 3 or used - used0 < 0.6 * 0.5 * wall, (used - used0, throttled - throttled0)
    finally:
        errors = lab.teardown()
        assert not errors, errors


CPU_LIMIT = """
name = "docker-cpu-quota"
[lab]
senders = 1
bottleneck = "unlimited"
[matrix]
env = [{env = "bare"}, {env = "docker", cpu_quota = 0.5}]
[workload.cpu]
tool = "sysbench"
tests = ["cpu"]
duration = "3s"
[repeat]
repetitions = 2
warmup = false
"""


@DOCKER_ONLY
def test_sysbench_runs_in_a_limited_container_through_the_cli(engine_host, tmp_path, no_leftovers):
    scenario = tmp_path / "cpu.toml"
    scenario.write_text(CPU_LIMIT)
    db = tmp_path / "r.db"
    run_id = run_id_of(cli("run", str(scenario), "--db", str(db), "--no-progress", timeout=300))
    store = Store(db)
    trials = store.trials(run_id)
    assert len(trials) == 4 and all(t["status"] == "ok" for t in trials), [t["reason"] for t in trials]
    by_env = {c["labels"]["env"]: float(np.median(store.values(run_id)[c["key"]]["cpu.events_per_s"]))
              for c in store.configurations(run_id)}
    # Half a CPU against up to a whole one, the same single-threaded work on the same pinned CPU, one trial
    # after another: 0.50-0.52 of bare seen quiet, up to 0.61 with a core kept busy (a busy loop sharing the CPU
    # takes from the unlimited run, not from one already held to half). So at least half, at most all of
    # bare's rate; the bounds leave room for a third process on that CPU. The exact half is the kernel-
    # accounting test above.
    ratio = by_env["docker"] / by_env["bare"]
    assert 0.33 <= ratio <= 1.0, by_env
    store.close()


def test_a_receiver_that_publishes_its_ports_and_joins_first_gets_them_on_both_gateway_addresses(engine_host):
    """The receiver is the first container on its network. Podman's backend made the bridge only then, and bound
    the published ports on the gateway addresses right after: while duplicate address detection held the IPv6
    one, the bind failed ("listen tcp6 [2001:2:0:106::1]:5201: bind: cannot assign requested address", an
    order check's run stopped on it). Each lab is a fresh network and a fresh race: three in a row."""
    kind, _ = engine_host
    for attempt in range(3):
        prefix = f"vnb-q{os.getpid() % 1000}{attempt}"
        lab = build_dumbbell(prefix, 1, variants=[(Variant(kind, publish=True), 1)])
        try:
            r = lab.endpoints["r"]
            env = lab.groups[next(iter(lab.groups))].env
            bridge = env.network.name
            gateways = {r.service_address(4), r.service_address(6)}
            assert gateways == {env.subnet.v4(1), env.subnet.v6(1)}  # published on the engine host's addresses
            index = env.engine_ns.index(bridge)
            held = [a for a in env.engine_ns.ipr.get_addr(index=index, family=10)
                    if a.get_attr("IFA_ADDRESS") == env.subnet.v6(1)]
            assert held and not any((a["flags"] | (a.get_attr("IFA_FLAGS") or 0)) & 0x40 for a in held), held
            assert_traffic_both_ways(r, lab.endpoints["s1"], 4)
        finally:
            errors = lab.teardown()
            assert not errors, errors
    assert not ours_in_engine(engine_host)


PUBLISHED = """
name = "docker-published"
[lab]
senders = 1
bottleneck = "unlimited"
ip_version = 4
[matrix]
env = [{env = "docker", publish = false}, {env = "docker", publish = true}]
test = [{workloads = "rr"}]
[workload.stream]
tool = "iperf3"
duration = "2s"
omit = "0s"
congestion_control = "cubic"
[workload.probe]
tool = "ping"
interval = "10ms"
during = "stream"
[workload.rr]
tool = "sockperf"
mode = "ping-pong"
proto = "tcp"
payload = 64
duration = "2s"
[repeat]
repetitions = 5
warmup = false
"""


@DOCKER_ONLY
def test_a_published_port_through_the_userland_proxy_is_slower_than_the_direct_path(engine_host, tmp_path,
                                                                                    no_leftovers):
    """The test's dockerd runs with Docker's default, --userland-proxy=true: a client reaching the receiver
    through its published port on the engine's host goes through a docker-proxy process, which copies every
    byte in user space between two TCP connections, instead of the bridge alone."""
    scenario = tmp_path / "published.toml"
    scenario.write_text(PUBLISHED)
    db = tmp_path / "r.db"
    run_id = run_id_of(cli("run", str(scenario), "--db", str(db), "--no-progress", timeout=600))
    store = Store(db)
    trials = store.trials(run_id)
    assert all(t["status"] == "ok" for t in trials), [t["reason"] for t in trials]
    published = next(c for c in store.configurations(run_id) if c["labels"].get("publish") is True)
    receiver = published["lab_state"]["environment"]["hosts"]
    facts = next(h for h in receiver.values() if "published" in h)["published"]
    assert facts["userland_proxy"] is True and facts["proxy_processes"] == len(facts["ports"]) == 42
    store.close()
    show = cli("show", run_id, "--db", str(db)).stdout
    assert "shared the machine" not in show or "docker-proxy" not in show  # the proxies work for the run
    data = json.loads(cli("compare", run_id, "--db", str(db), "--by", "publish", "--ref", "false", "--json",
                          "--metric", "rr.p50_us").stdout)
    verdicts = {(cfg["config"], r["metric"]): r["verdict"] for cfg in data["configurations"] for r in cfg["results"]}
    # Every round trip crosses the proxy twice, a user-space relay between two TCP connections: +62% seen on a
    # quiet machine, and a clear verdict in 10 of 10 runs with a core kept busy. 5 trials a side, one metric
    # per configuration: the smallest p-value Mann-Whitney can give is 0.008, so complete separation is a
    # verdict. The stream is declared (its servers' ports are published too) and not run: quiet, the proxy costs
    # it 70% of its rate, but with a core kept busy both paths are bound by the one CPU left (about 10 Gbit/s
    # each, seen), and 2 of 10 runs were inconclusive, so its trials told nothing.
    assert verdicts[("env=docker, workloads=rr", "rr.p50_us")] == "regressed", verdicts


def test_without_the_userland_proxy_published_ports_are_nat_rules_only(tmp_path, no_leftovers):
    """A dockerd started with --userland-proxy=false, as a user who turned it off runs it: a scenario that
    asks for that gets it (checked before the run), no docker-proxy process exists, and the published path
    carries the round trips."""
    why = engine_daemon.missing("docker")
    if why:
        pytest.skip(why)
    scenario = tmp_path / "published.toml"
    scenario.write_text(PUBLISHED.replace("publish = true}", "publish = true, userland_proxy = false}")
                        .replace("repetitions = 5", "repetitions = 2"))
    with engine_daemon.dockerd("--userland-proxy=false") as url:
        db = tmp_path / "r.db"
        run_id = run_id_of(cli("run", str(scenario), "--db", str(db), "--no-progress", timeout=600,
                               env={**os.environ, "DOCKER_HOST": url}))
        store = Store(db)
        trials = store.trials(run_id)
        assert len(trials) == 4 and all(t["status"] == "ok" for t in trials), [t["reason"] for t in trials]
        published = next(c for c in store.configurations(run_id) if c["labels"].get("publish") is True)
        hosts = published["lab_state"]["environment"]["hosts"]
        facts = next(h for h in hosts.values() if "published" in h)["published"]
        assert facts["userland_proxy"] is False and facts["proxy_processes"] == 0 and len(facts["ports"]) == 42
        rr = store.values(run_id)[published["key"]]["rr.p50_us"]
        assert len(rr) == 2 and all(0 < x < 5000 for x in rr), rr
        store.close()


ON_A_TOPOLOGY = two_hop_chain("engine-topology", '[lab]\nenv = "KIND"\n[matrix]\nip_version = [4, 6]\n')


def test_a_topologys_hosts_as_the_engines_containers_measure_its_links(engine_host, tmp_path, no_leftovers):
    """Each workload host of a declared topology is a container of the engine with no engine network: the graph
    wires the host's links, addresses and routes into the container's own namespace (containerlab's nodes), and
    the workloads run in the container. The chain h1 -l1- x1 -l2- h2 through a router: l1 at 30 Mbit/s, l2 5 ms
    each way."""
    kind, _ = engine_host
    scenario = tmp_path / "topology.toml"
    scenario.write_text(ON_A_TOPOLOGY.replace("KIND", kind))
    db = tmp_path / "r.db"
    run_id = run_id_of(cli("run", str(scenario), "--db", str(db), "--no-progress", timeout=300))
    with Store(db) as store:
        trials = store.trials(run_id)
        assert all(t["status"] == "ok" for t in trials), [t["reason"] for t in trials]
        endpoints = store.run(run_id)["fingerprint"]["endpoints"]
        configs = store.configurations(run_id)
        values = store.values(run_id)
    (hosts,) = endpoints.values()
    for name in ("h1", "h2"):  # each host is the engine's container, in its own namespace, at the graph's addresses
        assert hosts[name]["node"].startswith(f"{kind} container vnb-"), hosts[name]
        assert hosts[name]["node"].endswith(f"-{name})"), hosts[name]
        assert hosts[name]["interface"] == "eth0" and hosts[name]["published"] is None, hosts[name]
    for c in configs:
        state = c["lab_state"]["environment"]
        assert state["env"] == kind, state
        v = values[c["key"]]
        print(kind, c["labels"], "rtt.min", v["rtt.min_ms"], "tcp", v["throughput.rx_mbps"], "containers",
              v["cpu.container_pct"])
        # the delay is a floor both ways (10 ms); the container is the host, no bridge or NAT in front of it
        assert all(10 - 0.05 <= x <= 10 + 1.5 for x in v["rtt.min_ms"]), (c["labels"], v["rtt.min_ms"])
        # 30 Mbit/s of frames: 28.7 Mbit/s of TCP payload over IPv4 (1448 of 1514 bytes), 28.4 over IPv6 (1428).
        # No trial above it; at it, the trial that kept the link full: a trial falls short by a transient of its
        # own (one of its seconds 25.3 where the others carried 28.3 here, a whole trial 26.3 in CI), never by
        # more than the link
        assert all(x <= 29.0 for x in v["throughput.rx_mbps"]), (c["labels"], v["throughput.rx_mbps"])
        assert max(v["throughput.rx_mbps"]) >= 27.0, (c["labels"], v["throughput.rx_mbps"])
        # the workloads ran in the containers: their cgroups carried the stream's processes
        assert all(x > 0 for x in v["cpu.container_pct"]), v["cpu.container_pct"]
    assert not ours_in_engine(engine_host)
