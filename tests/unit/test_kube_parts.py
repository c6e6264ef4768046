"""The parts of the Kubernetes place that need no cluster: the exec helper's URL and exit status, what it is
given of a kubeconfig (token, certificates, the choice to skip verification), and the pods' manifests. On
the real cluster: tests/integration/test_kube_pods.py."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from vnetbench.errors import EnvironmentProblem
from vnetbench.kube import api, exec as kexec, pods

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def test_the_exec_url_carries_every_argument_as_its_own_command_parameter():
    url = kexec.exec_url("https://198.18.254.254:6443/", "vnb-abc123", "r", "tools",
                         ["/bin/vnb-exec", "sh", "-c", "echo 'a b' && exit 3"])
    parsed = urlparse(url)
    assert (parsed.scheme, parsed.netloc, parsed.path) == ("wss", "198.18.254.254:6443",
                                                           "/api/v1/namespaces/vnb-abc123/pods/r/exec")
    query = parse_qs(parsed.query)
    assert query["command"] == ["/bin/vnb-exec", "sh", "-c", "echo 'a b' && exit 3"]  # no shell quoting
    assert query["container"] == ["tools"] and query["stdin"] == query["stdout"] == query["stderr"] == ["true"]
    assert kexec.exec_url("http://h:8080", "n", "p", "c", ["x"]).startswith("ws://h:8080/")


# The final status objects as the API sent them on channel 3 (recorded from the test cluster, Kubernetes
# v1.34.4 with containerd 1.6.20, for `true`, `sh -c "exit 7"` and a program that is not there).
SUCCESS = {"metadata": {}, "status": "Success"}
EXIT_7 = {"metadata": {}, "status": "Failure", "message": "command terminated with non-zero exit code: command "
          "terminated with exit code 7", "reason": "NonZeroExitCode",
          "details": {"causes": [{"reason": "ExitCode", "message": "7"}]}}
_NOT_FOUND = ("Internal error occurred: error executing command in container: failed to exec in container: failed to "
              "start exec \"5e5b003c15bcee933af48796291fe3a277099da1b80bc16e21266624592f6884\": OCI runtime exec "
              "failed: exec failed: unable to start container process: exec: \"nope\": executable file not found "
              "in $PATH: unknown")
NOT_FOUND = {"metadata": {}, "status": "Failure", "message": f"Internal error occurred: {_NOT_FOUND}",
             "reason": "InternalError", "details": {"causes": [{"message": _NOT_FOUND}]}, "code": 500}


def test_the_commands_exit_status_comes_from_the_final_status(capsys):
    assert kexec.exit_code(SUCCESS) == 0
    assert kexec.exit_code(EXIT_7) == 7
    assert kexec.exit_code(NOT_FOUND) == 127
    assert "executable file not found" in capsys.readouterr().err


def test_the_helper_says_how_it_is_called_and_an_unreachable_api_as_ssh_does(tmp_path):
    usage = subprocess.run([sys.executable, "-m", "vnetbench.kube.exec"], capture_output=True, text=True)
    assert usage.returncode == 2 and "usage:" in usage.stderr
    creds = tmp_path / "c.json"
    creds.write_text(json.dumps({"host": "https://127.0.0.1:1", "authorization": None, "verify": False}))
    done = subprocess.run([sys.executable, "-m", "vnetbench.kube.exec", str(creds), "ns", "pod", "tools", "true"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 255
    assert "ns/pod: cannot reach the API at https://127.0.0.1:1" in done.stderr
    # an awaited command, streamed from this process, answers the same
    inline = kexec.run_captured(json.loads(creds.read_text()), "ns", "pod", "tools", ["true"], timeout=30)
    assert inline.returncode == 255 and "ns/pod: cannot reach the API at https://127.0.0.1:1" in inline.stderr


def kubeconfig(tmp_path: Path, user: dict, cluster: dict) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://198.18.254.254:6443", **cluster}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}},
                     {"name": "other", "context": {"cluster": "k", "user": "u", "namespace": "x"}}]}))
    return path


def test_a_token_kubeconfig_gives_the_helper_its_header_and_the_choice_not_to_verify(tmp_path):
    cluster = api.connect(str(kubeconfig(tmp_path, {"token": "s3cret"}, {"insecure-skip-tls-verify": True})))
    creds = api.exec_credentials(cluster)
    assert creds["host"] == "https://198.18.254.254:6443"
    assert creds["authorization"] == "Bearer s3cret"
    assert creds["verify"] is False
    path = api.write_credentials(cluster, tmp_path / "creds.json")
    assert path.stat().st_mode & 0o777 == 0o600 and json.loads(path.read_text()) == creds


def test_a_certificate_kubeconfig_gives_the_helper_the_ca_and_the_client_pair(tmp_path):
    for name in ("ca.crt", "c.crt", "c.key"):
        (tmp_path / name).write_text("-----BEGIN X-----\n-----END X-----\n")
    cluster = api.connect(str(kubeconfig(
        tmp_path, {"client-certificate": str(tmp_path / "c.crt"), "client-key": str(tmp_path / "c.key")},
        {"certificate-authority": str(tmp_path / "ca.crt")})), context="other")
    creds = api.exec_credentials(cluster)
    assert creds["authorization"] is None and creds["verify"] is True
    assert (creds["ca"], creds["cert"], creds["key"]) == tuple(str(tmp_path / n) for n in ("ca.crt", "c.crt", "c.key"))
    options = kexec._ssl_options(creds)
    assert options["ca_certs"] == creds["ca"] and options["certfile"] == creds["cert"]


def test_a_kubeconfig_that_cannot_be_read_is_named_with_what_to_do(tmp_path):
    with pytest.raises(EnvironmentProblem, match=r"kubeconfig .*missing.*--kubeconfig FILE"):
        api.connect(str(tmp_path / "missing"))
    with pytest.raises(EnvironmentProblem, match=r"context nope"):
        api.connect(str(kubeconfig(tmp_path, {"token": "t"}, {})), context="nope")


def test_a_pods_manifest_places_it_labels_it_and_never_pulls_by_default():
    labels = pods.run_labels("vnb-abc123")
    assert labels == {"app.kubernetes.io/managed-by": "vnetbench", "vnetbench.io/run": "vnb-abc123"}
    m = pods.PodSpec("r", "localhost/vnetbench/tools:1", node="node2").manifest(labels)
    # the run's labels, and its own (what a Service in front of it selects)
    assert m["metadata"] == {"name": "r", "labels": {**labels, "vnetbench.io/pod": "r"}}
    spec = m["spec"]
    assert spec["nodeName"] == "node2" and spec["hostNetwork"] is False and "nodeSelector" not in spec
    [container] = spec["containers"]
    assert container["imagePullPolicy"] == "Never"
    # no capability: ping by datagram sockets, which the pod's own network opens to every group
    assert "securityContext" not in container
    assert spec["securityContext"] == {"sysctls": [{"name": "net.ipv4.ping_group_range", "value": "0 2147483647"}]}
    assert spec["automountServiceAccountToken"] is False
    h = pods.PodSpec("h", "img:1", node_selector={"zone": "a"}, host_network=True, net_admin=True).manifest(labels)
    assert h["spec"]["hostNetwork"] is True and h["spec"]["nodeSelector"] == {"zone": "a"}
    # on the node's network: no sysctl of its own, NET_RAW for ping
    assert h["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] == ["NET_RAW", "NET_ADMIN"]
    assert "securityContext" not in h["spec"]
    a = pods.PodSpec("a", "img:1", net_admin=True).manifest(labels)
    assert a["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] == ["NET_ADMIN"]
    assert [p.pod_security for p in (pods.PodSpec("r", "i"), pods.PodSpec("a", "i", net_admin=True),
                                     pods.PodSpec("h", "i", host_network=True))] == ["baseline", "privileged", "privileged"]
    assert pods.selector() == "app.kubernetes.io/managed-by=vnetbench"
    assert pods.selector("vnb-abc123") == "app.kubernetes.io/managed-by=vnetbench,vnetbench.io/run=vnb-abc123"


KUBE_SCENARIO = """name = "k"
[lab]
bottleneck = "unlimited"
senders = 3
[kube]
receiver = "node2"
senders = ["node1", "node3"]
[workload.stream]
tool = "iperf3"
duration = "2s"
omit = "0s"
"""


def kube_configs(text: str = KUBE_SCENARIO):
    from vnetbench.scenario.load import load_text
    from vnetbench.scenario.plan import expand

    return expand(load_text(text, "k.toml"))


def test_the_kube_table_places_one_pod_per_endpoint_the_last_node_taking_the_senders_left():
    from vnetbench.kube.bench import placement

    plan = placement(kube_configs(), "k.toml", "localhost/vnetbench/tools:abc")
    assert plan.resolve(["node1", "node2", "node3"]) == []
    [place] = plan.placements.values()
    assert (place.receiver, place.senders, place.network, place.kind) == \
        ("node2", ("node1", "node3", "node3"), "pod", "cross-node")
    specs, groups = plan.pods()
    assert {s.name: s.node for s in specs} == {"r": "node2", "s1": "node1", "s2": "node3", "s3": "node3"}
    assert groups == {place.key: ("r", ["s1", "s2", "s3"])}
    assert all(s.image == "localhost/vnetbench/tools:abc" and s.pull_policy == "Never" and s.net_admin
               and not s.host_network for s in specs)
    host = placement(kube_configs(KUBE_SCENARIO.replace('senders = ["node1", "node3"]',
                                                        'senders = "node1"\nnetwork = "host"\nimage = "reg/t:1"\n'
                                                        'image_pull_policy = "IfNotPresent"')), "k.toml", "")
    assert host.resolve(["node1", "node2"]) == []
    [place] = host.placements.values()
    assert place.senders == ("node1",) * 3 and host.image == "reg/t:1" and host.pull_policy == "IfNotPresent"
    assert all(s.host_network for s in host.pods()[0])


def test_a_registry_pushed_to_is_pulled_from_and_named_as_an_address():
    from vnetbench.errors import ScenarioError
    from vnetbench.kube.bench import placement
    from vnetbench.kube.image import pushed_name, tools_image_name

    pushed = kube_configs(KUBE_SCENARIO.replace('[kube]\n', '[kube]\nregistry = "reg.example:5000/team/"\n'))
    assert pushed[0].scenario.kube.registry == "reg.example:5000/team"
    name = pushed_name("reg.example:5000/team")
    assert name == "reg.example:5000/team/vnetbench/tools:" + tools_image_name().rpartition(":")[2]
    plan = placement(pushed, "k.toml", name)
    assert plan.image == name and plan.pull_policy == "IfNotPresent"
    always = kube_configs(KUBE_SCENARIO.replace('[kube]\n', '[kube]\nregistry = "r"\nimage_pull_policy = "Always"\n'))
    assert placement(always, "k.toml", "r/x:1").pull_policy == "Always"
    assert placement(kube_configs(), "k.toml", "img:1").pull_policy == "Never"
    for value, says in (('"https://reg.example"', "is not a registry's address"),
                        ('"reg.example/team:1"', "is not a registry's address"),
                        ('"Reg.Example"', "is not a registry's address")):
        with pytest.raises(ScenarioError, match=says):
            kube_configs(KUBE_SCENARIO.replace('[kube]\n', f'[kube]\nregistry = {value}\n'))
    with pytest.raises(ScenarioError, match="kube.image and kube.registry both given"):
        kube_configs(KUBE_SCENARIO.replace('[kube]\n', '[kube]\nregistry = "r"\nimage = "a:1"\n'))
    with pytest.raises(ScenarioError, match="the nodes would never pull what the run pushes"):
        kube_configs(KUBE_SCENARIO.replace('[kube]\n', '[kube]\nregistry = "r"\nimage_pull_policy = "Never"\n'))


SWEPT = KUBE_SCENARIO.replace('senders = ["node1", "node3"]\n', '').replace(
    "senders = 3", "senders = 2").replace(
    "[workload.stream]", '[matrix]\n"kube.network" = ["pod", "host"]\n"kube.placement" = ["same-node", "cross-node"]\n'
    "[workload.stream]")


def test_in_a_namespace_the_user_names_the_pods_carry_the_runs_name_and_the_run_asks_for_what_it_does():
    from vnetbench.kube.bench import placement

    text = KUBE_SCENARIO.replace("[workload.stream]",
                                 '[matrix]\n"kube.path" = ["pod-ip", "service"]\n[workload.stream]')
    own = placement(kube_configs(text), "k.toml", "img:1")
    shared = placement(kube_configs(text), "k.toml", "img:1", namespace="team-a")
    for plan in (own, shared):
        assert plan.resolve(["node1", "node2", "node3"]) == []
    # the endpoints keep their names; their objects, in a namespace other runs share, carry the run's
    specs, groups = shared.pods("vnb-abc123-")
    assert [s.name for s in specs] == [s.name for s in own.pods()[0]] and groups == own.pods()[1]
    r = specs[0]
    assert (r.name, r.object_name, r.labels) == ("r", "vnb-abc123-r", {"vnetbench.io/pod": "vnb-abc123-r"})
    assert r.manifest(pods.run_labels("vnb-abc123"))["metadata"]["name"] == "vnb-abc123-r"
    # a run of its own makes and deletes its namespace; in the user's, it deletes its pods and Services by name
    assert own.needs()[:2] == [("create", "namespaces", ""), ("delete", "namespaces", "")]
    assert ("delete", "pods", "") not in own.needs()
    assert not any(resource == "namespaces" for _, resource, _ in shared.needs())
    assert {("create", "pods/exec", ""), ("delete", "pods", ""), ("create", "services", ""),
            ("list", "endpointslices", "discovery.k8s.io")} <= set(shared.needs())
    pod_ip_only = placement(kube_configs(), "k.toml", "img:1", namespace="team-a")
    assert pod_ip_only.resolve(["node1", "node2", "node3"]) == []
    assert not any(resource == "services" for _, resource, _ in pod_ip_only.needs())


def test_a_sweep_of_network_and_placement_shares_a_pod_per_node_and_network():
    from vnetbench.kube.bench import placement

    configs = kube_configs(SWEPT)
    plan = placement(configs, "k.toml", "img:1")
    assert plan.nodes() == ["node2"]  # cross-node nodes are the cluster's: known once it is read
    # cross-node senders go on the Ready nodes other than the receiver's, the last taking the senders left
    assert plan.resolve(["node1", "node2"]) == []
    by_labels = {(c.labels["kube.network"], c.labels["kube.placement"]): plan.placements[c.key] for c in configs}
    assert {k: (p.senders, p.kind) for k, p in by_labels.items()} == {
        ("pod", "same-node"): (("node2", "node2"), "same-node"),
        ("pod", "cross-node"): (("node1", "node1"), "cross-node"),
        ("host", "same-node"): (("node2", "node2"), "same-node"),
        ("host", "cross-node"): (("node1", "node1"), "cross-node")}
    specs, groups = plan.pods()
    # a receiver pod per network (both placements measure against it), a sender pod per node, network and place
    assert [(s.name, s.node, s.host_network) for s in specs if s.name.startswith("r")] == \
        [("r", "node2", False), ("r2", "node2", True)]
    assert len([s for s in specs if s.name.startswith("s")]) == 8
    assert {groups[p.key][0] for k, p in by_labels.items() if k[0] == "pod"} == {"r"}
    assert len({tuple(groups[p.key][1]) for p in by_labels.values()}) == 4
    assert str(by_labels[("host", "cross-node")]) == "kube(network=host, r=node2, s=node1)"
    # a cluster of one node has no cross-node placement
    alone = placement(configs, "k.toml", "img:1")
    assert alone.resolve(["node2"]) == ["kube.placement = \"cross-node\" needs a Ready node besides the receiver's "
                                        "'node2' (Ready: node2)"]


def test_a_service_path_reaches_the_same_receiver_pod_and_has_no_ping():
    from vnetbench.errors import ScenarioError
    from vnetbench.kube.bench import placement

    text = KUBE_SCENARIO.replace("[workload.stream]",
                                 '[matrix]\n"kube.path" = ["pod-ip", "service"]\n[workload.stream]')
    plan = placement(kube_configs(text), "k.toml", "img:1")
    assert plan.resolve(["node1", "node2", "node3"]) == []
    specs, groups = plan.pods()
    # both paths end at one receiver pod (through its Service or at its own address) and share the senders
    assert [r for r, _ in groups.values()] == ["r", "r"] and len({tuple(s) for _, s in groups.values()}) == 1
    assert [s.labels for s in specs if s.name.startswith("r")] == [{"vnetbench.io/pod": "r"}]
    assert {str(p) for p in plan.placements.values()} == {"kube(network=pod, r=node2, s=node1,node3)",
                                                          "kube(network=pod, path=service, r=node2, s=node1,node3)"}
    with pytest.raises(ScenarioError, match=r"workload.probe \(ping\) with kube.path = \"service\": a ClusterIP "
                                            "Service carries its ports only"):
        placement(kube_configs(text + '[workload.probe]\ntool = "ping"\nduring = "stream"\n'), "k.toml", "img:1")


def test_a_placement_that_contradicts_the_senders_named_is_refused():
    from vnetbench.errors import ScenarioError

    with pytest.raises(ScenarioError, match="kube.placement = \"same-node\" puts the senders on the receiver's node"):
        kube_configs(KUBE_SCENARIO.replace('[kube]\n', '[kube]\nplacement = "same-node"\n'))
    with pytest.raises(ScenarioError, match="kube.placement = \"cross-node\" keeps the senders off"):
        kube_configs(KUBE_SCENARIO.replace('senders = ["node1", "node3"]',
                                           'senders = ["node2"]\nplacement = "cross-node"'))
    from vnetbench.kube.bench import placement

    with pytest.raises(ScenarioError, match="kube.senders: name the nodes"):
        placement(kube_configs(KUBE_SCENARIO.replace('senders = ["node1", "node3"]\n', '')), "k.toml", "img:1")


@pytest.mark.parametrize("change, message", [
    (('bottleneck = "unlimited"', 'bottleneck = "50Mbit"'), "link conditions on bottleneck"),
    (('senders = 3', 'senders = 3\nenv = "container"'), "lab.env = 'container' needs the local lab"),
    (('senders = 3', 'senders = 3\noffload = "off"'), "leaves the nodes' offloads as they are"),
    (('[kube]\nreceiver = "node2"\nsenders = ["node1", "node3"]\n', ''), "needs a [kube] table"),
    (('[workload.stream]', '[matrix]\n"kube.image" = ["a:1", "b:1"]\n[workload.stream]'),
     "kube.image, kube.registry or kube.image_pull_policy differ between configurations"),
])
def test_what_a_run_on_a_cluster_cannot_do_is_named_with_the_key(change, message):
    from vnetbench.errors import ScenarioError
    from vnetbench.kube.bench import placement

    with pytest.raises(ScenarioError) as e:
        placement(kube_configs(KUBE_SCENARIO.replace(*change)), "k.toml", "img:1")
    assert message in str(e.value) and "k.toml" in str(e.value)


def test_a_kube_scenario_in_the_local_lab_and_kube_options_without_kube_are_refused():
    import argparse

    from vnetbench.errors import ScenarioError, VnetbenchError
    from vnetbench.runner.places.kube import KubePlace
    from vnetbench.runner.places.lab import LabPlace
    from vnetbench.scenario.load import load_text

    with pytest.raises(ScenarioError, match=r"\[kube\] table places the endpoints on a Kubernetes cluster: run it "
                                            r"with --kube"):
        LabPlace().prepare(load_text(KUBE_SCENARIO, "k.toml"), kube_configs())
    with pytest.raises(VnetbenchError, match="--kubeconfig, --context and --namespace go with --kube"):
        KubePlace.from_args(argparse.Namespace(kube=False, kubeconfig="k", context=None))
    with pytest.raises(VnetbenchError, match="--kubeconfig, --context and --namespace go with --kube"):
        KubePlace.from_args(argparse.Namespace(kube=False, kubeconfig=None, context=None, namespace="team-a"))
    for bad in ("Team-A", "team_a", "-a", "a" * 64, ""):
        with pytest.raises(VnetbenchError, match=f"--namespace '{bad}': a namespace's name is a DNS label"):
            KubePlace.from_args(argparse.Namespace(kube=True, kubeconfig=None, context=None, namespace=bad))
    shared = KubePlace.from_args(argparse.Namespace(kube=True, kubeconfig=None, context=None, namespace="team-a"))
    assert shared.clean_command() == "vnetbench clean --kube --namespace team-a"
    assert KubePlace.from_args(argparse.Namespace(kube=False, kubeconfig=None, context=None)) is None
    place = KubePlace.from_args(argparse.Namespace(kube=True, kubeconfig="/k config", context="c"))
    assert place.resume_args() == " --kube --kubeconfig '/k config' --context c"
    assert place.clean_command() == "vnetbench clean --kube --kubeconfig '/k config' --context c"


def test_vnetbench_image_writes_the_tools_image_that_the_nodes_are_checked_for(tmp_path):
    """The image a run on a cluster needs on its nodes (run --kube checks for this name), written as the OCI
    layout `ctr images import` loads; the test cluster loads the same (tests/kubecluster.py)."""
    from vnetbench.kube.image import tools_image_name

    target = tmp_path / "tools.oci.tar"
    done = subprocess.run([sys.executable, "-m", "vnetbench", "image", "--oci", str(target)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    name = tools_image_name()
    assert f"wrote {target}: {name}" in " ".join(done.stdout.split())
    with tarfile.open(target) as tar:
        index = json.loads(tar.extractfile("index.json").read())
        files = set(tar.getnames())
    [entry] = index["manifests"]
    assert entry["annotations"]["io.containerd.image.name"] == name
    assert f"blobs/sha256/{entry['digest'].removeprefix('sha256:')}" in files


def test_plan_says_where_the_pods_go_and_what_a_cluster_refuses(tmp_path):
    scenario = tmp_path / "k.toml"
    scenario.write_text(KUBE_SCENARIO)
    done = subprocess.run([sys.executable, "-m", "vnetbench", "plan", str(scenario)], capture_output=True, text=True,
                          timeout=120)
    text = " ".join(done.stdout.split())
    assert "receiver on node node2, senders on node1, node3, in the pod network" in text
    assert "links: none: a run on Kubernetes changes nothing on the cluster's network" in text
    planned = json.loads(subprocess.run([sys.executable, "-m", "vnetbench", "plan", str(scenario), "--json"],
                                        capture_output=True, text=True, timeout=120).stdout)
    [placed] = planned["kube"]
    assert placed["receiver"] == "node2" and placed["network"] == "pod" and placed["senders"] == ["node1", "node3"]
    swept = tmp_path / "swept.toml"
    swept.write_text(SWEPT)
    text = " ".join(subprocess.run([sys.executable, "-m", "vnetbench", "plan", str(swept)], capture_output=True,
                                   text=True, timeout=120).stdout.split())
    for line in ("receiver on node node2, senders on the receiver's node, in the pod network",
                 "receiver on node node2, senders on the cluster's other Ready nodes, in the nodes' own network"):
        assert line in text, text
    from vnetbench.runner import calibration

    assert planned["estimated_s"]["setup"] < calibration.SECONDS  # this machine is not calibrated: the pods do not run on it
    scenario.write_text(KUBE_SCENARIO.replace('"unlimited"', '"100Mbit"'))
    shaped = " ".join(subprocess.run([sys.executable, "-m", "vnetbench", "plan", str(scenario)], capture_output=True,
                                     text=True, timeout=120).stdout.split())
    assert "before it can run here:" in shaped and "link conditions on bottleneck" in shaped


def test_a_run_resumes_only_where_it_ran():
    from vnetbench.runner.places.kube import KubePlace
    from vnetbench.runner.places.lab import LabPlace

    with pytest.raises(Exception, match=r"ran on the Kubernetes cluster at https://k:6443: resume it with --kube"):
        LabPlace().check_resume({"kube": {"server": "https://k:6443"}}, "abc")
    with pytest.raises(Exception, match="did not run on Kubernetes: resume it without --kube"):
        KubePlace(None, None).check_resume({"hosts": {}}, "abc")
    KubePlace(None, None).check_resume({"kube": {"server": "https://k:6443"}}, "abc")


def test_a_nodes_devices_give_their_mtus_and_the_pod_networks_tunnel():
    """Recorded `ip -d -j link show` of a namespace set up as the test cluster's nodes are: a VXLAN device as
    flannel makes it, the CNI's bridge and a pod's veth on it."""
    from vnetbench.kube.netfacts import encapsulation, interfaces, lasting

    devices = interfaces((FIXTURES / "ip_link_node_vxlan.json").read_text())
    assert devices == {"vb1": {"mtu": 1500, "kind": "veth", "in": "bridge", "master": "cni0"},
                       "vb0": {"mtu": 1450, "kind": "veth"},
                       "flannel.1": {"mtu": 1450, "kind": "vxlan", "vni": 1, "port": 8472},
                       "cni0": {"mtu": 1500, "kind": "bridge"}}
    # the pods' host ends, named after each pod, are one fact per bridge: their MTUs
    assert lasting(devices) == {"vb0": {"mtu": 1450, "kind": "veth"},
                                "flannel.1": {"mtu": 1450, "kind": "vxlan", "vni": 1, "port": 8472},
                                "cni0": {"mtu": 1500, "kind": "bridge"},
                                "veths in cni0": {"mtu": 1500, "kind": "veth", "in": "bridge"}}
    other_pods = {**devices, "veth0a1b": {**devices["vb1"]}, "veth9f8e": {**devices["vb1"], "mtu": 1450}}
    del other_pods["vb1"]
    assert lasting(other_pods)["veths in cni0"]["mtu"] == "1450, 1500"
    assert lasting({**other_pods, "veth77aa": {**devices["vb1"], "mtu": 900}})["veths in cni0"]["mtu"] == \
        "900, 1450, 1500"  # in order of size, not of their text
    assert encapsulation(devices) == "vxlan (flannel.1: VNI 1, UDP 8472, MTU 1450)"
    assert encapsulation({"eth0": {"mtu": 1500, "kind": "device"}}) == "none"
    assert interfaces("") == {}


def test_the_cni_cost_builtin_puts_the_receiver_on_the_first_ready_node_and_sweeps_every_path():
    from vnetbench.kube.bench import placement
    from vnetbench.scenario.load import load
    from vnetbench.scenario.plan import expand

    configs = expand(load("cni-cost"))
    plan = placement(configs, "builtin:cni-cost", "img:1")
    assert plan.nodes() == []  # nothing named: the cluster says
    assert plan.resolve(["worker-b", "worker-a", "worker-c"]) == []
    assert {(p.receiver, p.senders, p.network, p.path, p.kind) for p in plan.placements.values()} == {
        ("worker-a", (node,), network, path, kind) for network in ("pod", "host") for path in ("pod-ip", "service")
        for node, kind in (("worker-a", "same-node"), ("worker-b", "cross-node"))}
    # one receiver pod per network: two on the node's own network (hostNetwork) would listen on the same ports
    specs, groups = plan.pods()
    receivers = [s for s in specs if s.name in {r for r, _ in groups.values()}]
    assert sorted((s.node, s.host_network) for s in receivers) == [("worker-a", False), ("worker-a", True)]
    assert placement(configs, "builtin:cni-cost", "img:1").resolve([]) == ["no node is Ready to run the receiver's pod"]


def test_baseline_pods_ask_for_no_capability_and_the_node_network_is_refused_with_them():
    from vnetbench.errors import ScenarioError
    from vnetbench.kube.bench import placement

    plan = placement(kube_configs(KUBE_SCENARIO
                                  .replace('senders = ["node1", "node3"]', 'senders = ["node1", "node3"]\n'
                                           'pod_security = "baseline"')), "k.toml", "img")
    assert plan.pod_security == "baseline" and plan.resolve(["node1", "node2", "node3"]) == []
    specs, _ = plan.pods()
    assert all(not s.net_admin and s.pod_security == "baseline" for s in specs)
    with pytest.raises(ScenarioError, match=r'kube.network = "host" \(hostNetwork\) is what Pod Security\'s '
                                            r'baseline level forbids'):
        kube_configs(KUBE_SCENARIO.replace('senders = ["node1", "node3"]', 'senders = ["node1"]\n'
                                           'pod_security = "baseline"\nnetwork = "host"'))
    swept = KUBE_SCENARIO + '[matrix]\n"kube.pod_security" = ["privileged", "baseline"]\n'
    with pytest.raises(ScenarioError, match="kube.pod_security differs between configurations"):
        placement(kube_configs(swept), "k.toml", "img")


def test_a_pod_security_refusal_says_which_key_to_change():
    from vnetbench.kube.pods import _pod_security_fix

    body = '{"message": "pods \\"r\\" is forbidden: violates PodSecurity \\"baseline:latest\\": non-default capabilities"}'
    assert "kube.pod_security = \"baseline\"" in _pod_security_fix(pods.PodSpec("r", "i", net_admin=True), body)
    assert "kube.network = \"pod\"" in _pod_security_fix(pods.PodSpec("h", "i", host_network=True), body)
    assert _pod_security_fix(pods.PodSpec("r", "i", net_admin=True), '{"message": "quota exceeded"}') == ""


def test_the_clusters_lock_lapses_a_duration_after_its_last_renewal_and_says_who_held_it():
    import datetime as dt
    from types import SimpleNamespace

    from vnetbench.kube import lock

    t0 = dt.datetime(2026, 11, 29, 8, 0, 0, tzinfo=dt.timezone.utc)
    # MicroTime: always six digits of fraction, UTC (the API server refuses fewer)
    assert lock.micro_time(t0) == "2026-11-29T08:00:00.000000Z"
    assert lock.micro_time(t0.astimezone(dt.timezone(dt.timedelta(hours=2)))) == "2026-11-29T08:00:00.000000Z"

    def lease(renewed, duration=60, holder="vnb-a1 (quick) on ctl pid 7"):
        return SimpleNamespace(spec=SimpleNamespace(holder_identity=holder, lease_duration_seconds=duration,
                                                    renew_time=renewed, acquire_time=t0))

    held = lease(t0 + dt.timedelta(seconds=30))
    assert not lock.lapsed(held, t0 + dt.timedelta(seconds=89))
    assert lock.lapsed(held, t0 + dt.timedelta(seconds=91))
    assert lock.lapsed(lease(t0, duration=5), t0 + dt.timedelta(seconds=6))
    assert lock.lapsed(lease(t0, holder=""), t0)  # nobody holds a Lease without a holder
    assert lock.describe(held, t0 + dt.timedelta(seconds=42)) == \
        "vnb-a1 (quick) on ctl pid 7 since 2026-11-29 08:00:00 UTC, renewed 12 s ago"
    # the controller's name as a label value takes any host name
    assert lock.controller() and len(lock.controller()) <= 63
    assert lock.lock_namespace(None) == "default" and lock.lock_namespace("team-a") == "team-a"


SHAPED = KUBE_SCENARIO.replace('bottleneck = "unlimited"', 'bottleneck = "20Mbit"').replace(
    '[kube]\n', '[kube]\nshape_pods = true\n')


@pytest.mark.parametrize("text, message", [
    (KUBE_SCENARIO.replace('"unlimited"', '"20Mbit"'), "set kube.shape_pods = true"),
    (SHAPED.replace('[kube]\n', '[kube]\nnetwork = "host"\n'), "a hostNetwork pod's interfaces are its node's"),
    (SHAPED.replace('[workload.stream]', '[lab.link.bottleneck]\nbackend = "userspace"\n[workload.stream]'),
     "the emulator runs in the local lab only; in a pod use 'auto', 'tbf', 'htb' or 'netem'"),
    (SHAPED.replace('[workload.stream]', '[matrix]\n"kube.network" = ["pod", "host"]\n[workload.stream]'),
     "[configuration kube.network=host]: link conditions on bottleneck with kube.network = \"host\""),
])
def test_link_conditions_go_in_the_pods_only_where_the_scenario_opts_in_and_never_on_a_nodes_network(text, message):
    from vnetbench.errors import ScenarioError
    from vnetbench.kube.bench import placement

    assert placement(kube_configs(SHAPED), "k.toml", "img:1").resolve(["node1", "node2", "node3"]) == []
    with pytest.raises(ScenarioError) as e:
        placement(kube_configs(text), "k.toml", "img:1")
    assert message in " ".join(str(e.value).split())
    with pytest.raises(ScenarioError, match="kube.shape_pods = true changes the pods' interfaces, which needs "
                                            "NET_ADMIN"):
        kube_configs(SHAPED.replace('[kube]\n', '[kube]\npod_security = "baseline"\n'))


class ScriptedPod:
    """A pod's shell that answers each command from `answers` (argv prefix -> (exit status, stdout, stderr), as
    recorded from this machine's kernel, which has tbf and htb and no netem) and records what it was asked."""

    name = "r"

    def __init__(self, answers):
        self.answers, self.commands = answers, []

    def run(self, argv, timeout=30.0, pin=False, root=False):
        self.commands.append(list(argv))
        for prefix, (status, out, err) in self.answers.items():
            if list(argv[:len(prefix)]) == list(prefix):
                return subprocess.CompletedProcess(argv, status, out, err)
        return subprocess.CompletedProcess(argv, 0, "", "")

    def where(self):
        return "pod vnb-0123ab/r on node node2"


def test_the_qdiscs_a_pod_may_use_are_found_by_trying_each_on_a_probe_ifb_that_is_deleted_after():
    from vnetbench.errors import LabError
    from vnetbench.kube import conditions

    from vnetbench.hosts.preflight import QDISC_MODULES

    assert set(conditions.QDISC_TRIALS) == set(QDISC_MODULES)  # every kernel link backend's qdisc is tried
    pod = ScriptedPod({("tc", "qdisc", "add", "dev", "vnb-0123ab-p", "root", "netem"):
                       (2, "", "Error: Specified qdisc kind is unknown.\n")})
    found = conditions.pod_qdiscs(pod, "vnb-0123ab-p")
    assert found == {"tbf": None, "htb": None,
                     "netem": "the node's kernel refused it: Error: Specified qdisc kind is unknown."}
    assert pod.commands[0] == ["ip", "link", "add", "name", "vnb-0123ab-p", "type", "ifb"]
    assert pod.commands[-1] == ["ip", "link", "del", "dev", "vnb-0123ab-p"]  # nothing of the probe stays
    assert ["tc", "qdisc", "del", "dev", "vnb-0123ab-p", "root"] in pod.commands
    no_ifb = ScriptedPod({("ip", "link", "add"): (2, "", "Error: Unknown device type.\n")})
    with pytest.raises(LabError, match=r"pod vnb-0123ab/r on node node2: cannot make an IFB device for link "
                                       r"conditions \(Error: Unknown device type.\): the node's kernel needs the ifb "
                                       "module"):
        conditions.pod_qdiscs(no_ifb, "vnb-0123ab-p")
    assert len(no_ifb.commands) == 1
    no_tc = ScriptedPod({("tc",): (127, "", "vnb-exec: tc: command not found in the container\n")})
    with pytest.raises(LabError, match="the pod's image has no tc"):
        conditions.pod_qdiscs(no_tc, "vnb-0123ab-p")
    assert no_tc.commands[-1] == ["ip", "link", "del", "dev", "vnb-0123ab-p"]
    # shaping's sbin wrapper is taken off: the pod's sh is busybox's, whose tc applet would stand in for tc
    from vnetbench.hosts.shaping import with_sbin

    assert conditions._as_is(with_sbin(["tc", "-j", "qdisc", "show"])) == ["tc", "-j", "qdisc", "show"]
    assert conditions._as_is(["ip", "-j", "link"]) == ["ip", "-j", "link"]


def test_the_bottleneck_goes_on_each_receiver_pod_and_a_senders_link_on_its_pod_with_the_services_address():
    from vnetbench.kube import conditions
    from vnetbench.kube.bench import KUBE, placement
    from vnetbench.lab.topology import Group

    text = SHAPED.replace("[workload.stream]", '[matrix]\n"kube.path" = ["pod-ip", "service"]\n'
                                               '[lab.link.s2]\nboth = {rate = "5Mbit"}\n[workload.stream]')
    configs = kube_configs(text)
    plan = placement(configs, "k.toml", "img:1")
    assert plan.resolve(["node1", "node2", "node3"]) == []
    _, pods = plan.pods()
    groups = {key: Group(KUBE, "", None, receiver, senders) for key, (receiver, senders) in pods.items()}

    class Endpoint:
        def __init__(self, name, service_ip=None):
            self.ipv4 = {"r": "198.18.1.10", "s1": "198.18.2.11", "s2": "198.18.2.12",
                         "s3": "198.18.2.13"}[name]
            self.service_ip = service_ip

        def address(self, ip_version):
            return self.ipv4

    endpoints = {"r": Endpoint("r", "198.18.3.7"), **{s: Endpoint(s) for s in ("s1", "s2", "s3")}}
    shaped = conditions.carried(configs, lambda c: groups[plan.placements[c.key].key])
    assert {pod: sorted(links) for pod, links in shaped.items()} == {"r": ["bottleneck"], "s2": ["s2"]}
    assert [spec.forward.rate for spec in shaped["s2"]["s2"]] == [5e6]  # the rate declared for that link alone
    peers = conditions.peers(groups, endpoints, 4)
    assert peers["r"] == [endpoints[s].ipv4 for s in ("s1", "s2", "s3")]
    # a sender sends to the receiver's pod and to its Service's ClusterIP, and hears back from both
    assert peers["s2"] == [endpoints["r"].ipv4, "198.18.3.7"]


def test_a_service_paths_clients_send_to_the_clusterip_and_everything_else_is_the_pods():
    from vnetbench.kube.node import PodNode, ThroughService
    from vnetbench.lab.teardown import Registry

    pod = PodNode("r", "vnb-x", "r", Path("/nonexistent"), Registry(), ipv4="198.18.1.10", node="node1")
    with pytest.raises(ValueError, match="pod vnb-x/r has no Service in front of it"):
        ThroughService(pod)
    pod.service_ip = "198.18.3.7"
    through = ThroughService(pod)
    assert through.service_address(4) == "198.18.3.7" and pod.service_address(4) == "198.18.1.10"
    assert (through.name, through.address(4), through.echo_address(4), through.node) == ("r", "198.18.1.10",
                                                                                        "198.18.1.10", "node1")


def test_skopeos_reason_is_its_fatal_message():
    from vnetbench.kube.image import skopeo_reason

    recorded = (Path(__file__).parent.parent / "fixtures" / "skopeo_copy_plain_http_registry.stderr").read_text()
    assert skopeo_reason(recorded) == (
        "trying to reuse blob sha256:4d6c917893df32945cc92760e01ce4720a2ec3e3972d074f471623f6a3b0ef73 at destination: "
        'pinging container registry 198.18.254.254:5000: Get "https://198.18.254.254:5000/v2/": http: server gave '
        "HTTP response to HTTPS client")
    assert skopeo_reason("plain words\n") == "plain words" and skopeo_reason("") == "(nothing on stderr)"


def test_image_push_refuses_what_is_not_a_registrys_address_before_pushing():
    proc = subprocess.run([sys.executable, "-m", "vnetbench", "image", "--push", "https://reg.example/team"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--push: 'https://reg.example/team' is not a registry's address" in proc.stderr
