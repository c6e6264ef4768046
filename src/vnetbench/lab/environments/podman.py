"""`podman`: endpoints as real Podman containers, on a bridge network of Podman's own.

The same lab as `docker` (:mod:`vnetbench.lab.environments.docker`), through Podman's Docker-compatible API:
a user-defined bridge network made by Podman's network backend (CNI or netavark: its bridge, veths and
firewall rules), containers from the same tools image, run by conmon and the OCI runtime Podman uses,
workloads started with `podman --remote exec`. Where the two engines differ, the difference is the thing
measured: published ports are NAT rules only (rootful Podman has no userland proxy), and the cgroup
driver, runtime and network backend are Podman's, stored with each configuration.

Podman has no daemon: its API is a service (`podman system service`, or systemd's podman.socket, which
Debian's package enables) reached at CONTAINER_HOST or /run/podman/podman.sock.
"""

from __future__ import annotations

from vnetbench.lab.environments.base import register
from vnetbench.lab.environments.docker import EngineEnvironment


@register
class PodmanEnvironment(EngineEnvironment):
    kind = "podman"
    tag = "p"
