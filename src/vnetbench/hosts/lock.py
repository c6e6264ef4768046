"""One vnetbench run measures on a host at a time: a lock per host, held for the whole run (seed 004 used cron
to keep its hosts' measurements apart).

The lock is a flock(1) on a file of the host's, held by a process the run keeps there through its own ssh
session and the hosts' exec wrapper (hosts/node.py): when the run ends, or its controller is killed, the
session's input closes and the holder ends on the host, so a killed controller never leaves a host locked.

What is locked is the host's network stack: the file is named after the holder's network namespace
(``/run/lock/vnetbench-net<inode>.lock``), so two runs from two controllers on one host exclude each other,
and hosts that are containers or namespaces of one machine (the tests' hosts) are hosts of their own. The
file is opened without O_CREAT once it exists (fs.protected_regular refuses O_CREAT on another user's file in
a sticky directory, even to root); who holds it is in a file of each holder's own (``.owner-<uid>``),
removed when it lets go, and named to the run that finds the host taken.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from dataclasses import dataclass, field
from typing import Callable

from vnetbench.errors import EnvironmentProblem, HostError
from vnetbench.hosts.inventory import InventoryHost
from vnetbench.hosts.node import WRAPPER
from vnetbench.hosts.ssh import SshConnection
from vnetbench.tools import FLOCK

BUSY = 75  # EX_TEMPFAIL: taken by another run

# $1: who takes it (one line). Prints "locked" and holds the lock until it is signalled (the wrapper's TERM when
# the session's input closes), or prints "busy" and the holders' lines and exits BUSY.
LOCK_SCRIPT = r"""
d=/run/lock; { [ -d "$d" ] && [ -w "$d" ]; } || d=/tmp
n=$(readlink /proc/self/ns/net | tr -cd 0-9)
f="$d/vnetbench-net$n.lock"; mine="$f.owner-$(id -u)"
[ -e "$f" ] || (umask 0; : >>"$f") 2>/dev/null
exec 9<"$f" || { echo "cannot open $f" >&2; exit 3; }
if ! flock -n 9; then
    echo busy; cat "$f".owner-* 2>/dev/null; exit 75
fi
trap 'rm -f "$mine"; exit 0' TERM INT HUP
printf '%s\n' "$1" >"$mine"
echo "locked $f"
while :; do sleep 3600 & wait $!; done
"""


def holder_line(run_id: str, scenario: str) -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    return (f"run {run_id} (scenario {scenario!r}) from {socket.gethostname()} pid {os.getpid()}, "
            f"started {started}").replace("\n", " ")


@dataclass
class HostLocks:
    """The locks of a run's hosts, held until :meth:`release`."""

    held: dict[str, tuple[SshConnection, subprocess.Popen]] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)  # host -> the lock file there
    hosts: dict[str, InventoryHost] = field(default_factory=dict)
    connect: Callable[[InventoryHost], SshConnection] | None = None
    who: str = ""

    def retake(self, names: list[str]) -> None:
        """Take these hosts' locks again: they dropped out, and their holders went with their sessions."""
        self.release(names)
        again = lock_hosts([self.hosts[n] for n in names], self.connect, self.who)
        self.held.update(again.held)
        self.files.update(again.files)

    def release(self, names: list[str] | None = None) -> None:
        for name in list(self.held if names is None else names):
            if name not in self.held:
                continue
            conn, proc = self.held.pop(name)
            if proc.stdin:
                proc.stdin.close()  # the wrapper on the host ends the holder; its trap removes the owner file
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            for stream in (proc.stdout, proc.stderr):
                if stream:
                    stream.close()
            conn.close()


def lock_hosts(hosts: list[InventoryHost], connect: Callable[[InventoryHost], SshConnection],
               who: str) -> HostLocks:
    """Take every host's lock, or none: a host that another run holds is named with that run, and the locks
    taken already are let go. Raises EnvironmentProblem (taken) or HostError (the lock could not be tried)."""
    locks = HostLocks(hosts={h.name: h for h in hosts}, connect=connect, who=who)
    try:
        for host in hosts:
            conn = connect(host)
            proc = subprocess.Popen(conn.command(["sh", "-c", WRAPPER, "vnb-exec", "sh", "-c", LOCK_SCRIPT,
                                                  "vnetbench-lock", who]),
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)
            first = proc.stdout.readline().decode(errors="replace").strip() if proc.stdout else ""
            if first.startswith("locked "):
                locks.held[host.name] = (conn, proc)
                locks.files[host.name] = first[len("locked "):]
                continue
            # Its input stays open until it has ended on its own: closing it (as communicate() would) makes the
            # wrapper end the script before it has said who holds the lock.
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            out, err = proc.stdout.read() if proc.stdout else b"", proc.stderr.read() if proc.stderr else b""
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream:
                    stream.close()
            conn.close()
            if proc.returncode == BUSY:
                holders = [line for line in out.decode(errors="replace").splitlines() if line.strip()]
                raise EnvironmentProblem(
                    f"{host.name} is measuring for another vnetbench run: {'; '.join(holders) or 'a run that did not say who'}"
                    " (nothing was started on any host); wait for it to end, or run on other hosts")
            said = (err.decode(errors="replace").strip() or first or f"exit status {proc.returncode}")[-300:]
            failure = conn.failure(said)
            raise failure or HostError(f"{conn.where()}: could not take the host's run lock: {said}",
                                       f"apt-get install {FLOCK.package} there (flock)")
    except BaseException:
        locks.release()
        raise
    return locks
