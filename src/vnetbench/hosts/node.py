"""A real host as the lab sees an endpoint: :class:`vnetbench.lab.nodes.Host`'s interface, over SSH.

Workloads start their servers and clients through ``popen`` and ``run`` as on any node; the commands go
through the host's one multiplexed SSH connection (:mod:`vnetbench.hosts.ssh`). An SSH session without a
terminal does not stop its command when the session goes, so a started command runs through the same
wrapper as a container's (:func:`vnetbench.lab.nodes.exec_wrapper`, passed to ``sh -c``): its input is a pipe
this process holds, and when the local ssh client ends (the command finished, the runner stopped it, the
lab's teardown killed it, the controller died) the command and everything it started end on the host too.
"""

from __future__ import annotations

import subprocess
from typing import Any, Sequence

from vnetbench.hosts.ssh import SshConnection
from vnetbench.lab.nodes import RunsCommands, exec_wrapper
from vnetbench.lab.teardown import Registry

WRAPPER = exec_wrapper("", "on this host")


class SshNode(RunsCommands):
    stdin_of_started = subprocess.PIPE

    def __init__(self, name: str, conn: SshConnection, registry: Registry, ipv4: str = "", ipv6: str = "",
                 facts: dict[str, Any] | None = None):
        self.name, self.conn, self.registry = name, conn, registry
        self.ipv4, self.ipv6 = ipv4, ipv6
        self.cpu: int | None = None  # not pinned: the host's scheduler decides, as for the user's own runs
        self.host_facts = dict(facts or {})
        self.extra: dict[str, Any] = {}

    def address(self, ip_version: int) -> str:
        return self.ipv6 if ip_version == 6 else self.ipv4

    def service_address(self, ip_version: int) -> str:
        return self.address(ip_version)

    def facts(self) -> dict[str, Any]:
        return dict(self.host_facts)

    def command(self, argv: Sequence[str], pin: bool = True) -> list[str]:
        """The local argv that starts ``argv`` on the host and ends it when this argv's process ends."""
        return self.conn.command(["sh", "-c", WRAPPER, "vnb-exec", *map(str, argv)])

