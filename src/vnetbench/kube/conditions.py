"""Link conditions inside a cluster's pods, where the scenario opts in (``kube.shape_pods = true``).

Each pod of the pod network has a network namespace of its own, and a pod with ``NET_ADMIN`` may change its own
interfaces and nothing else, so a run may put a dumbbell's links there as it puts them on an SSH host's interface
(:mod:`vnetbench.hosts.shaping`, the same mechanism and the same tc commands): the bottleneck on the receiver's
pod, link ``sN`` on the Nth sender's, each direction on an IFB of the pod's own, with only the endpoints' traffic
steered into it (u32 filters on a clsact qdisc of the pod's ``eth0``)::

    sender pod s1                                   receiver pod r
      eth0 egress  -> IFB -e: s1 forward              eth0 ingress -> IFB -i: bottleneck forward
      eth0 ingress -> IFB -i: s1 reverse              eth0 egress  -> IFB -e: bottleneck reverse
         \\_____________ the cluster's pod network (CNI, nodes: unchanged) ___________/

Nothing on the nodes changes: a pod of the nodes' network (``kube.network = "host"``) carries no conditions, and
the run refuses them there. The conditions are the qdiscs of the pods' kernel, which is their node's: which of
them it has (tbf, htb, netem) is found by trying each on an IFB made in a pod for this and deleted, not assumed;
the userspace emulator runs in the local lab only. What a run made in a pod is undone at its end (the pods are
deleted with the run anyway).
"""

from __future__ import annotations

import subprocess
from typing import Any

from vnetbench.errors import EnvironmentProblem, HostError, LabError, ScenarioError
from vnetbench.hosts import shaping
from vnetbench.impair.model import LinkSpec
from vnetbench.kube.node import PodNode
from vnetbench.lab.teardown import Registry
from vnetbench.lab.topology import Group
from vnetbench.runner.hosts_bench import HostLinkManager
from vnetbench.scenario.plan import Configuration

# The least of each kernel link backend's qdisc that the kernel must accept: tried on a probe IFB of the pod's.
QDISC_TRIALS: dict[str, list[str]] = {
    "tbf": ["tbf", "rate", "1mbit", "burst", "32kbit", "latency", "400ms"],
    "htb": ["htb", "default", "1"],
    "netem": ["netem", "delay", "1ms"],
}


class PodShell:
    """A pod's commands for :mod:`vnetbench.hosts.shaping` (its :class:`~vnetbench.hosts.shaping.Shell`): exec'd
    through the API, as the pod's root (a pod with NET_ADMIN changes its own network namespace)."""

    def __init__(self, node: PodNode):
        self.node = node
        self.name = node.name

    def run(self, argv: list[str], timeout: float = 30.0, pin: bool = False,
            root: bool = False) -> subprocess.CompletedProcess:
        return self.node.run(_as_is(argv), timeout=timeout)

    def where(self) -> str:
        return f"pod {self.node.namespace}/{self.node.pod} on node {self.node.node}"


def _as_is(argv: list[str]) -> list[str]:
    """`argv` without shaping's sbin wrapper (with_sbin): the pod's PATH has the image's tools, and the wrapper's
    sh is busybox's there, which runs its own tc and ip applets before iproute2's."""
    wrapped = shaping.with_sbin([])
    return list(argv[len(wrapped):]) if list(argv[:len(wrapped)]) == wrapped else list(argv)


def carried(configs: list[Configuration], group_of: Any) -> dict[str, dict[str, list[LinkSpec]]]:
    """pod -> {link name: its distinct specs with conditions, over the configurations}: the bottleneck on each
    configuration's receiver pod, link sN on its Nth sender pod (`group_of(config)`: the configuration's group of
    pods). A pod carries one link: a receiver's is always the bottleneck, a sender pod always the same sN."""
    def carriers(c: Configuration) -> dict[str, str]:
        group = group_of(c)
        return shaping.dumbbell_carriers(group.receiver, group.senders, c.active_senders)

    return shaping.links_by_host(configs, carriers)


def peers(groups: dict[str, Group], endpoints: dict[str, PodNode], ip_version: int) -> dict[str, list[str]]:
    """pod -> the addresses whose traffic with it its link carries: a receiver's, every sender's of its groups;
    a sender's, the receivers' of its groups, and their Services' ClusterIPs (a sender sends to the ClusterIP and
    its replies come back from it: the nodes translate between the two, outside the pod)."""
    out: dict[str, list[str]] = {}
    for g in groups.values():
        receiver = endpoints[g.receiver]
        for name in g.senders:
            out.setdefault(g.receiver, []).append(endpoints[name].address(ip_version))
            out.setdefault(name, []).append(receiver.address(ip_version))
            if receiver.service_ip:
                out[name].append(receiver.service_ip)
    return {pod: list(dict.fromkeys(addresses)) for pod, addresses in out.items()}


def pod_qdiscs(shell: "PodShell", probe_device: str) -> dict[str, str | None]:
    """Which kernel qdiscs link conditions may use in the pod: kind -> None (the kernel made one), or what tc
    said. Tried on an IFB the pod makes for this and deletes (its own namespace's: nothing else changes); a pod
    without tc, or that cannot make an IFB, raises LabError naming what to do. One exec per command: the pod's
    sh is busybox's, whose own tc and ip applets would stand in for iproute2's."""
    made = shell.run(["ip", "link", "add", "name", probe_device, "type", "ifb"])
    if made.returncode != 0:
        said = (made.stderr or made.stdout).strip()[-300:] or f"exit status {made.returncode}"
        if made.returncode == 127 or "not found" in said:
            raise LabError(f"{shell.where()}: the pod's image has no ip (iproute2), which link conditions in the "
                           "pods are made with: use vnetbench's tools image (leave kube.image unset)")
        raise LabError(f"{shell.where()}: cannot make an IFB device for link conditions ({said}): the node's kernel "
                       "needs the ifb module (modprobe ifb on the node) and the pod NET_ADMIN "
                       "(kube.pod_security = \"privileged\")")
    found: dict[str, str | None] = {}
    try:
        for kind, args in QDISC_TRIALS.items():
            done = shell.run(["tc", "qdisc", "add", "dev", probe_device, "root", *args])
            said = " ".join((done.stderr or done.stdout).split())[:200]
            if done.returncode == 127 or "tc: not found" in said or "No such file" in said:
                raise LabError(f"{shell.where()}: the pod's image has no tc, which link conditions in the pods are "
                               "made with: use vnetbench's tools image (leave kube.image unset), or add iproute2's "
                               "tc to yours")
            found[kind] = None if done.returncode == 0 else f"the node's kernel refused it: {said}"
            if done.returncode == 0:
                shell.run(["tc", "qdisc", "del", "dev", probe_device, "root"])
    finally:
        shell.run(["ip", "link", "del", "dev", probe_device])
    return found


def link_manager(lab: Any, registry: Registry, workdir: Any, run_prefix: str, configs: list[Configuration],
                 group_of: Any, ip_version: int) -> HostLinkManager:
    """The run's links in its pods: for each pod that carries conditions in some configuration, its interface
    toward its peers read and checked, the qdiscs its kernel makes found, and each link's backend chosen over
    every pod that carries it (`auto`: the rate qdisc alone for rates and buffers, else netem); pods without
    conditions are not touched. Raises LabError naming the pod and what its kernel lacks."""
    shaped = carried(configs, group_of)
    addresses = peers(lab.groups, lab.endpoints, ip_version)
    host_links: dict[str, shaping.HostLink] = {}
    kernels: dict[str, dict[str, str | None]] = {}  # link name -> kind -> None, or why not in one of its pods
    probed: dict[str, dict[str, str | None]] = {}  # node -> what its kernel makes: pods on one node share it
    for pod, links in shaped.items():
        shell = PodShell(lab.endpoints[pod])
        try:
            dev = shaping.route_interface(shell, addresses[pod], no_route_fix="check the pod network's routes "
                                          "(ip route in the pod)")
            facts = shaping.read_interface(shell, dev, "delete the pod")
        except HostError as e:
            raise LabError(str(e)) from None
        node = lab.endpoints[pod].node
        if node not in probed:
            probed[node] = pod_qdiscs(shell, shaping.ifb_name(run_prefix, "probe"))
        qdiscs = probed[node]
        for name in links:
            joined = kernels.setdefault(name, {})
            for kind, why in qdiscs.items():
                if why is not None and joined.get(kind) is None:
                    joined[kind] = f"{shell.where()}: {why}"
                joined.setdefault(kind, None)
            host_links[pod] = shaping.HostLink(name, shell, facts, addresses[pod], ip_version, run_prefix, registry,
                                               host_upstream=name != "bottleneck")
    auto: dict[str, str] = {}
    rate_qdisc = configs[0].scenario.lab.qdisc
    for name in dict.fromkeys(n for links in shaped.values() for n in links):
        specs = [s for links in shaped.values() for s in links.get(name, [])]
        try:
            choice = shaping.host_backend(name, specs, kernels[name], rate_qdisc, "in the pods: ")
        except (HostError, EnvironmentProblem, ScenarioError) as e:
            raise LabError(str(e)) from None
        if choice:
            auto[name] = choice
    return HostLinkManager(lab, registry, workdir, run_prefix, auto=auto, host_links=host_links)
