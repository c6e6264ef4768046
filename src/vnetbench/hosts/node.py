"""A real host as the lab sees an endpoint: :class:`vnetbench.lab.nodes.NamespaceNode`'s interface, over SSH.

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
from vnetbench.lab.nodes import RunsCommands, exec_wrapper, placement_entry
from vnetbench.lab.teardown import Registry
from vnetbench.limits import REMOTE_OUTPUT_BYTES

WRAPPER = exec_wrapper("", "on this host")

# A started command that waits until EPOCH (seconds, on this host's clock), prints when it woke ("vnb-start
# SECONDS.MICROSECONDS") on standard error, and becomes ARGV: so the clients of a trial start at one instant on
# their hosts, whatever each ssh session took to open, and the run learns how close they came.
# Under bash nothing is forked between reading the clock and waking (forks before sleeping would make it
# oversleep by their start-up, and several hosts forking a `date` at once on a small machine stagger their own
# stamps): the wait is `read -t` on a pipe nobody writes, timed from $EPOCHREALTIME in integer microseconds.
# Where there is no bash, sh with sleep and date, a few milliseconds less precise.
START_AT_BASH = r"""t=$1; shift
t_us=$(awk -v t="$t" 'BEGIN { printf "%.0f", t * 1e6 }')
exec 9<> <(:)
now=${EPOCHREALTIME/[.,]/}
d=$(( t_us - now ))
if (( d > 0 )); then printf -v s '%d.%06d' $(( d / 1000000 )) $(( d % 1000000 )); read -t "$s" -u 9; fi
exec 9<&-
echo "vnb-start $EPOCHREALTIME" >&2
exec "$@"
"""
START_AT_SH = r"""t=$1; shift
d=$(awk -v t="$t" -v n="$(date +%s.%N)" 'BEGIN { d = t - n; if (d > 0) printf "%.6f", d; else print 0 }')
sleep "$d"
echo "vnb-start $(date +%s.%N)" >&2
exec "$@"
"""
# `sh -c START_WITH START_AT_BASH START_AT_SH EPOCH ARGV...`
START_WITH = ('b=$0; s=$1; shift; if command -v bash >/dev/null 2>&1; then exec bash -c "$b" vnb-start "$@"; fi; '
              'exec sh -c "$s" vnb-start "$@"')
STAMP = "vnb-start "


class SshNode(RunsCommands):
    stdin_of_started = subprocess.PIPE
    timed_by_wrapper = True
    output_limit = REMOTE_OUTPUT_BYTES.value  # a host's answers are kilobytes: more is refused, not held

    def __init__(self, name: str, conn: SshConnection, registry: Registry, ipv4: str = "", ipv6: str = "",
                 facts: dict[str, Any] | None = None, interface: str | None = None):
        self.name, self.conn, self.registry = name, conn, registry
        self.interface = interface  # the one that carries the run's traffic (the inventory's or the route's)
        self.ipv4, self.ipv6 = ipv4, ipv6
        self.cpu: int | None = None  # not pinned: the host's scheduler decides, as for the user's own runs
        self.host_facts = dict(facts or {})
        self.extra: dict[str, Any] = {}
        # While set (controller epoch seconds), started commands wait on the host until then (START_AT); the
        # host's clock is offset_s ahead of the controller's.
        self.start_at: float | None = None
        self.offset_s = 0.0

    def address(self, ip_version: int) -> str:
        return self.ipv6 if ip_version == 6 else self.ipv4

    def service_address(self, ip_version: int) -> str:
        return self.address(ip_version)

    def facts(self) -> dict[str, Any]:
        return dict(self.host_facts)

    def placement(self) -> dict[str, Any]:
        host = self.conn.host
        login = f"{host.user}@{host.address}" if host.user else host.address
        port = f" port {host.port}" if host.port else ""
        # the inventory's host: a declared topology's endpoint is named after its node (h1 = host client-1 ...)
        return placement_entry(f"host {host.name} (ssh {login}{port})", self.ipv4, self.ipv6,
                               self.interface, None)

    def command(self, argv: Sequence[str], pin: bool = True, timed: bool = False) -> list[str]:
        """The local argv that starts ``argv`` on the host and ends it when this argv's process ends."""
        if self.start_at is not None:
            at = f"{self.start_at + self.offset_s:.6f}"
            argv = ["sh", "-c", START_WITH, START_AT_BASH, START_AT_SH, at, *map(str, argv)]
        return self.conn.command(["sh", "-c", WRAPPER, "vnb-exec", *(["-t"] if timed else []), *map(str, argv)])

