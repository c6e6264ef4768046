"""One vnetbench run measures on a host at a time: a lock per host, held for the whole run (seed 004 used cron
to keep its hosts' measurements apart).

The lock is a flock(1) on a file of the host's, held by a process the run keeps there through its own ssh
session and the hosts' exec wrapper (hosts/node.py): when the run ends, or its controller is killed, the
session's input closes and the holder ends on the host, so a killed controller never leaves a host locked.

What is locked is the host's network stack: the file is named after the holder's network namespace
(``net<inode>.lock``), so two runs from two controllers on one host exclude each other, and hosts that are
containers or namespaces of one machine (the tests' hosts) are hosts of their own. Who holds it is in the file
beside it (``.owner``), written by the holder once it has the lock, removed when it lets go, and named to the
run that finds the host taken.

The files are in a directory of vnetbench's that only the remote user can write: ``/run/vnetbench-hosts`` for
root (beside, not in, the 0755 ``/run/vnetbench`` of the machine's own runs: runlock.py), else the user's own
(``$XDG_RUNTIME_DIR/vnetbench-hosts``, or ``~/.cache/vnetbench-hosts-<host name>``: a home shared over NFS
would otherwise give every host's initial namespace, whose inode is the same everywhere, one lock). So runs as
different users of a host do not exclude each other; those that change the host need root anyway. It was
``/run/lock``, writable by every user of the host: anyone there could make root write through a link planted at
the owner file's name, hang every run with a FIFO at the lock's, hold the lock for ever or put escape sequences
in the holder's line. Now the directory is made with mode 0700 and checked before use (not a link, the user's,
mode 0700, in a directory nobody else can write, so that it cannot be swapped once checked), and a lock file
that is not a regular file is refused, not opened: nothing of anyone else's can be at those names, so no link
is ever followed and no FIFO opened. The controller reads the script's answer within a timeout and a size
bound (limits.LOCK_ANSWER_BYTES), and what it quotes of it is cleaned of control characters.
"""

from __future__ import annotations

import os
import selectors
import socket
import subprocess
import time
from dataclasses import dataclass, field
from typing import Callable

from vnetbench.console import clean
from vnetbench.errors import EnvironmentProblem, HostError
from vnetbench.hosts.inventory import InventoryHost
from vnetbench.hosts.node import WRAPPER
from vnetbench.hosts.ssh import SshConnection
from vnetbench.limits import LOCK_ANSWER_BYTES
from vnetbench.tools import FLOCK

BUSY = 75  # EX_TEMPFAIL: taken by another run
REFUSED = 3  # the script would not use what it found (it said why, one line on stderr)
# How long the lock script may take to answer, beyond the ssh connection's own timeout: it runs a few
# commands (id, stat, mkdir, flock -n), milliseconds on an idle host.
ANSWER_S = 20.0
HOLDER_CHARS = 300  # of a holder's line, quoted to the run that finds the host taken

# $1: who takes it (one line). Prints "locked FILE" and holds the lock until it is signalled (the wrapper's TERM
# when the session's input closes), or prints "busy" and the holder's line and exits BUSY, or says on stderr
# why it would not (one line "vnetbench-lock: ...", naming the file and what to do) and exits REFUSED.
# Its sleep goes with it and does not hold the lock's descriptor (9<&-): the lock ends when the holder does.
# `command exec`: a redirection that fails on a plain `exec` ends a POSIX shell before `|| fail` can speak.
LOCK_SCRIPT = r"""
fail() { printf 'vnetbench-lock: %s\n' "$*" >&2; exit 3; }
u=$(id -u)
if [ "$u" = 0 ]; then
    p=/run; d=/run/vnetbench-hosts
elif [ -n "${XDG_RUNTIME_DIR:-}" ] && [ -d "$XDG_RUNTIME_DIR" ] && [ -O "$XDG_RUNTIME_DIR" ]; then
    p=$XDG_RUNTIME_DIR; d=$p/vnetbench-hosts
else
    { [ -n "${HOME:-}" ] && [ -d "$HOME" ]; } || fail "user $(id -un) has no home directory nor XDG_RUNTIME_DIR for the run lock; give it one, or log in as root"
    p=$HOME/.cache; d=$p/vnetbench-hosts-$(uname -n | tr -cd 'A-Za-z0-9._-')
    [ -d "$p" ] || mkdir -m 0700 -- "$p" 2>/dev/null
fi
o=$(stat -L -c '%u %a' -- "$p" 2>/dev/null) || fail "$p: no such directory for the run lock; make it, or log in as another user"
case "$o" in "$u "* | "0 "*) ;; *) fail "$p belongs to uid ${o%% *}, not to this user (uid $u) nor root, so the run lock cannot be kept there; log in as its owner or as root" ;; esac
case "${o#* }" in *[2367]? | *[2367]) fail "$p is writable by others (mode ${o#* }), so the run lock cannot be kept there; chmod go-w $p" ;; esac
[ -e "$d" ] || [ -L "$d" ] || mkdir -m 0700 -- "$d" 2>/dev/null
{ [ -d "$d" ] && [ ! -L "$d" ]; } || fail "$d is not a directory (a link or a file is there); remove it (vnetbench makes it again)"
s=$(stat -c '%u %a' -- "$d") || fail "cannot read $d"
[ "$s" = "$u 700" ] || fail "$d belongs to uid ${s%% *} with mode ${s#* }, not to uid $u with mode 700; remove it (rm -r $d: vnetbench makes it again)"
n=$(readlink /proc/self/ns/net | tr -cd 0-9)
[ -n "$n" ] || fail "cannot read this host's network namespace (/proc/self/ns/net)"
f=$d/net$n.lock; w=$f.owner
{ [ -L "$f" ] || { [ -e "$f" ] && [ ! -f "$f" ]; }; } && fail "$f is not a regular file; remove it (vnetbench makes it again)"
[ -e "$f" ] || (umask 077; : >>"$f") || fail "cannot create $f"
command exec 9<"$f" 2>/dev/null || fail "cannot open $f"
if ! flock -n 9; then
    echo busy; [ -f "$w" ] && [ ! -L "$w" ] && head -c 400 -- "$w"; exit 75
fi
trap 'rm -f -- "$w"; kill $! 2>/dev/null; exit 0' TERM INT HUP
rm -f -- "$w"; (umask 077; printf '%s\n' "$1" >"$w")
echo "locked $f"
while :; do sleep 3600 9<&- & wait $!; done
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


@dataclass
class Answer:
    """What the lock script said: `held` once it printed its "locked" line (it runs on, holding the lock), else
    everything it printed before it ended (or was stopped: `stopped` says why)."""

    held: bool
    stdout: str
    stderr: str
    stopped: str = ""


def read_answer(proc: subprocess.Popen, timeout: float, limit: int = LOCK_ANSWER_BYTES.value) -> Answer:
    """The lock script's answer, read from `proc` within `timeout` seconds and `limit` bytes of each stream: its
    first line, if that says it holds the lock, else all it printed once it ended. A script that says nothing
    in time (a hung host, a FIFO opened by an older vnetbench) or too much is killed, with `stopped` saying so.
    Its input stays open meanwhile: closing it (as communicate() would) makes the wrapper end the script before
    it has said who holds the lock."""
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()  # type: ignore[union-attr]
    taken: dict[int, bytearray] = {out_fd: bytearray(), err_fd: bytearray()}
    deadline = time.monotonic() + timeout
    stopped = ""
    with selectors.DefaultSelector() as selector:
        for fd in taken:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            first, newline, _ = taken[out_fd].partition(b"\n")
            if newline and first.startswith(b"locked "):
                return Answer(True, first.decode(errors="replace"), "")
            left = deadline - time.monotonic()
            if left <= 0:
                stopped = f"it did not answer within {timeout:g} s"
                break
            for key, _ in selector.select(left):
                chunk = os.read(key.fd, 4096)
                if not chunk:
                    selector.unregister(key.fd)
                    continue
                taken[key.fd] += chunk
                if len(taken[key.fd]) > limit:
                    stopped = f"it answered more than {LOCK_ANSWER_BYTES}"
                    for fd in list(selector.get_map()):
                        selector.unregister(fd)
                    break
    if stopped:
        proc.kill()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    return Answer(False, taken[out_fd][:limit].decode(errors="replace"), taken[err_fd][:limit].decode(errors="replace"),
                  stopped)


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
            answer = read_answer(proc, conn.connect_timeout + ANSWER_S)
            if answer.held:
                locks.held[host.name] = (conn, proc)
                locks.files[host.name] = clean(answer.stdout[len("locked "):])
                continue
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream:
                    stream.close()
            conn.close()
            if proc.returncode == BUSY and not answer.stopped:
                holders = [clean(line.strip())[:HOLDER_CHARS] for line in answer.stdout.splitlines()[1:3]
                           if line.strip()]
                raise EnvironmentProblem(
                    f"{host.name} is measuring for another vnetbench run: {'; '.join(holders) or 'a run that did not say who'}"
                    " (nothing was started on any host); wait for it to end, or run on other hosts")
            lines = [line.strip() for line in answer.stderr.splitlines() if line.strip()]
            said = clean(lines[-1] if lines else answer.stdout.strip() or f"exit status {proc.returncode}")[-300:]
            if answer.stopped:
                raise HostError(f"{conn.where()}: could not take the host's run lock: {answer.stopped}, and was "
                                f"stopped ({said})",
                                "check the host's load, and what `sh` and `flock` do there")
            if proc.returncode == REFUSED and said.startswith("vnetbench-lock: "):  # it names the file and the fix
                raise HostError(f"{conn.where()}: could not take the host's run lock: {said[len('vnetbench-lock: '):]}")
            failure = conn.failure(answer.stderr)
            if failure:
                raise failure
            raise HostError(f"{conn.where()}: could not take the host's run lock: {said}",
                            f"apt-get install {FLOCK.package} there (flock)")
    except BaseException:
        locks.release()
        raise
    return locks
