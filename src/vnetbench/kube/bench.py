"""A run on a Kubernetes cluster (`vnetbench run SCENARIO --kube`): the same trials as in the lab, between
pods the scenario's ``[kube]`` table places.

The run has a namespace of its own (named by the run's prefix, labelled: :mod:`vnetbench.kube.pods`), or
the one the user names (``--namespace``, for users who may not make namespaces), and one
pod per endpoint (``r`` on ``kube.receiver``'s node, ``s1``.. on ``kube.senders``'), in the pod network or
the nodes' own (``kube.network``). A matrix over ``kube.network``, ``kube.placement`` (same-node,
cross-node) or the nodes gives each configuration a placement of its own (:class:`KubePlan`): the pods of
every placement are made at setup, a group of them per placement, as a lab's environment variants are.
``kube.path = "service"`` puts a ClusterIP Service in front of the receiver's pod, and its senders send to the
Service. Workloads run in the pods through the API's exec (:class:`vnetbench.kube.node.PodNode`); servers
are started once and restarted as in the lab. Nothing on the nodes is changed: offloads are refused before
anything is made, and link conditions are too unless ``kube.shape_pods`` lets the run make them inside the pods,
on their own interfaces (:mod:`vnetbench.kube.conditions`). The CPUs measured are the nodes', sampled in the
pods (this machine's are not theirs).
Teardown deletes the run's namespace, with everything in it; in a namespace the user named, the run's
labelled pods and Services alone.
"""

from __future__ import annotations

import re
import shutil
import time
from dataclasses import dataclass, field, replace
from typing import Any

from vnetbench.errors import LabError, ScenarioError
from vnetbench.hosts import shaping
from vnetbench.impair.links import lab_links
from vnetbench.kube import api, conditions, netfacts, pods
from vnetbench.kube.node import PodNode, ThroughService
from vnetbench.lab.environments import Variant
from vnetbench.lab.teardown import Registry
from vnetbench.lab.topology import Group, Lab
from vnetbench.runner.bench import DumbbellBench
from vnetbench.runner.hosts_bench import UPTIME_CLOCK, clock_offset, machine_id
from vnetbench.runner.recorders import LinkRecorder, NodesCpuRecorder, Recorder
from vnetbench.scenario.plan import Configuration
from vnetbench.workloads.base import TrialEndpoints

KUBE = Variant("bare")


@dataclass(frozen=True)
class KubePlacement:
    """Where one configuration's endpoints run: the receiver's node, each sender's, and the network."""

    receiver: str
    senders: tuple[str, ...]  # one node per sender the configuration uses
    network: str
    path: str = "pod-ip"  # or "service": through a ClusterIP Service in front of the receiver's pod

    @property
    def key(self) -> str:
        return f"{self.network}:{self.path}:{self.receiver}:{','.join(self.senders)}"

    @property
    def kind(self) -> str:
        """same-node, cross-node, or mixed (some senders on the receiver's node)."""
        on_receivers = [n == self.receiver for n in self.senders]
        return "same-node" if all(on_receivers) else "cross-node" if not any(on_receivers) else "mixed"

    def __str__(self) -> str:
        via = ", path=service" if self.path == "service" else ""
        return f"kube(network={self.network}{via}, r={self.receiver}, s={','.join(dict.fromkeys(self.senders))})"


@dataclass
class KubePlan:
    """The run's pods: one configuration's placement each (a matrix over kube.network, kube.placement or the
    nodes gives several), and the pods they need: one per receiver node and network, one per sender node,
    network and place among the senders. Configurations that share an endpoint's node and network share its
    pod, so a same-node and a cross-node configuration measure against the same receiver."""

    image: str
    pull_policy: str
    wanted: dict[str, tuple[Any, int]]  # configuration key -> (its KubeSpec, senders it uses)
    pod_security: str = "privileged"  # the level every pod keeps to (kube.pod_security)
    namespace: str | None = None  # the user's (--namespace); None: the run makes one of its own
    placements: dict[str, KubePlacement] = field(default_factory=dict)  # configuration key -> placement (resolve)

    def nodes(self) -> list[str]:
        """Every node the run's pods go on, once resolved; before: the nodes the scenario names."""
        if self.placements:
            return list(dict.fromkeys(n for p in self.placements.values() for n in (p.receiver, *p.senders)))
        return list(dict.fromkeys(n for spec, _ in self.wanted.values() for n in (spec.receiver, *spec.senders)
                                  if n is not None))

    def resolve(self, ready: list[str]) -> list[str]:
        """Each configuration's placement on a cluster whose Ready nodes are `ready` (cross-node senders, where
        not named, go on the Ready nodes other than the receiver's, in order); the problems, where it cannot."""
        problems = []
        ready = sorted(ready)
        for key, (spec, needed) in self.wanted.items():
            receiver = spec.receiver or (ready[0] if ready else None)
            if receiver is None:
                problems.append("no node is Ready to run the receiver's pod")
                continue
            if spec.placement == "same-node":
                nodes = [receiver]
            elif spec.senders:
                nodes = list(spec.senders)
            else:
                nodes = [n for n in ready if n != receiver]
                if not nodes:
                    problems.append(f"kube.placement = \"cross-node\" needs a Ready node besides the receiver's "
                                    f"{receiver!r} (Ready: {', '.join(ready) or 'none'})")
                    continue
            senders = tuple(nodes[min(i, len(nodes) - 1)] for i in range(needed))
            self.placements[key] = KubePlacement(receiver, senders, spec.network, spec.path)
        return list(dict.fromkeys(problems))

    def needs(self) -> list[tuple[str, str, str]]:
        """What this run asks of the API (api_needs), its placements resolved."""
        return api_needs(self.namespace, services=any(p.path == "service" for p in self.placements.values()))

    def pods(self, object_prefix: str = "") -> tuple[list[pods.PodSpec], dict[str, tuple[str, list[str]]]]:
        """The pods to make, and each placement's (receiver pod, sender pods) by its key. Pods are named r, r2,
        .. and s1, s2, .. in the order the configurations first need them (their objects `object_prefix` +
        that)."""
        receivers: dict[tuple[str, str], str] = {}
        senders: dict[tuple[str, str, int], str] = {}
        specs: list[pods.PodSpec] = []
        groups: dict[str, tuple[str, list[str]]] = {}

        def pod(name: str, node: str, network: str) -> str:
            # NET_ADMIN, where the level allows it: every trial begins without what TCP remembers of earlier ones
            # (`ip tcp_metrics flush`, DumbbellBench._forget_tcp_metrics): in a pod, its own network's cache; with
            # hostNetwork, the node's, as on an SSH host.
            specs.append(pods.PodSpec(name, self.image, node=node, host_network=network == "host",
                                      pull_policy=self.pull_policy, net_admin=self.pod_security == "privileged",
                                      object_prefix=object_prefix))
            return name

        for place in self.placements.values():
            if place.key in groups:
                continue
            # one receiver pod per node and network, whatever the path (kube.node.ThroughService)
            rkey = (place.network, place.receiver)
            if rkey not in receivers:
                receivers[rkey] = pod("r" if not receivers else f"r{len(receivers) + 1}", place.receiver,
                                      place.network)
            names = []
            for i, node in enumerate(place.senders):
                skey = (place.network, node, i)
                if skey not in senders:
                    senders[skey] = pod(f"s{len(senders) + 1}", node, place.network)
                names.append(senders[skey])
            groups[place.key] = (receivers[rkey], names)
        return specs, groups


def api_needs(namespace: str | None, services: bool) -> list[tuple[str, str, str]]:
    """What a run asks of the API (verb, resource, group), for an access review before anything is made: in a
    namespace of the run's own, making and deleting it; in the user's `namespace`, deleting what it made there,
    Services among them where a placement goes through one. (The cluster's lock asks for its own:
    kube/lock.py's NEEDS.)"""
    wanted = [("create", "pods", ""), ("list", "pods", ""), ("create", "pods/exec", "")]
    if namespace is None:
        return [("create", "namespaces", ""), ("delete", "namespaces", ""), *wanted]
    wanted.append(("delete", "pods", ""))
    if services:
        wanted += [("create", "services", ""), ("list", "services", ""), ("delete", "services", ""),
                   ("list", "endpointslices", "discovery.k8s.io")]
    return wanted


def placement(configs: list[Configuration], source: str, default_image: str, namespace: str | None = None
              ) -> KubePlan:
    """The scenario's ``[kube]`` table per configuration, checked against what a run on a cluster can do, before
    anything is made. Raises ScenarioError naming the key and what to change."""
    spec = configs[0].scenario.kube
    if spec is None:
        raise ScenarioError(f"{source}: --kube needs a [kube] table in the scenario naming the nodes the pods run "
                            "on, e.g. [kube] receiver = \"node2\", senders = [\"node1\"]")
    for c in configs:
        own = c.scenario.kube
        assert own is not None
        if own.placement is None and not own.senders:  # checked here: a matrix may give either
            raise ScenarioError(f"{source} [configuration {c.label_text}]: kube.senders: name the nodes the senders' "
                                "pods run on (senders = [\"node1\"]), or give placement = \"same-node\" or "
                                "\"cross-node\"")
        echoes = [n for n, w in c.scenario.active.items() if w.tool == "ping"]
        if own.path == "service" and echoes:
            raise ScenarioError(f"{source} [configuration {c.label_text}]: workload.{echoes[0]} (ping) with "
                                "kube.path = \"service\": a ClusterIP Service carries its ports only, no ICMP echo; "
                                "measure latency through it with sockperf or irtt (UDP), or keep ping for "
                                "kube.path = \"pod-ip\"")
        if (own.image, own.registry, own.pull_policy) != (spec.image, spec.registry, spec.pull_policy):
            raise ScenarioError(f"{source} [configuration {c.label_text}]: kube.image, kube.registry or "
                                "kube.image_pull_policy differ between configurations; one run's pods share one image")
        if own.pod_security != spec.pod_security:
            raise ScenarioError(f"{source} [configuration {c.label_text}]: kube.pod_security differs between "
                                "configurations; one run's pods keep to one level")
        lab = c.scenario.lab
        if lab.env != "bare":
            raise ScenarioError(f"{source} [configuration {c.label_text}]: lab.env = {lab.env!r} needs the local "
                                "lab: on Kubernetes the endpoints are pods (remove env, or run without --kube)")
        problem = _conditions_problem(lab, own)
        if problem:
            raise ScenarioError(f"{source} [configuration {c.label_text}]: {problem}")
        if lab.offload != "on":
            raise ScenarioError(f"{source} [configuration {c.label_text}]: lab.offload = {lab.offload!r}: a run on "
                                "Kubernetes leaves the nodes' offloads as they are")
    return KubePlan(spec.image or default_image, spec.pull_policy,
                    {c.key: (c.scenario.kube, c.active_senders) for c in configs}, pod_security=spec.pod_security,
                    namespace=namespace)


def _conditions_problem(lab: Any, spec: Any) -> str | None:
    """Why a configuration's link conditions cannot be made on the cluster (kube/conditions.py), or None."""
    conditioned = {n: link for n, link in lab_links(lab).items() if not link.is_plain()}
    if not conditioned:
        return None
    names = ", ".join(sorted(conditioned))
    if not spec.shape_pods:
        return (f"link conditions on {names}: a run on Kubernetes changes nothing on the cluster's network unless "
                "the scenario lets it condition the pods' own interfaces: set kube.shape_pods = true (the pods then "
                "carry them, with NET_ADMIN), or remove them (lab.bottleneck = \"unlimited\")")
    if spec.network == "host":
        return (f"link conditions on {names} with kube.network = \"host\": a hostNetwork pod's interfaces are its "
                "node's, which a run never changes; condition the pod network (kube.network = \"pod\"), or remove "
                "them for the host-network configurations")
    for name, link in conditioned.items():
        if name != "bottleneck" and not re.fullmatch(r"s\d+", name):
            return f"lab.link.{name}: a cluster's dumbbell has the links bottleneck and s1..sN"
        problem = shaping.lab_only_problem(name, link, place="in a pod")
        if problem:
            return problem
    return None


@dataclass
class KubeBench(DumbbellBench):
    """The lab's bench with pods for endpoints: the cluster as it is, link conditions only inside the pods where
    the scenario opts in; a group of pods per placement the configurations ask for."""

    cluster: api.Cluster | None = None
    plan: KubePlan | None = None
    pod_facts: dict[str, dict[str, Any]] = field(default_factory=dict)
    node_facts: dict[str, dict[str, Any]] = field(default_factory=dict)  # node -> its devices, as read (netfacts)
    machine_of: dict[str, str] = field(default_factory=dict)  # pod -> its node's machine (boot id): CPUs counted once
    _placement_of: dict[str, KubePlacement] = field(default_factory=dict)  # group key -> its placement

    @classmethod
    def for_cluster(cls, run_prefix: str, configs: list[Configuration], cluster: api.Cluster,
                    plan: KubePlan) -> "KubeBench":
        most = max(len(p.senders) for p in plan.placements.values())
        return cls(run_prefix, senders=most, pin_cpus=False, variants=[(KUBE, most)], configs=list(configs),
                   cluster=cluster, plan=plan)

    @property
    def namespace(self) -> str:
        # vnb-<id>: a DNS label, and the run's name everywhere else
        return self.plan.namespace or self.run_prefix  # type: ignore[union-attr]

    @property
    def object_prefix(self) -> str:
        """Before each pod's and Service's name: none in the run's own namespace; the run's prefix in the user's,
        which other runs (and other work) share."""
        return "" if self.plan.namespace is None else f"{self.run_prefix}-"  # type: ignore[union-attr]

    def setup(self) -> None:
        registry = Registry()
        registry.add(f"work directory {self.workdir}", lambda: shutil.rmtree(self.workdir, ignore_errors=True))
        self.lab = Lab(self.run_prefix, registry, cpu_wake_latency="not held: the pods' nodes are not this machine")
        cluster, labels, namespace = self.cluster, pods.run_labels(self.run_prefix), self.namespace
        # Registered before they are made: deleting what was never made is harmless.
        if self.plan.namespace is None:
            registry.add(f"namespace {namespace} on {cluster.server}",
                         lambda: pods.delete_namespace(cluster, namespace))
            # A namespace of baseline pods asks the API server to hold them to it: a pod of the run that asked for
            # more would be refused, not run with it. (Privileged is not asked for: the cluster's own level
            # stands.) A namespace the user named keeps its own level.
            pods.create_namespace(cluster, namespace, {**labels, **({pods.POD_SECURITY_ENFORCE: "baseline"}
                                                                    if self.plan.pod_security == "baseline" else {})})
        else:
            registry.add(f"pods and Services of run {self.run_prefix} in namespace {namespace} on {cluster.server}",
                         lambda: pods.delete_run_objects(cluster, namespace, self.run_prefix))
        specs, groups = self.plan.pods(self.object_prefix)
        pods.create_pods(cluster, namespace, specs, labels)
        running = pods.wait_running(cluster, namespace, [s.object_name for s in specs])
        credentials = api.write_credentials(cluster, self.workdir / "kube-credentials.json")
        ip_version = self.configs[0].scenario.lab.ip_version
        for s in specs:
            pod = running[s.object_name]
            ips = [p.ip for p in (pod.status.pod_ips or [])] or [pod.status.pod_ip]
            v4 = next((ip for ip in ips if ":" not in ip), "")
            v6 = next((ip for ip in ips if ":" in ip), "")
            if not (v6 if ip_version == 6 else v4):
                raise ScenarioError(f"pod {namespace}/{s.object_name} has no IPv{ip_version} address "
                                    f"({', '.join(ips)}): "
                                    f"set lab.ip_version to the cluster's")
            network = "host" if s.host_network else "pod"
            self.pod_facts[s.name] = {"node": pod.spec.node_name, "pod": f"{namespace}/{s.object_name}",
                                      "network": network, "image": s.image,
                                      "image_id": next((c.image_id for c in pod.status.container_statuses or []), None)}
            self.lab.endpoints[s.name] = PodNode(s.name, namespace, s.object_name, credentials, registry, ipv4=v4,
                                                 ipv6=v6, node=pod.spec.node_name, host_network=s.host_network,
                                                 facts=self.pod_facts[s.name])
            self._read_clock(self.lab.endpoints[s.name])
        self._read_devices(specs, credentials, registry)
        self._check_congestion_controls()
        placements = {p.key: p for p in self.plan.placements.values()}
        for key, (receiver, senders) in groups.items():
            # Keyed by placement, not variant: the environment is the cluster's in every group.
            self.lab.groups[key] = Group(KUBE, "", None, receiver, senders)  # type: ignore[index]
            self._placement_of[key] = placements[key]
            self.lab.bringup_s[key] = 0.0  # type: ignore[index]
        served = self._put_services_in_front(specs, ip_version)
        # after the Services: a sender's link carries its traffic to the receiver's ClusterIP too
        self.links = conditions.link_manager(self.lab, registry, self.workdir, self.run_prefix, self.configs,
                                             self.group, ip_version)
        self.start_servers()
        self._wait_services_carry(served)

    def _check_congestion_controls(self) -> None:
        """A pod without NET_ADMIN (kube.pod_security = "baseline") may choose only the TCP congestion controls
        its network allows (net.ipv4.tcp_allowed_congestion_control, which no baseline pod may change): every one
        the configurations ask for is checked in every pod before the first trial, and one it may not set stops
        the run here, naming the key, rather than failing each trial."""
        assert self.plan is not None and self.lab is not None
        if self.plan.pod_security != "baseline":
            return
        wanted: dict[str, str] = {}  # congestion control -> the key that asks for it
        for c in self.configs:
            for name, w in c.scenario.active.items():
                cc = getattr(w, "congestion_control", None)
                if cc and getattr(w, "proto", "tcp") == "tcp":
                    wanted.setdefault(cc, f"workload.{name}.congestion_control")
        for node in self.lab.endpoints.values() if wanted else []:
            done = node.run(["cat", "/proc/sys/net/ipv4/tcp_allowed_congestion_control"], timeout=30)
            allowed = done.stdout.split()
            refused = [(cc, key) for cc, key in wanted.items() if cc not in allowed]
            if done.returncode == 0 and refused:
                cc, key = refused[0]
                raise LabError(f"pod {node.namespace}/{node.pod}: {key} = {cc!r}: a pod kept to Pod Security's "
                               f"baseline (no NET_ADMIN) may choose only among its network's allowed congestion "
                               f"controls ({', '.join(allowed)}: net.ipv4.tcp_allowed_congestion_control on the "
                               f"node): set {key} to one of them, or kube.pod_security = \"privileged\"")

    def _read_clock(self, node: PodNode) -> None:
        """Which machine the pod's node is (its kernel's boot id), and its uptime against the controller's
        clock: what its node's CPU samples are judged by (NodesCpuRecorder)."""
        self.machine_of[node.name] = machine_id(node, node.node or node.name)
        clock = clock_offset(node, clock=UPTIME_CLOCK)
        if clock.get("offset_ms") is None:
            raise LabError(f"pod {node.namespace}/{node.pod}: its node's uptime cannot be read: {clock.get('note')}")
        node.offset_s = clock["offset_ms"] / 1e3
        self.pod_facts[node.name]["uptime_clock_uncertainty_ms"] = clock["uncertainty_ms"]

    def _read_devices(self, specs: list[pods.PodSpec], credentials: Any, registry: Registry) -> None:
        """Each pod's network devices and MTUs, and each node's (netfacts): from a pod of the run on the node's
        own network where there is one, else from a pod made on it for this alone. A node whose network no pod
        may join (a namespace's Pod Security forbids hostNetwork) is recorded as unknown, with the reason."""
        plan, cluster, lab = self.plan, self.cluster, self.lab
        assert plan is not None and cluster is not None and lab is not None
        for s in specs:
            if not s.host_network:
                self.pod_facts[s.name]["interfaces"] = _devices(lab.endpoints[s.name])
                continue
            self.pod_facts[s.name]["interfaces"] = "its node's (hostNetwork)"
            node = self.pod_facts[s.name]["node"]
            if node not in self.node_facts:  # the node's devices once, whichever of its pods reads them
                self.node_facts[node] = _node_devices(_devices(lab.endpoints[s.name]))
        unread = [n for n in plan.nodes() if n not in self.node_facts]
        if unread and plan.pod_security == "baseline":
            for n in unread:
                self.node_facts[n] = {"unknown": "kube.pod_security = \"baseline\": no pod may join the node's own "
                                                 "network to read them"}
            return
        readers = [pods.PodSpec(f"n{k}", plan.image, node=n, host_network=True, pull_policy=plan.pull_policy,
                                object_prefix=self.object_prefix) for k, n in enumerate(unread, 1)]
        if not readers:
            return
        try:
            pods.create_pods(cluster, self.namespace, readers, pods.run_labels(self.run_prefix))
            pods.wait_running(cluster, self.namespace, [r.object_name for r in readers], timeout_s=60)
        except LabError as e:
            for n in unread:
                self.node_facts[n] = {"unknown": f"no pod on the node's own network could be made to read them: {e}"}
            return
        for r in readers:
            reader = PodNode(r.name, self.namespace, r.object_name, credentials, registry, ipv4="", node=r.node or "",
                             host_network=True)
            self.node_facts[r.node or ""] = _node_devices(_devices(reader))

    def _put_services_in_front(self, specs: list[pods.PodSpec], ip_version: int) -> list[tuple[str, str, int]]:
        """A ClusterIP Service in front of each receiver pod a placement reaches by path = "service", on every
        port of its servers, TCP and UDP (iperf3's UDP tests send to its TCP control port's number); its senders
        then send to the ClusterIP (ThroughService). Returns (receiver pod, a sender pod, TCP port) to
        check each Service with once its servers listen."""
        lab, cluster = self.lab, self.cluster
        assert lab is not None and cluster is not None
        fronted = {g.receiver: g.senders[0] for k, g in lab.groups.items() if self._placement_of[k].path == "service"}
        servers = self.server_specs()
        checks = []
        for spec in specs:
            if spec.name not in fronted:
                continue
            own = [s for s in servers if s.node.name == spec.name]
            ports = [(port, proto) for port in sorted({s.port for s in own}) for proto in ("TCP", "UDP")]
            node = lab.endpoints[spec.name]
            node.service_ip = pods.create_service(cluster, self.namespace, spec, ports, ip_version,
                                                  pods.run_labels(self.run_prefix))
            self.pod_facts[spec.name]["service"] = f"{self.namespace}/{spec.object_name} ClusterIP {node.service_ip}"
            pods.wait_service_ready(cluster, self.namespace, spec.object_name, node.address(ip_version))
            tcp = [s.port for s in own if s.transport == "tcp"]
            if tcp:
                checks.append((spec.name, fronted[spec.name], tcp[0]))
        return checks

    def _wait_services_carry(self, checks: list[tuple[str, str, int]], timeout_s: float = 30.0) -> None:
        """Until a TCP connection through each Service reaches its server (the Service proxies on the nodes
        program a new Service within their sync period: the first trial must not find it half-made)."""
        lab = self.lab
        assert lab is not None
        for receiver, sender, port in checks:
            address = lab.endpoints[receiver].service_ip
            deadline = time.monotonic() + timeout_s
            while True:
                proc = lab.endpoints[sender].run(["sh", "-c", f"busybox nc -w 2 {address} {port} </dev/null"],
                                                 timeout=10)
                if proc.returncode == 0:
                    break
                if time.monotonic() > deadline:
                    where = self.cluster.where()  # type: ignore[union-attr]
                    raise LabError(f"{where}: nothing reaches {receiver}'s server on port {port} through its "
                                   f"Service {address} from pod {sender} after {timeout_s:.0f} s: "
                                   f"{proc.stderr.strip()[-200:] or 'no answer'}; is the cluster's Service "
                                   "proxy (kube-proxy, or the CNI's) running on the nodes?")
                time.sleep(0.5)

    def workload_endpoints(self, config: Configuration, workload: str) -> TrialEndpoints:
        """The lab's endpoints; with kube.path = "service", the receiver reached through its Service."""
        ends = super().workload_endpoints(config, workload)
        if self.plan.placements[config.key].path == "service":  # type: ignore[union-attr]
            return replace(ends, receiver=ThroughService(ends.receiver))
        return ends

    def group(self, config: Configuration) -> Group:
        assert self.lab is not None and self.plan is not None
        return self.lab.groups[self.plan.placements[config.key].key]  # type: ignore[index]

    def placement_of(self, group: Group) -> KubePlacement:
        return next(self._placement_of[k] for k, g in self.lab.groups.items() if g is group)  # type: ignore[union-attr]

    @property
    def server_workdir(self) -> str:
        return "/tmp"  # in the pods: the tools image's own, and the pod's alone

    def recorders(self, group: Group) -> list[Recorder]:
        """The links' counters, and the CPUs of the pods' nodes, sampled in the pods (this machine's are not
        the nodes')."""
        assert self.lab is not None
        return [LinkRecorder(self.links),
                NodesCpuRecorder(self.lab.endpoints[group.receiver], [self.lab.endpoints[n] for n in group.senders],
                                 self.machine_of, self.workdir)]

    def _realise(self, config: Configuration) -> bool:
        """The configuration's link conditions in the pods that carry them (kube.shape_pods; nothing on the nodes
        changes); whether anything changed. The qdiscs as the pods' kernel reports them are the lab state."""
        state = self.links.apply(config, self.flows(config))  # type: ignore[union-attr]
        self.lab_state = state["qdiscs"]
        return self.links.changed  # type: ignore[union-attr]

    def _group_offload_unknown(self, config: Configuration) -> None:
        pass

    def _forget_tcp_metrics(self, nodes: list[Any]) -> str | None:
        if self.plan is not None and self.plan.pod_security == "baseline":
            return None  # no NET_ADMIN: the environment's state says the metrics stay (environment_state)
        return super()._forget_tcp_metrics(nodes)

    def unavailable(self, config: Configuration) -> tuple[str, dict[str, Any]] | None:
        return None  # every pod is Running before the first trial, or the run stops at setup

    def variant_name(self, group: Group) -> str:
        return str(self.placement_of(group))

    def environment_state(self, config: Configuration) -> dict[str, Any]:
        group = self.group(config)
        place = self.plan.placements[config.key]  # type: ignore[union-attr]
        used = [group.receiver, *group.senders[:config.active_senders]]
        baseline = self.plan.pod_security == "baseline"  # type: ignore[union-attr]
        return {"environment": {"variant": str(place), "env": "bare", "network": place.network,
                                "placement": place.kind, "path": place.path,
                                "pod_security": self.plan.pod_security,  # type: ignore[union-attr]
                                "tcp_metrics": ("not flushed between trials (kube.pod_security = baseline: no "
                                                "NET_ADMIN): a connection may start from what earlier trials' "
                                                "connections to its peer left" if baseline else
                                                "flushed in every pod before each trial"),
                                "pods": {n: self.pod_facts.get(n, {}) for n in used}}}


def _devices(node: PodNode) -> dict[str, Any]:
    proc = node.run(netfacts.IP_LINK, timeout=30)
    if proc.returncode != 0:
        return {"error": f"`{' '.join(netfacts.IP_LINK)}` in pod {node.pod} exited {proc.returncode}: "
                         f"{proc.stderr.strip()[-300:]}"}
    return netfacts.interfaces(proc.stdout)


def _node_devices(devices: dict[str, Any]) -> dict[str, Any]:
    if "error" in devices:
        return {"unknown": devices["error"]}
    return {"interfaces": netfacts.lasting(devices), "encapsulation": netfacts.encapsulation(devices)}
