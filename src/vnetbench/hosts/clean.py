"""What killed runs left on real hosts, for `vnetbench clean --hosts INVENTORY`.

A run's processes on a host end with their ssh clients (hosts/node.py), so what can stay after a kill -9 of
the controller is what the run made: its work directory (``/tmp/<run prefix>``) and its link conditions'
steering (hosts/shaping.py): IFBs named ``<run prefix>-i``/``-e``, and a clsact qdisc on an interface the
inventory opted in whose every filter sends to such an IFB (or has none: a run killed between adding the qdisc
and its filters). Everything is found by those names, so nothing of anyone else's is touched; what runs of
this machine that are measuring now use is left alone.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from vnetbench.hosts.ssh import SshConnection, with_sbin
from vnetbench.hosts.inventory import IFNAME
from vnetbench.hosts.shaping import OFFLOAD_RESTORE
from vnetbench.impair import netem
from vnetbench.lab import offload
from vnetbench.lab.netns import PREFIX

SIDES = ("ingress", "egress")
# `sh -c` prefix given OFFLOAD_RESTORE as $0: f = this host's restore file's name (hosts/shaping.HostOffload).
_OWN_RESTORE = 'f="$0.net$(readlink /proc/self/ns/net | tr -cd 0-9)"; '


_OURS = re.compile(rf"^{re.escape(PREFIX)}[0-9a-f]{{6}}-[ie]$")
_WORKDIR = re.compile(rf"^/tmp/{re.escape(PREFIX)}[0-9a-f]{{6}}$")


@dataclass
class HostLeftovers:
    host: str
    ifbs: list[str] = field(default_factory=list)
    clsacts: list[str] = field(default_factory=list)  # interfaces
    workdirs: list[str] = field(default_factory=list)
    offloads: list[list[str]] = field(default_factory=list)  # [dev, ethtool -K args...] that restore them

    def items(self) -> list[str]:
        return ([f"{i} (IFB)" for i in self.ifbs] + [f"clsact qdisc on {i}" for i in self.clsacts]
                + [f"offloads of {o[0]} (restored)" for o in self.offloads]
                + [f"{w} (work directory)" for w in self.workdirs])


_FIND_WORKDIRS = f'for d in /tmp/{PREFIX}??????; do [ -d "$d" ] && [ ! -L "$d" ] && [ -O "$d" ] && echo "$d"; done; true'


def leftovers(conn: SshConnection, skip: tuple[str, ...] = ()) -> HostLeftovers:
    """What runs of vnetbench's left on the host: IFBs and work directories named with its prefix (but those
    of runs in `skip`, measuring now), clsact qdiscs on the opted-in interfaces whose every filter sends to
    one of those IFBs (or that have none: a run killed between adding the qdisc and its filters), and the
    offloads a run turned off, as its work directory says to restore them."""
    found = HostLeftovers(conn.host.name)
    done = conn.run(with_sbin(["ip", "-j", "link", "show", "type", "ifb"]))
    try:
        names = [link["ifname"] for link in json.loads(done.stdout or "[]")]
    except (ValueError, LookupError, TypeError):
        names = []
    found.ifbs = [n for n in names if _OURS.match(n) and not n.startswith(skip)]
    for dev in conn.host.shape_interfaces:
        shown = conn.run(with_sbin(["tc", "-j", "qdisc", "show", "dev", dev]), root=True)
        if not any(q.get("kind") == "clsact" for q in netem.parse_show(shown.stdout)):
            continue
        if all(_steering_only(_filters(conn, dev, side), skip) for side in SIDES):
            found.clsacts.append(dev)
    listed = conn.run(["sh", "-c", _FIND_WORKDIRS])
    found.workdirs = [d for d in listed.stdout.split() if _WORKDIR.match(d) and not d[5:].startswith(skip)]
    if found.workdirs:
        kept = conn.run(["sh", "-c", _OWN_RESTORE + 'for d in "$@"; do [ -f "$d/$f" ] && cat "$d/$f"; done; true',
                         OFFLOAD_RESTORE, *found.workdirs])
        found.offloads = [words for words in (line.split() for line in kept.stdout.splitlines()) if _restore_ok(words)]
    return found


def _restore_ok(words: list[str]) -> bool:
    """A line HostOffload wrote: an interface name, then feature/state pairs ethtool -K takes; nothing else."""
    if len(words) < 3 or len(words) % 2 == 0 or not IFNAME.match(words[0]):
        return False
    pairs = zip(words[1::2], words[2::2])
    return all(f in offload.FEATURES and v in ("on", "off") for f, v in pairs)


def _filters(conn: SshConnection, dev: str, side: str) -> list[dict[str, Any]]:
    done = conn.run(with_sbin(["tc", "-j", "filter", "show", "dev", dev, side]), root=True)
    try:
        return list(json.loads(done.stdout or "[]"))
    except ValueError:
        return [{"unparsed": done.stdout[:200]}]


def _steering_only(filters: list[dict[str, Any]], skip: tuple[str, ...]) -> bool:
    """Whether every filter is a u32 (or its hash table) whose actions only redirect to an IFB of a run of
    vnetbench's that is not measuring: the only filters vnetbench makes. Anything else is someone else's."""
    for f in filters:
        if f.get("kind") != "u32":
            return False
        for action in (f.get("options") or {}).get("actions", []):
            to = action.get("to_dev", "")
            if action.get("kind") != "mirred" or not _OURS.match(to) or to.startswith(skip):
                return False
    return True


def remove(conn: SshConnection, left: HostLeftovers) -> list[str]:
    """Remove what `leftovers` found; returns what could not be removed."""
    errors = []

    def run(argv: list[str], what: str, root: bool = True) -> None:
        done = conn.run(with_sbin(argv), root=root)
        if done.returncode != 0:
            errors.append(f"{conn.host.name}: {what}: {done.stderr.strip()[:200]}")

    for dev, *args in left.offloads:  # before the directory that said how goes
        run(["ethtool", "-K", dev, *args], f"offloads of {dev}")
    for dev in left.clsacts:
        run(["tc", "qdisc", "del", "dev", dev, "clsact"], f"clsact qdisc on {dev}")
    for ifb in left.ifbs:
        run(["ip", "link", "del", "dev", ifb], ifb)
    for d in left.workdirs:
        # Its own restore file first; the directory goes once no other host's is in it. Hosts that share a /tmp
        # (containers or namespaces of one machine) are cleaned at once, each restoring its own offloads: the
        # others' files go within moments; one that stays (a host not cleaned now) keeps the directory.
        run(["sh", "-c", _OWN_RESTORE + 'rm -f -- "$1/$f"; n=0; while ls -d -- "$1/$0".net* >/dev/null 2>&1; do '
             'n=$((n + 1)); [ "$n" -gt 50 ] && exit 0; sleep 0.1; done; rm -rf -- "$1"', OFFLOAD_RESTORE, d],
            d, root=False)
    return errors



@dataclass
class HostCleanReport:
    host: str
    found: HostLeftovers | None = None
    errors: list[str] = field(default_factory=list)
    busy: str = ""  # a run is measuring there (it holds the host's lock): left alone


def clean_hosts(hosts: list, connect: Any, skip: tuple[str, ...] = (), dry_run: bool = False) -> list[HostCleanReport]:
    """Every host at once: what killed runs left (see `leftovers`), removed unless `dry_run`, each while
    holding the host's run lock (hosts/lock.py): a host where a run is measuring, from any controller, is left
    alone and said so. A host that cannot be reached is named with the reason; the others are still cleaned."""
    from concurrent.futures import ThreadPoolExecutor

    from vnetbench.errors import EnvironmentProblem, HostError
    from vnetbench.hosts.lock import lock_hosts

    def one(host: Any) -> HostCleanReport:
        report = HostCleanReport(host.name)
        try:
            locks = lock_hosts([host], connect, f"vnetbench clean --hosts, pid {os.getpid()}")
        except EnvironmentProblem as e:
            report.busy = str(e)
            return report
        except HostError as e:
            report.errors.append(str(e))
            return report
        try:
            with connect(host) as conn:
                report.found = leftovers(conn, skip)
                if not dry_run:
                    report.errors = remove(conn, report.found)
        except HostError as e:
            report.errors.append(str(e))
        finally:
            locks.release()
        return report

    with ThreadPoolExecutor(max_workers=min(16, max(1, len(hosts)))) as pool:
        return list(pool.map(one, hosts))
