"""A pod as the lab sees an endpoint: :class:`vnetbench.lab.nodes.RunsCommands` through the Kubernetes API.

Every command runs through the tools image's exec wrapper (/bin/vnb-exec, :data:`vnetbench.lab.engines.EXEC_WRAPPER`).
A started one (a server, a workload's client) by the exec helper (:mod:`vnetbench.kube.exec`), a local process
per command: its input is a pipe this process holds, and when it closes or the helper dies, the wrapper stops
the command in the pod, as for a container of an engine. One whose answer is awaited (``run``) is streamed
from this process itself, the same way. Pods are not pinned to cores: the node's kubelet and scheduler decide.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

from vnetbench.kube.pods import CONTAINER
from vnetbench.lab.nodes import RunsCommands, placement_entry
from vnetbench.lab.teardown import Registry
from vnetbench.limits import REMOTE_OUTPUT_BYTES

WRAPPER = "/bin/vnb-exec"


class PodNode(RunsCommands):
    stdin_of_started = subprocess.PIPE
    timed_by_wrapper = True  # the pod's vnb-exec says a timed command's CPU time
    pins_each_command = False
    output_limit = REMOTE_OUTPUT_BYTES.value  # a cluster's answers are kilobytes: more is refused, not held

    def __init__(self, name: str, namespace: str, pod: str, credentials: Path, registry: Registry,
                 ipv4: str, ipv6: str = "", node: str = "", host_network: bool = False,
                 facts: dict[str, Any] | None = None):
        self.name, self.namespace, self.pod, self.credentials = name, namespace, pod, credentials
        self.registry = registry
        self.ipv4, self.ipv6 = ipv4, ipv6
        self.node, self.host_network = node, host_network
        self.cpu: int | None = None
        self.pod_facts = dict(facts or {})
        self.extra: dict[str, Any] = {}
        # the ClusterIP of a Service in front of it: the address of its servers for a configuration whose
        # kube.path is "service" (ThroughService), its own for the others'
        self.service_ip: str | None = None
        # its node's uptime less the controller's clock (runner/hosts_bench.clock_offset of UPTIME_CLOCK): what
        # puts its node's CPU samples on the controller's clock
        self.offset_s = 0.0
        self._credentials: dict[str, Any] | None = None  # the file's content, read at the first run()

    def address(self, ip_version: int) -> str:
        return self.ipv6 if ip_version == 6 else self.ipv4

    def service_address(self, ip_version: int) -> str:
        """Where other pods reach its servers: its own address (through its Service: ThroughService)."""
        return self.address(ip_version)

    def echo_address(self, ip_version: int) -> str:
        """Its own address: a ClusterIP carries the Service's ports only, no ICMP echo (the path check pings the
        pod the Service sends to)."""
        return self.address(ip_version)

    def facts(self) -> dict[str, Any]:
        return dict(self.pod_facts)

    def placement(self) -> dict[str, Any]:
        network = "its node's network (hostNetwork)" if self.host_network else "the pod network"
        return placement_entry(f"pod {self.namespace}/{self.pod} on node {self.node or '?'}, {network}",
                               self.ipv4, self.ipv6, None if self.host_network else "eth0", None)

    def run(self, argv: Sequence[str], timeout: float = 10.0, pin: bool = False) -> subprocess.CompletedProcess:
        """A command whose answer is awaited, streamed from this process (vnetbench.kube.exec.run_captured): no
        helper to start. Its exit status, output and errors are the helper's."""
        from vnetbench.kube import exec as kube_exec

        if self._credentials is None:
            self._credentials = json.loads(self.credentials.read_text())
        return kube_exec.run_captured(self._credentials, self.namespace, self.pod, CONTAINER,
                                      [WRAPPER, *map(str, argv)], timeout, self.output_limit)

    def command(self, argv: Sequence[str], pin: bool = True, timed: bool = False) -> list[str]:
        return [sys.executable, "-m", "vnetbench.kube.exec", str(self.credentials), self.namespace, self.pod,
                CONTAINER, WRAPPER, *(["-t"] if timed else []), *map(str, argv)]


class ThroughService:
    """A receiver pod as the clients of a configuration with kube.path = "service" see it: its servers at the
    ClusterIP of the Service in front of it; everything else (its commands, address, facts, name) its pod's.
    One pod serves both paths: on the node's network (hostNetwork) a second receiver pod would share the
    node's ports with the first, and the two paths are compared against the same servers."""

    def __init__(self, pod: PodNode):
        if not pod.service_ip:
            raise ValueError(f"pod {pod.namespace}/{pod.pod} has no Service in front of it")
        self._pod = pod

    def service_address(self, ip_version: int) -> str:
        return self._pod.service_ip  # type: ignore[return-value]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pod, name)
