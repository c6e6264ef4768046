"""The test cluster itself (tests/kubecluster.py): two nodes Ready, pods on each scheduled where asked, a
command run in a pod through the Kubernetes API (apiserver -> kubelet -> containerd's streaming server, the
path the Kubernetes place will take), pod traffic across nodes over the VXLAN link, a hostNetwork pod in the
node's own network, and nothing of the cluster left after it stops. The client is the `kubernetes` Python
client, run inside the control plane's network (the only place the API is reachable)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import kubecluster

# The test cluster skips TLS verification by design (its kubeconfig says insecure-skip-tls-verify).
pytestmark = [pytest.mark.lab, pytest.mark.kube,
              pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")]

# Runs inside the control plane's network: argv = kubeconfig, namespace, tools image, nodes (JSON).
CLIENT = r'''
import json, sys, time
from kubernetes import client, config, stream

config.load_kube_config(sys.argv[1])
core = client.CoreV1Api()
ns, image, nodes = sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
core.create_namespace({"metadata": {"name": ns, "labels": {"app.kubernetes.io/managed-by": "vnbtest"}}})

def pod(name, node, host_network=False):
    return {"metadata": {"name": name}, "spec": {
        "nodeName": node, "hostNetwork": host_network, "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 0, "enableServiceLinks": False,
        "containers": [{"name": "tools", "image": image, "imagePullPolicy": "Never",
                        "securityContext": {"capabilities": {"add": ["NET_RAW", "NET_ADMIN"]}}}]}}

def run(name, argv):
    """argv in the pod through the API; (exit code, output)."""
    resp = stream.stream(core.connect_get_namespaced_pod_exec, name, ns, command=argv, stdout=True,
                         stderr=True, stdin=False, tty=False, _preload_content=False)
    resp.run_forever(timeout=60)  # to the end of the stream: what came last is still buffered after it
    out = (resp.read_stdout() or "") + (resp.read_stderr() or "")
    resp.close()
    return resp.returncode, out

started = time.monotonic()
pods = {"p1": (nodes[0], False), "p2": (nodes[1], False), "h1": (nodes[0], True)}
for name, (node, host) in pods.items():
    core.create_namespaced_pod(ns, pod(name, node, host))
deadline = time.monotonic() + 120
while True:
    phases = {name: core.read_namespaced_pod(name, ns).status for name in pods}
    if all(s.phase == "Running" for s in phases.values()):
        break
    if time.monotonic() > deadline:
        raise SystemExit(f"pods not Running: {[(n, s.phase, s.container_statuses) for n, s in phases.items()]}")
    time.sleep(0.5)
result = {"running_after_s": round(time.monotonic() - started, 1),
          "ips": {name: s.pod_ip for name, s in phases.items()},
          "nodes": {name: core.read_namespaced_pod(name, ns).spec.node_name for name in pods}}
result["exec_eth0"] = run("p1", ["ip", "-4", "-o", "addr", "show", "dev", "eth0"])
result["mtu"] = run("p1", ["cat", "/sys/class/net/eth0/mtu"])
result["ping"] = run("p1", ["ping", "-c", "5", "-i", "0.2", "-W", "2", result["ips"]["p2"]])
result["host_links"] = run("h1", ["ip", "-o", "link"])
result["false"] = run("p1", ["sh", "-c", "exit 3"])
core.delete_namespace(ns)
deadline = time.monotonic() + 120
while any(n.metadata.name == ns for n in core.list_namespace().items):
    if time.monotonic() > deadline:
        raise SystemExit(f"namespace {ns} not deleted within 120 s")
    time.sleep(0.5)
print(json.dumps(result))
'''


KILLED_SESSION = """
import sys, time
import kubecluster
with kubecluster.cluster() as c:
    c.api("api/v1/namespaces/default/pods", {"metadata": {"name": "left"}, "spec": {
        "nodeName": "node1", "automountServiceAccountToken": False,
        "containers": [{"name": "tools", "image": c.tools_image.name, "imagePullPolicy": "Never"}]}})
    while (c.api("api/v1/namespaces/default/pods/left") or {}).get("status", {}).get("phase") != "Running":
        time.sleep(0.3)
    print("ready", flush=True)
    time.sleep(600)
"""


def test_what_a_killed_session_left_is_removed_by_the_next(k8s):
    """A session killed with its cluster up and a pod running leaves processes (they run in sessions of their
    own), namespaces, cgroups and its directory; the next cluster's start removes them all, and nothing of a
    live session's (this session's cluster, up meanwhile, stays Ready)."""
    tests = Path(kubecluster.__file__).parent
    proc = subprocess.Popen([sys.executable, "-c", KILLED_SESSION], stdout=subprocess.PIPE, text=True,
                            cwd=tests, env={**os.environ, "PYTHONPATH": f"{tests}:{os.environ.get('PYTHONPATH', '')}"})
    try:
        assert proc.stdout.readline().strip() == "ready"
    finally:
        proc.kill()
        proc.wait()
    tag = f"{kubecluster.NETNS_PREFIX}{proc.pid}"
    left = kubecluster.leftovers(tag)
    assert any(x.startswith("process") for x in left) and any(x.startswith("netns") for x in left), left
    in_pods = kubecluster._processes_in(kubecluster._cgroups_of(tag))  # the pod's sandbox and its sleep
    assert len(in_pods) >= 2, left
    assert tag in kubecluster.remove_dead_ones()
    assert kubecluster.leftovers(tag) == []
    assert not [pid for pid in in_pods if running(pid)]
    assert {n: c.get("Ready") for n, c in k8s.node_conditions().items()} == {n: "True" for n in k8s.nodes}


def running(pid: int) -> bool:
    """Alive and not a zombie (one killed whose parent, here the machine's init, has not reaped it yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def k8s(kube_cluster):
    return kube_cluster


def test_pods_on_two_nodes_answer_through_the_api_and_reach_each_other_over_vxlan(k8s):
    assert k8s.tools_image is not None
    ns = f"vnbtest-{uuid.uuid4().hex[:8]}"
    p = subprocess.run([*k8s.enter(), sys.executable, "-c", CLIENT, str(k8s.kubeconfig), ns,
                        k8s.tools_image.name, json.dumps(k8s.nodes)], capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, f"{p.stderr[-3000:]}\n--- kubelet-node1:\n{k8s.log_tail('kubelet-node1')}"
    r = json.loads(p.stdout.strip().splitlines()[-1])
    print(json.dumps(r, indent=1))
    # Placed where asked, addressed from each node's own pod range; the hostNetwork pod has the node's.
    assert r["nodes"] == {"p1": "node1", "p2": "node2", "h1": "node1"}
    assert r["ips"]["p1"].startswith("198.18.1.") and r["ips"]["p2"].startswith("198.18.2.")
    assert r["ips"]["h1"] == k8s.node_address("node1")
    # A command through the API: its output and its exit code come back.
    code, out = r["exec_eth0"]
    assert code == 0 and f"inet {r['ips']['p1']}/24" in out
    assert r["false"][0] == 3
    # The pod's MTU is the one the CNI was configured with (VXLAN's 50 bytes less than the fabric's 1500).
    assert r["mtu"] == [0, f"{kubecluster.POD_MTU}\n"]
    # Across nodes over the VXLAN link: every echo answered, in well under a millisecond's order of
    # magnitude on one kernel (the bound only catches a path that is not the direct one: 20 ms).
    code, out = r["ping"]
    assert code == 0 and "5 received" in out, out
    avg_ms = float(out.rsplit("=", 1)[1].split("/")[1])
    assert 0 < avg_ms < 20, out
    assert out.count("ttl=62") == 5, out  # routed by both nodes (64 - 2): the path crosses from node to node
    # The hostNetwork pod sees the node's own interfaces: its fabric veth and the VXLAN device.
    assert " u0@" in r["host_links"][1] and "flannel.1" in r["host_links"][1]


def test_the_machines_sysctls_stay_as_they_were(k8s):
    """The kubelets set vm.overcommit_memory, kernel.panic and kernel.panic_on_oops; each sees its node's
    own files, bind-mounted over /proc/sys in the node's mount namespace, and the machine's stay."""
    assert kubecluster.machine_sysctls() == k8s.machine_sysctls
