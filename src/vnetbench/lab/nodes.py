"""Nodes, interfaces and links: Mininet's division of labour.

Nodes (RunsCommands) know how to execute commands, interfaces know how to configure
themselves, links know how to connect two namespaces. Everything created is
registered with the lab's teardown registry the moment it exists.
"""

from __future__ import annotations

import ipaddress
import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Sequence

from vnetbench import runfiles
from vnetbench.errors import LabError
from vnetbench.lab import netns
from vnetbench.lab.teardown import Registry, atomic, start_process

IFA_F_NODAD = 0x02  # skip IPv6 duplicate address detection: addresses are usable at once


@dataclass
class Namespace:
    """A named network namespace with one netlink socket bound to it."""

    name: str
    ipr: netns.Netlink

    @classmethod
    def create(cls, name: str, registry: Registry) -> "Namespace":
        if netns.exists(name):
            raise LabError(f"namespace {name} already exists: a run with this id is active, or run `vnetbench clean`")
        with atomic():
            netns.create(name)
            registry.add(f"namespace {name}", lambda: netns.remove(name))
            ipr = netns.open_iproute(name)
            registry.add(f"netlink socket of {name}", ipr.close)
        ns = cls(name, ipr)
        ns.link_up("lo")
        return ns

    def has(self, ifname: str) -> bool:
        return bool(self.ipr.link_lookup(ifname=ifname))

    def index(self, ifname: str) -> int:
        found = self.ipr.link_lookup(ifname=ifname)
        if not found:
            raise LabError(f"interface {ifname} not found in namespace {self.name}")
        return found[0]

    def link_up(self, ifname: str) -> None:
        self.ipr.link("set", index=self.index(ifname), state="up")

    def sysctl(self, key: str, value: str) -> None:
        """Write a per-namespace sysctl (net.*) from inside the namespace."""
        path = Path("/proc/sys") / key.replace(".", "/")
        with netns.inside(self.name):
            path.write_text(value)

    def sysctl_read(self, key: str) -> str:
        """Read a per-namespace sysctl (net.*) from inside the namespace."""
        path = Path("/proc/sys") / key.replace(".", "/")
        with netns.inside(self.name):
            return path.read_text().strip()


@dataclass
class Interface:
    ns: Namespace
    name: str

    @property
    def index(self) -> int:
        return self.ns.index(self.name)

    def add_address(self, addr: str) -> None:
        iface = ipaddress.ip_interface(addr)
        flags = IFA_F_NODAD if iface.version == 6 else 0
        self.ns.ipr.addr("add", index=self.index, address=str(iface.ip), prefixlen=iface.network.prefixlen,
                         flags=flags)

    def set_mtu(self, mtu: int) -> None:
        self.ns.ipr.link("set", index=self.index, mtu=mtu)

    def up(self) -> None:
        self.ns.link_up(self.name)


@dataclass
class Link:
    """A veth pair between two namespaces: a.name in a.ns <-> b.name in b.ns."""

    a: Interface
    b: Interface

    @classmethod
    def connect(cls, ns_a: Namespace, name_a: str, ns_b: Namespace, name_b: str, registry: Registry,
                mtu: int = 1500) -> "Link":
        # Created inside ns_a with the peer placed straight into ns_b: nothing
        # ever appears in the root namespace, so a crash cannot strand it there.
        # No undo of its own: both ends live in namespaces of this lab, and
        # removing a namespace destroys its devices in one batch. Deleting veths
        # one by one costs an RCU grace period each (about 1 s for 32 hosts).
        try:
            ns_a.ipr.link("add", ifname=name_a, kind="veth",
                          peer={"ifname": name_b, "net_ns_fd": f"{netns.NETNS_DIR}/{ns_b.name}"})
        except Exception as e:
            raise LabError(f"creating veth {ns_a.name}/{name_a} <-> {ns_b.name}/{name_b}: {e}") from e
        link = cls(Interface(ns_a, name_a), Interface(ns_b, name_b))
        for end in (link.a, link.b):
            if mtu != 1500:
                end.set_mtu(mtu)
            end.up()
        return link


# A command started on a node whose command channel does not stop it when the channel goes (`docker exec`,
# moby issue 9098; an SSH session without a terminal) runs through this script, given as `sh -c SCRIPT
# NAME [-t] [-c CPUS] ARGV...` or installed as a file. The client's standard input is held open for the command's
# life, and the script ends the command's process group when it closes (the tool itself gets /dev/null; the
# input is kept on fd 3 because an asynchronous list's standard input is /dev/null), SIGKILL 2 s after
# SIGTERM. The tool's exit status is the script's. With -t, the command's CPU time follows on standard error
# once it has ended: a marker line, then the shell's `times` (its own line, then its reaped children's: the
# command's user and system time with what the command reaped), read by :func:`wrapper_cpu_seconds`. A trial's
# processes are timed so that an instrument's own CPU can be told from the traffic's (a ping below 10 ms
# spins a core). `bin_dir` is where setsid, taskset and sh are ("/bin/" in a busybox image; "" to look them up
# on PATH), `where` ends the message of a command not found.
_EXEC_WRAPPER = r"""#!/bin/sh
timed=
[ "$1" = -t ] && { timed=1; shift; }
cpus=
[ "$1" = -c ] && { cpus=$2; shift 2; }
case "$1" in
    */*) prog=$1 ;;
    *) prog=$(which "$1") || { echo "vnb-exec: $1: command not found @WHERE@" >&2; exit 127; } ;;
esac
shift
if [ -n "$cpus" ]; then set -- @BIN@taskset -c "$cpus" "$prog" "$@"; else set -- "$prog" "$@"; fi
exec 3<&0
@BIN@setsid "$@" </dev/null 3<&- &
child=$!
# The watcher is a session of its own too, so that it goes with everything it started (its cat, its sleep)
# when the command ends first. The command's pid is signalled as well as its group: input may close before
# the command has made its session.
@BIN@setsid @BIN@sh -c 'cat >/dev/null; kill -TERM -"$1" "$1"; sleep 2; kill -KILL -"$1" "$1"' watcher "$child" \
    <&3 >/dev/null 2>&1 &
watcher=$!
exec 3<&-
wait "$child"
status=$?
kill -TERM -"$watcher" 2>/dev/null
# `times` in this shell itself (a pipe or $(...) would time a subshell): the group is not a subshell
[ -n "$timed" ] && { echo "@MARK@"; times; } >&2
exit $status
"""
# The line after which a timed command's CPU time follows on its standard error (see above).
CPU_MARK = "vnb-exec: the command's CPU time (user, system):"
_TIMES = re.compile(r"(\d+)m\s*([\d.]+)s")


def exec_wrapper(bin_dir: str, where: str) -> str:
    """The wrapper above for a node whose tools are in `bin_dir`; `where` names the node in its messages."""
    return _EXEC_WRAPPER.replace("@BIN@", bin_dir).replace("@WHERE@", where).replace("@MARK@", CPU_MARK)


def wrapper_cpu_seconds(stderr: str) -> float | None:
    """The CPU seconds (user + system) a command run through the wrapper with -t used, from what it wrote on
    standard error (None: the wrapper did not say, as when it was killed itself)."""
    head, mark, tail = stderr.rpartition(CPU_MARK)
    lines = tail.strip().splitlines() if mark else []
    if len(lines) < 2:
        return None
    times = _TIMES.findall(lines[1])  # the second line of `times`: the children's user and system time
    if len(times) != 2:
        return None
    return sum(60 * int(m) + float(s) for m, s in times)


def without_cpu_time(stderr: str) -> str:
    """What a command wrote on standard error, without the CPU time the wrapper added after it."""
    head, mark, _ = stderr.rpartition(CPU_MARK)
    return head.rstrip("\n") if mark else stderr


class RunsCommands:
    """Starting and running processes on a host, given its ``command(argv, pin)`` (the argv that runs
    ``argv`` there) and the ``registry`` that must kill what was started when the lab goes away."""

    registry: Registry
    # A started process's standard input: nothing, or (PIPE) a pipe held open until it ends, for a host whose
    # command channel ends the command when its input closes (a container engine's exec).
    stdin_of_started: ClassVar[int] = subprocess.DEVNULL
    # Whether each command is pinned to ``cpu`` as it is now (taskset, an engine's exec): a core changed between
    # configurations then holds from the next command on.
    pins_each_command: ClassVar[bool] = True

    # Whether its commands run through the exec wrapper (exec_wrapper), which says a timed command's CPU time;
    # otherwise a started process is this machine's own child, and reaping it (teardown.wait_metered) does.
    timed_by_wrapper: ClassVar[bool] = False

    def command(self, argv: Sequence[str], pin: bool = True, timed: bool = False) -> list[str]:
        """The argv that runs `argv` here (`timed`: through the exec wrapper, with -t)."""
        raise NotImplementedError

    def cpu_seconds(self, proc: subprocess.Popen, stderr: Path) -> float | None:
        """The CPU seconds (user + system, with what it reaped) a process started here with ``timed`` used,
        once it has ended (None: not known, as for a process something else reaped)."""
        if self.timed_by_wrapper:
            try:
                return wrapper_cpu_seconds(stderr.read_text(errors="replace"))
            except OSError:
                return None
        return getattr(proc, "cpu_s", None)

    def placement(self) -> dict[str, Any]:
        """Where this endpoint runs, as the run records it (the endpoint -> node mapping): the node, its
        addresses and interface, the CPU it is pinned to."""
        raise NotImplementedError

    def echo_address(self, ip_version: int) -> str:
        """Where other hosts send ICMP echo requests to reach this endpoint itself. Its service address, unless
        that is an address in front of it that answers echo itself (a container engine's published ports)."""
        return self.service_address(ip_version)  # type: ignore[attr-defined]

    def popen(self, argv: Sequence[str], stdout: Path, stderr: Path, pin: bool = True,
              within: Path | None = None, timed: bool = False) -> subprocess.Popen:
        """Start a process in this host; its output goes to files (no pipe can fill and stall it), made new
        in the run's directory `within` (default: their own) by :func:`vnetbench.runfiles.create`. `timed`:
        its CPU time is wanted (:meth:`cpu_seconds`); ``started_at`` on the process is when it started."""
        command = self.command(argv, pin, timed=True) if timed else self.command(argv, pin)
        with runfiles.create(stdout, within) as out, runfiles.create(stderr, within) as err, atomic():
            proc = start_process(command, stdout=out, stderr=err, stdin=self.stdin_of_started,
                                 start_new_session=True)
            self.registry.add_process(proc)
        proc.started_at = time.time()  # type: ignore[attr-defined]
        return proc

    # The most run() takes of a command's stdout or of its stderr (None: no bound, for this machine's own tools);
    # a host vnetbench does not control answers within limits.REMOTE_OUTPUT_BYTES.
    output_limit: ClassVar[int | None] = None

    def run(self, argv: Sequence[str], timeout: float = 10.0, pin: bool = False) -> subprocess.CompletedProcess:
        if self.stdin_of_started != subprocess.PIPE:
            return bounded_run(self.command(argv, pin), timeout, self.output_limit)
        return run_holding_input(self.command(argv, pin), timeout, self.output_limit)


def run_on_each(nodes: Sequence[RunsCommands], argv: Sequence[str], timeout: float = 10.0
                ) -> list[subprocess.CompletedProcess | BaseException]:
    """`argv` run on every node at once, a thread each: per node, in order, its answer or what its run() raised.
    Where a command is a connection of its own (a guest's SSH handshake under TCG, 0.3-1 s; a pod's exec through
    the API) the nodes then take as long as the slowest of them, not the sum."""
    def answer(node: RunsCommands) -> subprocess.CompletedProcess | BaseException:
        try:
            return node.run(argv, timeout=timeout)
        except Exception as e:  # noqa: BLE001 - the caller judges it
            return e

    if len(nodes) <= 1:  # no thread for one
        return [answer(node) for node in nodes]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=len(nodes), thread_name_prefix="vnb-each") as pool:
        return list(pool.map(answer, nodes))


def placement_entry(node: str, ipv4: str, ipv6: str, interface: str | None, cpu: int | None,
                    **more: Any) -> dict[str, Any]:
    """One endpoint's entry in the mapping, the same keys wherever it runs (None: not known or not set)."""
    return {"node": node, "addresses": [a for a in (ipv4, ipv6) if a], "interface": interface, "cpu": cpu, **more}


class OutputTooLarge(LabError):
    """A command answered more than its caller takes (``bounded_run``'s limit): it was killed."""


def too_large(argv: Sequence[str], limit: int, which: str) -> OutputTooLarge:
    """The error for a command stopped because its `which` ("output", "error output") passed `limit` bytes."""
    return OutputTooLarge(f"`{' '.join(map(str, argv[-1:]))[:200]}` answered more than {limit / 2**20:g} MiB of "
                          f"{which}; it was stopped and its answer not read (see limits.REMOTE_OUTPUT_BYTES)")


def bounded_run(argv: Sequence[str], timeout: float, limit: int | None = None, stdin: Any = subprocess.DEVNULL
                ) -> subprocess.CompletedProcess:
    """subprocess.run(argv, capture_output=True, text=True, timeout=timeout), but a stream that passes `limit`
    bytes kills the command and raises OutputTooLarge, holding at most `limit` + 64 KiB of each in memory (a
    host answering 200 MB once took 606 MiB). Text is decoded as UTF-8, bytes that are not shown as U+FFFD."""
    if limit is None:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, stdin=stdin,
                              errors="replace")
    import selectors
    import time

    proc = subprocess.Popen(list(argv), stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()  # type: ignore[union-attr]
    taken: dict[int, bytearray] = {out_fd: bytearray(), err_fd: bytearray()}
    deadline = time.monotonic() + timeout
    try:
        with selectors.DefaultSelector() as selector:
            for fd in taken:
                selector.register(fd, selectors.EVENT_READ)
            while selector.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise subprocess.TimeoutExpired(list(argv), timeout)
                for key, _ in selector.select(left):
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        selector.unregister(key.fd)
                        continue
                    taken[key.fd] += chunk
                    if len(taken[key.fd]) > limit:
                        raise too_large(argv, limit, "output" if key.fd == out_fd else "error output")
        status = proc.wait(max(deadline - time.monotonic(), 0.1))
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    finally:
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]
    return subprocess.CompletedProcess(list(argv), status, bytes(taken[out_fd]).decode("utf-8", "replace"),
                                       bytes(taken[err_fd]).decode("utf-8", "replace"))


def run_holding_input(argv: Sequence[str], timeout: float, limit: int | None = None) -> subprocess.CompletedProcess:
    """subprocess.run for a command that ends when its input closes (through the exec wrapper): it gets a pipe
    whose write end stays here until it ends (subprocess.run would close a PIPE at once, and the command with
    it). A timeout kills the client, which ends the command on its node as well."""
    read_end, write_end = os.pipe()
    try:
        return bounded_run(argv, timeout, limit, stdin=read_end)
    finally:
        os.close(read_end)
        os.close(write_end)


@dataclass
class NamespaceNode(RunsCommands):
    """A namespace that runs workload processes.

    Environments (:mod:`vnetbench.lab.environments`) configure a host rather
    than subclass it: ``wrapper`` is an argv prefix every command runs through
    before it enters the namespace (a container's cgroup join: ``ip netns exec``
    remounts /sys, hiding the cgroup files), ``public_ipv4/6`` the
    address other hosts reach its servers at when that is not its own (a
    container behind its node's NAT), ``env_facts`` what the environment wants
    recorded about it.
    """

    name: str
    ns: Namespace
    registry: Registry
    ipv4: str = ""
    ipv6: str = ""
    cpu: int | None = None
    iface: Interface | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    wrapper: tuple[str, ...] = ()
    public_ipv4: str = ""
    public_ipv6: str = ""
    env_facts: dict[str, Any] = field(default_factory=dict)

    def address(self, ip_version: int) -> str:
        return self.ipv6 if ip_version == 6 else self.ipv4

    def service_address(self, ip_version: int) -> str:
        """Where other hosts must send to reach a server running here."""
        public = self.public_ipv6 if ip_version == 6 else self.public_ipv4
        return public or self.address(ip_version)

    def facts(self) -> dict[str, Any]:
        return dict(self.env_facts)

    def placement(self) -> dict[str, Any]:
        return placement_entry(f"namespace {self.ns.name}", self.ipv4, self.ipv6, self.iface.name if self.iface else None,
                          self.cpu, public=" ".join(a for a in (self.public_ipv4, self.public_ipv6) if a) or None)

    def command(self, argv: Sequence[str], pin: bool = True, timed: bool = False) -> list[str]:
        prefix = [*self.wrapper, "ip", "netns", "exec", self.ns.name]
        if pin and self.cpu is not None:
            prefix += ["taskset", "-c", str(self.cpu)]
        return prefix + [str(a) for a in argv]
