"""A run on a Kubernetes cluster (`vnetbench run SCENARIO --kube`): the same trials as in the lab, between
pods the scenario's ``[kube]`` table places.

The run has a namespace of its own (named by the run's prefix, labelled: :mod:`vnetbench.kube.pods`), one
pod per endpoint (``r`` on ``kube.receiver``'s node, ``s1``.. on ``kube.senders``'), in the pod network or
the nodes' own (``kube.network``). Workloads run in the pods through the API's exec
(:class:`vnetbench.kube.node.PodNode`); servers are started once and restarted as in the lab. Nothing on the
nodes is changed: link conditions and offloads are refused before anything is made (conditions inside the
pods, opt-in, come later), and this machine's CPU is not the pods' (CPU on the nodes: later).
Teardown deletes the namespace, with everything in it.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from typing import Any

from vnetbench.errors import ScenarioError
from vnetbench.impair.links import LinkManager, lab_links
from vnetbench.kube import api, pods
from vnetbench.kube.node import PodNode
from vnetbench.lab.environments import Variant
from vnetbench.lab.teardown import Registry
from vnetbench.lab.topology import Group, Lab
from vnetbench.runner.bench import DumbbellBench
from vnetbench.runner.recorders import LinkRecorder, Recorder
from vnetbench.scenario.plan import Configuration

KUBE = Variant("bare")


@dataclass
class KubePlacement:
    """Which node each endpoint's pod runs on, and in which network."""

    receiver: str
    senders: list[str]  # one node per sender the run uses
    network: str
    image: str
    pull_policy: str

    def pod_specs(self) -> list[pods.PodSpec]:
        host = self.network == "host"
        nodes = {"r": self.receiver, **{f"s{i}": n for i, n in enumerate(self.senders, 1)}}
        # NET_ADMIN: every trial begins without what TCP remembers of earlier ones (`ip tcp_metrics flush`,
        # DumbbellBench._forget_tcp_metrics): in a pod, its own network's cache; with hostNetwork, the node's, as
        # on an SSH host.
        return [pods.PodSpec(name, self.image, node=node, host_network=host, pull_policy=self.pull_policy,
                             net_admin=True) for name, node in nodes.items()]


def placement(configs: list[Configuration], source: str, default_image: str) -> KubePlacement:
    """The scenario's ``[kube]`` table, checked against what a run on a cluster can do, before anything is made.
    Raises ScenarioError naming the key and what to change."""
    spec = configs[0].scenario.kube
    if spec is None:
        raise ScenarioError(f"{source}: --kube needs a [kube] table in the scenario naming the nodes the pods run "
                            "on, e.g. [kube] receiver = \"node2\", senders = [\"node1\"]")
    for c in configs:
        if c.scenario.kube != spec:
            raise ScenarioError(f"{source} [configuration {c.label_text}]: [kube] differs between configurations; "
                                "one run places its pods once (sweeping kube.* is not built yet)")
        lab = c.scenario.lab
        if lab.env != "bare":
            raise ScenarioError(f"{source} [configuration {c.label_text}]: lab.env = {lab.env!r} needs the local "
                                "lab: on Kubernetes the endpoints are pods (remove env, or run without --kube)")
        conditioned = sorted(n for n, link in lab_links(lab).items() if not link.is_plain())
        if conditioned:
            raise ScenarioError(f"{source} [configuration {c.label_text}]: link conditions on {', '.join(conditioned)}: "
                                "a run on Kubernetes changes nothing on the cluster's network (conditions inside the "
                                "pods are not built yet); remove them, or set lab.bottleneck = \"unlimited\"")
        if lab.offload != "on":
            raise ScenarioError(f"{source} [configuration {c.label_text}]: lab.offload = {lab.offload!r}: a run on "
                                "Kubernetes leaves the nodes' offloads as they are")
    needed = max(c.active_senders for c in configs)
    senders = [spec.senders[min(i, len(spec.senders) - 1)] for i in range(needed)]
    return KubePlacement(spec.receiver, senders, spec.network, spec.image or default_image, spec.image_pull_policy)


@dataclass
class KubeBench(DumbbellBench):
    """The lab's bench with pods for endpoints: one variant (the cluster as it is), no links to condition."""

    cluster: api.Cluster | None = None
    place: KubePlacement | None = None
    pod_facts: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def for_cluster(cls, run_prefix: str, configs: list[Configuration], cluster: api.Cluster,
                    place: KubePlacement) -> "KubeBench":
        return cls(run_prefix, senders=len(place.senders), pin_cpus=False, variants=[(KUBE, len(place.senders))],
                   configs=list(configs), cluster=cluster, place=place)

    @property
    def namespace(self) -> str:
        return self.run_prefix  # vnb-<id>: a DNS label, and the run's name everywhere else

    def setup(self) -> None:
        registry = Registry()
        registry.add(f"work directory {self.workdir}", lambda: shutil.rmtree(self.workdir, ignore_errors=True))
        self.lab = Lab(self.run_prefix, registry, cpu_wake_latency="not held: the pods' nodes are not this machine")
        cluster, labels = self.cluster, pods.run_labels(self.run_prefix)
        # Registered before it is made: deleting a namespace that was never made is harmless.
        registry.add(f"namespace {self.namespace} on {cluster.server}",
                     lambda: pods.delete_namespace(cluster, self.namespace))
        pods.create_namespace(cluster, self.namespace, labels)
        specs = self.place.pod_specs()
        pods.create_pods(cluster, self.namespace, specs, labels)
        running = pods.wait_running(cluster, self.namespace, [s.name for s in specs])
        credentials = api.write_credentials(cluster, self.workdir / "kube-credentials.json")
        ip_version = self.configs[0].scenario.lab.ip_version
        for s in specs:
            pod = running[s.name]
            ips = [p.ip for p in (pod.status.pod_ips or [])] or [pod.status.pod_ip]
            v4 = next((ip for ip in ips if ":" not in ip), "")
            v6 = next((ip for ip in ips if ":" in ip), "")
            if not (v6 if ip_version == 6 else v4):
                raise ScenarioError(f"pod {self.namespace}/{s.name} has no IPv{ip_version} address ({', '.join(ips)}): "
                                    f"set lab.ip_version to the cluster's")
            self.pod_facts[s.name] = {"node": pod.spec.node_name, "pod": f"{self.namespace}/{s.name}",
                                      "network": self.place.network, "image": s.image,
                                      "image_id": next((c.image_id for c in pod.status.container_statuses or []), None)}
            self.lab.endpoints[s.name] = PodNode(s.name, self.namespace, s.name, credentials, registry, ipv4=v4,
                                                 ipv6=v6, node=pod.spec.node_name, host_network=s.host_network,
                                                 facts=self.pod_facts[s.name])
        self.lab.groups[KUBE] = Group(KUBE, "", None, "r", [f"s{i}" for i in range(1, len(self.place.senders) + 1)])
        self.lab.bringup_s[KUBE] = 0.0
        self.links = LinkManager(self.lab, registry, self.workdir, self.run_prefix, mtu=self.mtu)
        self.start_servers()

    @property
    def server_workdir(self) -> str:
        return "/tmp"  # in the pods: the tools image's own, and the pod's alone

    def recorders(self, group: Group) -> list[Recorder]:
        return [LinkRecorder(self.links)]  # this machine's CPUs are not the nodes'

    def _realise(self, config: Configuration) -> bool:
        return False  # nothing on the cluster changes between configurations

    def _group_offload_unknown(self, config: Configuration) -> None:
        pass

    def _state_problems(self, config: Configuration) -> list[str]:
        return []

    def variant_name(self, group: Group) -> str:
        return "kube"

    def environment_state(self, config: Configuration) -> dict[str, Any]:
        group = self.group(config)
        used = [group.receiver, *group.senders[:config.active_senders]]
        return {"environment": {"variant": "kube", "env": "bare", "network": self.place.network,
                                "pods": {n: self.pod_facts.get(n, {}) for n in used}}}
