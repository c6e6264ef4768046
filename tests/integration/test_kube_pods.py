"""Pods as vnetbench's nodes, on the test cluster (tests/kubecluster.py): the run's labelled namespace and
pods placed on the nodes asked for (vnetbench.kube.pods), commands through the API's exec by the helper
process (vnetbench.kube.exec) and the tools image's wrapper (vnetbench.kube.node.PodNode): output, exit
status, a real iperf3 across nodes with the path's MTU seen in its segment size, and a command stopped in
the pod when its local process's input closes or the process dies."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import uuid

import pytest

import kubecluster
from vnetbench.kube import api, pods
from vnetbench.kube.node import PodNode
from vnetbench.lab.nodes import CPU_MARK, run_holding_input
from vnetbench.lab.teardown import Registry

# The test cluster skips TLS verification by design (its kubeconfig says insecure-skip-tls-verify).
pytestmark = [pytest.mark.lab, pytest.mark.kube,
              pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")]


@pytest.fixture(scope="module")
def endpoints(kube_cluster, tmp_path_factory):
    """r on node2, s1 on node1 (pod network), h1 on node1 in the node's own network; their PodNodes."""
    workdir = tmp_path_factory.mktemp("kube-pods")
    prefix = f"vnb-{uuid.uuid4().hex[:6]}"
    registry = Registry()
    with kube_cluster.entered():
        cluster = api.connect(str(kube_cluster.kubeconfig))
        labels = pods.run_labels(prefix)
        pods.create_namespace(cluster, prefix, labels)
        try:
            image = kube_cluster.tools_image.name
            specs = [pods.PodSpec("r", image, node="node2"), pods.PodSpec("s1", image, node="node1"),
                     pods.PodSpec("h1", image, node="node1", host_network=True)]
            pods.create_pods(cluster, prefix, specs, labels)
            running = pods.wait_running(cluster, prefix, [s.name for s in specs])
            credentials = api.write_credentials(cluster, workdir / "kube-credentials.json")
            nodes = {s.name: PodNode(s.name, prefix, s.name, credentials, registry, ipv4=running[s.name].status.pod_ip,
                                     node=running[s.name].spec.node_name, host_network=s.host_network)
                     for s in specs}
            yield cluster, nodes, workdir
        finally:
            registry.teardown()
            pods.delete_namespace(cluster, prefix)
            assert pods.namespaces_of_runs(cluster) == []  # by label: nothing of the run's is left


def test_the_run_namespace_and_pods_carry_the_labels_cleanup_selects_by(endpoints):
    cluster, nodes, _ = endpoints
    [(namespace, run)] = pods.namespaces_of_runs(cluster)
    assert namespace == run == nodes["r"].namespace
    listed = cluster.core.list_namespaced_pod(namespace, label_selector=pods.selector(run)).items
    assert sorted(p.metadata.name for p in listed) == ["h1", "r", "s1"]
    assert {p.metadata.name: p.spec.node_name for p in listed} == {"r": "node2", "s1": "node1", "h1": "node1"}


def test_a_command_answers_with_its_output_and_exit_status(endpoints):
    _, nodes, _ = endpoints
    done = nodes["r"].run(["sh", "-c", "echo out; echo err >&2; exit 7"], timeout=30)
    assert (done.returncode, done.stdout, done.stderr) == (7, "out\n", "err\n")
    missing = nodes["r"].run(["no-such-tool"], timeout=30)
    assert missing.returncode == 127 and "no-such-tool: command not found" in missing.stderr
    # The host-network pod is in its node's own network: the node's fabric address, not a pod address.
    addresses = nodes["h1"].run(["ip", "-4", "-o", "addr", "show"], timeout=30).stdout
    assert "198.18.254.1/24" in addresses and nodes["h1"].ipv4 == "198.18.254.1"


def test_iperf3_between_pods_on_two_nodes_sees_the_pod_networks_mtu(endpoints):
    _, nodes, workdir = endpoints
    r, s1 = nodes["r"], nodes["s1"]
    server = r.popen(["iperf3", "-s", "-B", r.ipv4], workdir / "srv.out", workdir / "srv.err")
    try:
        for _ in range(50):  # listening: the port is checked from the client, as the lab does
            if s1.run(["sh", "-c", f"echo | nc -w 1 {r.ipv4} 5201"], timeout=30).returncode == 0:
                break
            time.sleep(0.2)
        done = s1.run(["iperf3", "-c", r.ipv4, "-t", "2", "-J"], timeout=60)
    finally:
        server.stdin.close()
        server.wait(timeout=30)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert "error" not in result, result["error"]
    received = result["end"]["sum_received"]["bits_per_second"]
    print(f"iperf3 s1 (node1) -> r (node2) over VXLAN: {received / 1e9:.2f} Gbit/s, "
          f"MSS {result['start']['tcp_mss_default']}")
    # The segment size follows the pod's MTU (1450: the fabric's 1500 less VXLAN's 50): 1450 less 40 bytes of
    # IPv4 and TCP headers and 12 of timestamps.
    assert result["start"]["tcp_mss_default"] == kubecluster.POD_MTU - 40 - 12
    # No rate limit anywhere on this path: it runs as fast as a core moves it (several Gbit/s here); far less
    # would mean the path is not the direct one.
    assert received > 200e6


def test_a_command_stops_in_the_pod_when_its_input_closes_or_its_process_dies(endpoints):
    _, nodes, workdir = endpoints
    r = nodes["r"]
    closed = r.popen(["sleep", "301"], workdir / "closed.out", workdir / "closed.err", timed=True)
    killed = r.popen(["sleep", "302"], workdir / "killed.out", workdir / "killed.err")
    deadline = time.monotonic() + 30
    while not all(f"sleep {n}" in r.run(["ps", "-o", "args"], timeout=30).stdout for n in (301, 302)):
        assert time.monotonic() < deadline, "the commands did not start in the pod"
        time.sleep(0.2)
    closed.stdin.close()  # the wrapper stops the command, then says its CPU time, and the status comes back
    assert closed.wait(timeout=15) == 128 + signal.SIGTERM
    err = (workdir / "closed.err").read_text()
    assert CPU_MARK in err and r.cpu_seconds(closed, workdir / "closed.err") is not None
    killed.kill()  # the helper dies: the stream ends, and the wrapper stops the command (SIGKILL 2 s after TERM)
    killed.wait(timeout=15)
    deadline = time.monotonic() + 10
    while "sleep 30" in (left := r.run(["ps", "-o", "args"], timeout=30).stdout):
        assert time.monotonic() < deadline, f"still running in the pod:\n{left}"
        time.sleep(0.2)


def test_an_awaited_command_past_its_timeout_stops_in_the_pod_and_a_pod_that_is_not_there_is_named(endpoints):
    """run() streams from this process (no helper): its timeout closes the stream, which stops the command in
    the pod as a dead helper does; a pod that does not exist answers 255 with the API's reason, as ssh does."""
    _, nodes, _ = endpoints
    r = nodes["r"]
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        r.run(["sleep", "303"], timeout=2)
    assert time.monotonic() - start < 10  # the deadline, and a stream opened within it
    deadline = time.monotonic() + 15  # the wrapper's TERM, KILL 2 s after
    while "sleep 303" in (left := r.run(["ps", "-o", "args"], timeout=30).stdout):
        assert time.monotonic() < deadline, f"still running in the pod:\n{left}"
        time.sleep(0.2)
    gone = PodNode("gone", r.namespace, "no-such-pod", r.credentials, r.registry, ipv4="198.18.0.9")
    done = gone.run(["true"], timeout=30)
    assert done.returncode == 255 and "the API refused the exec (HTTP 404)" in done.stderr, done


def test_a_command_through_the_api_loads_websocket_client_and_not_the_kubernetes_client(endpoints):
    """A run starts hundreds of commands, and importing the ``kubernetes`` client costs 0.5-1 s each here: the
    helper streams with websocket-client alone. Held by what the helper imports (``-X importtime``), not by a
    time bound, which a loaded machine breaks (CI measured a median of 0.51 s a command where 0.3 s is usual);
    the time per command is printed for whoever reads the log."""
    _, nodes, _ = endpoints
    s1 = nodes["s1"]
    argv = s1.command(["true"])
    # its input held open as PodNode.run holds it: at end of input the pod's wrapper stops the command
    traced = run_holding_input([argv[0], "-X", "importtime", *argv[1:]], timeout=60)
    assert traced.returncode == 0, traced.stderr
    imported = {line.split("|")[-1].strip() for line in traced.stderr.splitlines() if line.startswith("import time:")}
    assert {"vnetbench.kube", "websocket"} <= imported, sorted(imported)  # the helper ran, and streamed with it
    assert not {m for m in imported if m == "kubernetes" or m.startswith("kubernetes.")}, sorted(imported)
    times = []
    for _ in range(10):
        start = time.monotonic()
        assert s1.run(["true"], timeout=30).returncode == 0
        times.append(time.monotonic() - start)
    helper = []
    for _ in range(10):
        start = time.monotonic()
        assert run_holding_input(argv, timeout=30).returncode == 0
        helper.append(time.monotonic() - start)
    times.sort()
    helper.sort()
    print(f"an awaited command through the API: median {times[5] * 1e3:.0f} ms, max {times[-1] * 1e3:.0f} ms; "
          f"through the helper: median {helper[5] * 1e3:.0f} ms, max {helper[-1] * 1e3:.0f} ms")


def test_the_credentials_file_is_the_owners_alone(endpoints):
    _, nodes, _ = endpoints
    mode = nodes["r"].credentials.stat().st_mode & 0o777
    assert mode == 0o600  # it holds the cluster's token
