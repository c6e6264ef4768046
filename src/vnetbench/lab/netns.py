"""Network namespaces: create, enter for a netlink socket, remove.

Namespaces are created and entered from the calling thread with setns(2)
instead of pyroute2's forked helper processes: a 128-host lab then comes up in
a fraction of the time (measured in bench/lab_setup.py). Only the calling
thread changes namespace, and always returns before the context ends.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any, Iterator

from vnetbench.errors import LabError
from vnetbench.lab import marks
from vnetbench.lab.teardown import atomic


@functools.cache
def rtnl() -> SimpleNamespace:
    """pyroute2's parts vnetbench uses, imported at first use: importing pyroute2 takes half a second, which
    every command paid at its start, most of them (plan, show, compare, report) never opening netlink. Every
    socket decodes bfifo's options with pfifo's codec: they are the same struct (one u32 limit, here in bytes),
    and pyroute2 ships only pfifo's."""
    from pyroute2 import IPRoute, netns
    from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST
    from pyroute2.netlink.rtnl import RTM_NEWADDR, RTM_NEWLINK, RTM_NEWROUTE
    from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
    from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg
    from pyroute2.netlink.rtnl.rtmsg import rtmsg
    from pyroute2.netlink.rtnl.tcmsg import common as tc_common, plugins as tc_plugins, sched_pfifo

    tc_plugins.setdefault("bfifo", sched_pfifo)
    return SimpleNamespace(
        IPRoute=IPRoute, netns=netns, tc_common=tc_common, ifaddrmsg=ifaddrmsg, ifinfmsg=ifinfmsg, rtmsg=rtmsg,
        NLM_F_ACK=NLM_F_ACK, NLM_F_CREATE=NLM_F_CREATE, NLM_F_EXCL=NLM_F_EXCL, NLM_F_REQUEST=NLM_F_REQUEST,
        RTM_NEWADDR=RTM_NEWADDR, RTM_NEWLINK=RTM_NEWLINK, RTM_NEWROUTE=RTM_NEWROUTE)


NETNS_DIR = "/var/run/netns"
PREFIX = "vnb-"
# A throw-away namespace of one process (a qdisc probe: doctor, a backend's capabilities), named with its pid:
# `vnb-<purpose>-<pid>`. No run's name has that shape (a run's is `vnb-<6 hex>-<endpoint>`).
TRANSIENT = re.compile(rf"{re.escape(PREFIX)}([a-z]+)-([0-9]+)")


def transient_owner(name: str) -> int | None:
    """The pid whose throw-away namespace `name` is, or None for any other name."""
    found = TRANSIENT.fullmatch(name)
    return int(found.group(2)) if found else None
# A name vnetbench gives to a namespace it did not make and whose processes are not its own (a container
# engine's daemon lives in it: the host's own namespace, for a system dockerd). Removing the name only
# unmounts it; `vnetbench clean` never signals the processes inside.
FOREIGN_SUFFIX = ".foreign"


def foreign_name(run_prefix: str, what: str) -> str:
    return f"{run_prefix}-{what}{FOREIGN_SUFFIX}"


def is_foreign(name: str) -> bool:
    return name.endswith(FOREIGN_SUFFIX)


def run_prefix(run_id: str) -> str:
    """The prefix of every namespace (and cgroup, and link emulator) a run makes: ``vnb-`` and its id's first 6."""
    return f"{PREFIX}{run_id[:6]}"


WORKDIR_PREFIX = "vnetbench-"  # + the run's prefix (vnb-<id>-): a run's local work directory, in the temp dir


def list_names() -> list[str]:
    try:
        return sorted(os.listdir(NETNS_DIR))
    except FileNotFoundError:
        return []


def exists(name: str) -> bool:
    return os.path.exists(os.path.join(NETNS_DIR, name))


@contextmanager
def inside(name: str) -> Iterator[None]:
    """Run the body with this thread in namespace `name`."""
    # By descriptor: given a name, pyroute2 lists the namespace directory first (quadratic in a 1,000-node lab).
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        target = os.open(os.path.join(NETNS_DIR, name), os.O_RDONLY | os.O_CLOEXEC)
        try:
            rtnl().netns.setns(target, flags=0)
        finally:
            os.close(target)
        yield
    finally:
        rtnl().netns.setns(home, flags=0)
        os.close(home)


def create(name: str) -> None:
    """Create a named namespace (bind-mounted under /var/run/netns like `ip netns add`), marked as vnetbench's
    (:mod:`vnetbench.lab.marks`: `clean` removes only what carries a mark)."""
    marks.mark("netns", name)  # first: a kill between leaves a mark without a namespace, which clean sweeps
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        # unshare(CLONE_NEWNET) in this thread, bind-mount it, then come back.
        rtnl().netns._create(name)  # noqa: SLF001 - the fork-free variant of pyroute2.netns.create
    finally:
        rtnl().netns.setns(home, flags=0)
        os.close(home)


class Netlink:
    """An IPRoute whose every call runs with signals held off (:func:`vnetbench.lab.teardown.atomic`).

    pyroute2 (0.9) runs an asyncio loop inside each call; a Ctrl-C or SIGTERM raised into it by the
    run's handler left the loop waiting in select() forever, with the lab still standing. Calls are
    short (one netlink exchange), so deferring a signal until they return costs nothing.
    """

    def __init__(self, ipr: Any):  # a pyroute2 IPRoute
        self._ipr = ipr

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._ipr, name)
        if not callable(attr):
            return attr

        @functools.wraps(attr)
        def shielded(*args: Any, **kwargs: Any) -> Any:
            with atomic():
                return attr(*args, **kwargs)

        return shielded


def open_iproute(name: str | None) -> Netlink:
    """A netlink socket bound to namespace `name` (None: the current one)."""
    with atomic():
        if name is None:
            return Netlink(rtnl().IPRoute())
        with inside(name):
            return Netlink(rtnl().IPRoute())


def apply_ruleset(name: str, ruleset: str) -> None:
    """Load an nftables ruleset inside namespace `name` (nft -f, from stdin)."""
    if shutil.which("nft") is None:  # `ip netns exec` would say only that its exec failed
        raise LabError("nft is missing: apt-get install nftables")
    try:
        out = subprocess.run(["ip", "netns", "exec", name, "nft", "-f", "-"], input=ruleset, capture_output=True,
                             text=True, timeout=10)
    except FileNotFoundError:
        raise LabError("nft is missing: apt-get install nftables") from None
    if out.returncode != 0:
        raise LabError(f"nftables ruleset refused in {name}: {out.stderr.strip()[-400:]}")


def attach(name: str, pid: int) -> None:
    """Give process `pid`'s network namespace a name (`ip netns attach`), marked as a name vnetbench gave."""
    marks.mark("netns", name)
    r = subprocess.run(["ip", "netns", "attach", name, str(pid)], capture_output=True, text=True)
    if r.returncode != 0:
        marks.unmark("netns", name)
        raise LabError(f"ip netns attach {name} {pid}: {r.stderr.strip()}")


def remove(name: str) -> None:
    if exists(name):
        rtnl().netns.remove(name)
    marks.unmark("netns", name)


def is_hosts_own(name: str) -> bool:
    """True when namespace `name` is the machine's own: init's, or the one this process runs in (init's may not
    be readable, in a container or a VM sandbox). Its processes are everyone's, this one's included."""
    try:
        st = os.stat(os.path.join(NETNS_DIR, name))
    except OSError:
        return False
    for own in ("/proc/1/ns/net", "/proc/self/ns/net"):
        try:
            other = os.stat(own)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (other.st_dev, other.st_ino):
            return True
    return False


def pids(name: str) -> list[int]:
    """Processes whose network namespace is `name` (what `ip netns pids` prints)."""
    try:
        target = os.stat(os.path.join(NETNS_DIR, name))
    except FileNotFoundError:
        return []
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{entry}/ns/net")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
            out.append(int(entry))
    return out


def probe_qdiscs(qdiscs: dict[str, str], purpose: str = "probe") -> dict[str, str | None]:
    """Which qdiscs this kernel accepts: ``{kind: None if it does, else the kernel's first error line}``.

    ``qdiscs`` maps a kind to the ``tc qdisc add`` arguments that try it (``clsact`` goes on its own
    parent). The test is on a veth pair in a throw-away namespace (``vnb-<purpose>-<pid>``), so
    nothing of the host is touched; detection by trying, as a module may load on demand.
    """
    name = f"{PREFIX}{purpose}-{os.getpid()}"
    result: dict[str, str | None] = {}
    with atomic():  # nothing registers this namespace: a signal must wait until it is gone again
        create(name)
        try:
            subprocess.run(["ip", "-n", name, "link", "add", "d0", "type", "veth", "peer", "name", "d1"],
                           check=True, capture_output=True)
            for kind, args in qdiscs.items():
                parent = ["clsact"] if kind == "clsact" else ["root"]
                out = subprocess.run(["tc", "-n", name, "qdisc", "add", "dev", "d0", *parent, *args.split()],
                                     capture_output=True, text=True)
                result[kind] = None if out.returncode == 0 else (out.stderr.strip().splitlines() or ["failed"])[0]
                subprocess.run(["tc", "-n", name, "qdisc", "del", "dev", "d0", *parent], capture_output=True)
        finally:
            remove(name)
    return result
