"""Preflight of remote hosts: what each can do and what it lacks, read over its SSH connection.

Nothing is started or changed on a host: every command here only reads (``id``, ``uname``, files under
/proc and /sys, each tool's version flag, ``ip -j addr``). Remote shell snippets are fixed strings; names (tools, kernel
modules) reach them as positional arguments ("$@"), never pasted into the script.

netem (and tbf, htb) is judged without installing a qdisc, which would change the host: the module is
loaded (/sys/module/sch_X), or built into the kernel (CONFIG_NET_SCH_X=y in /proc/config.gz or
/boot/config-$(uname -r), or listed in /lib/modules/$(uname -r)/modules.builtin), or its module file is
installed (sch_X.ko* under /lib/modules/$(uname -r): loaded on first use). A host with neither a kernel
config nor /lib/modules for its kernel is reported as unknown rather than guessed.
"""

from __future__ import annotations

import ipaddress
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Sequence

from vnetbench.console import clean
from vnetbench.doctor import TOOLS
from vnetbench.errors import HostError
from vnetbench.hosts.inventory import SHAPE_VAR, InventoryHost
from vnetbench.hosts.ssh import (SBIN_PATH, AuthenticationRefused, HostKeyChanged, HostKeyUnknown, SshConnection,
                                 Unreachable, with_sbin)
from vnetbench.impair.backends import REGISTRY
from vnetbench.tools import IP, SS, TASKSET, Tool

# What every run on a host uses: without these a host cannot take part, whatever the scenario.
# A workload's tool is needed only by scenarios that use it; `run --hosts` checks those per scenario.
NEEDED_TOOLS = frozenset({IP.command, SS.command, TASKSET.command})
# The kernel qdiscs link conditions on a host are made of: the kernel link backends (impair/backend's registry).
QDISC_MODULES = tuple(kind.name for kind in REGISTRY.values() if kind.kernel)
FAN_OUT = 16  # hosts checked at once
# On a host, link conditions are the host kernel's qdiscs (hosts/shaping.py): no emulator stands in for netem.
HOST_QDISC_FIXES = {"netem": REGISTRY["netem"].fix
                    + "; until then link conditions on this host are rates and buffers only (tbf, htb)"}

_WHICH = SBIN_PATH + 'for t in "$@"; do printf "%s\\t%s\\n" "$t" "$(command -v -- "$t")"; done'
_QDISCS = ('k=$(uname -r); cfg=$(zcat /proc/config.gz 2>/dev/null || cat "/boot/config-$k" 2>/dev/null); '
           'for m in "$@"; do M=$(printf %s "$m" | tr a-z A-Z); '
           'c=$(printf "%s\\n" "$cfg" | grep -- "^CONFIG_NET_SCH_$M=" | cut -d= -f2); '
           'f=$(find "/lib/modules/$k" -name "sch_$m.ko*" 2>/dev/null | head -n 1); '
           'if [ -d "/sys/module/sch_$m" ]; then s=loaded; '
           'elif [ "$c" = y ] || grep -qs -- "/sch_$m.ko" "/lib/modules/$k/modules.builtin"; then s=built-in; '
           'elif [ -n "$f" ]; then s=module; '
           'elif [ "$c" = m ]; then s=not-installed; '
           'elif [ -n "$cfg" ] || [ -d "/lib/modules/$k" ]; then s=absent; '
           'else s=unknown; fi; printf "%s\\t%s\\n" "$m" "$s"; done')
_FACTS = ('uname -r; getconf _NPROCESSORS_ONLN 2>/dev/null || nproc; '
          'cat /proc/sys/net/ipv4/tcp_available_congestion_control; cat /proc/sys/net/ipv4/tcp_congestion_control')


@dataclass
class HostCheck:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    needed: bool = True  # lacking it means the host cannot run anything


@dataclass
class HostReport:
    host: InventoryHost
    checks: list[HostCheck] = field(default_factory=list)

    def add(self, name: str, ok: bool, detail: str, fix: str = "", needed: bool = True) -> None:
        self.checks.append(HostCheck(name, ok, detail, fix, needed))

    @property
    def lacking(self) -> list[HostCheck]:
        return [c for c in self.checks if c.needed and not c.ok]


def _connection_checks(report: HostReport, conn: SshConnection) -> bool:
    """reachable, host key, authenticated: each from what ssh said, up to the first that failed."""
    try:
        conn.connect()
    except Unreachable as e:
        report.add("reachable", False, e.reason, e.fix)
        return False
    except (HostKeyUnknown, HostKeyChanged) as e:
        report.add("reachable", True, f"{conn.host.address}")
        report.add("host key", False, e.reason, e.fix)
        return False
    except AuthenticationRefused as e:
        report.add("reachable", True, f"{conn.host.address}")
        report.add("host key", True, "known")
        report.add("authenticated", False, e.reason, e.fix)
        return False
    except HostError as e:
        report.add("reachable", False, e.reason, e.fix)
        return False
    report.add("reachable", True, f"{conn.host.address}")
    report.add("host key", True, "known" if not conn.accept_new_host_keys else "known or accepted (accept-new)")
    report.add("authenticated", True, "as " + (conn.host.user or "the user ssh's config gives"))
    return True


def _privileges(report: HostReport, conn: SshConnection) -> None:
    p = conn.privileges()
    if p.root:
        report.add("privileges", True, f"{p.user} is root")
    elif p.sudo:
        report.add("privileges", True, f"{p.user} via sudo -n")
    else:
        sudo = "apt-get install sudo, then allow" if "not found" in p.detail else "allow"
        fix = (f"{sudo} {p.user} sudo without a password: `echo '{p.user} ALL=(root) NOPASSWD: ALL' > "
               f"/etc/sudoers.d/vnetbench` (check with visudo -c), or log in as root (ansible_user: root)")
        report.add("privileges", False, f"{p.user} is not root and sudo -n fails ({p.detail})", fix)


def _facts(report: HostReport, conn: SshConnection) -> None:
    lines = conn.run(["sh", "-c", _FACTS]).stdout.splitlines() + ["", "", "", ""]
    kernel, cpus, available, default = (x.strip() for x in lines[:4])
    report.add("kernel", bool(kernel), kernel or "uname -r printed nothing", needed=False)
    report.add("cpus", cpus.isdigit(), cpus or "unknown", needed=False)
    report.add("tcp congestion control", bool(available), f"default {default or '?'}, available: {available or '?'}",
               needed=False)
    states = dict(line.split("\t", 1) for line in
                  conn.run(["sh", "-c", _QDISCS, "sh", *QDISC_MODULES]).stdout.splitlines() if "\t" in line)
    words = {"loaded": "module loaded", "built-in": "built into the kernel", "module": "module installed",
             "not-installed": "a module of this kernel, not installed", "absent": "not in this kernel",
             "unknown": "unknown: no kernel config and no /lib/modules for this kernel"}
    for m in QDISC_MODULES:
        state = states.get(m, "unknown")
        report.add(f"qdisc {m}", state in ("loaded", "built-in", "module"), words.get(state, state),
                   HOST_QDISC_FIXES.get(m) or REGISTRY[m].fix, needed=False)


def _shaping(report: HostReport, conn: SshConnection) -> None:
    """Whether link conditions may go on this host's interfaces (the inventory's opt-in), and that they exist."""
    wanted = conn.host.shape_interfaces
    if not wanted:
        report.add("link conditions", True, f"not opted in: nothing on its interfaces is changed "
                   f"({SHAPE_VAR} opts interfaces in)", needed=False)
        return
    present = set(conn.run(["ls", "/sys/class/net"]).stdout.split())
    missing = [i for i in wanted if i not in present]
    report.add("link conditions", not missing,
               f"on {', '.join(wanted)}" + (f"; no interface {', '.join(missing)} here" if missing else ""),
               f"correct {SHAPE_VAR} for {conn.host.name} in the inventory", needed=False)


def remote_version(conn: SshConnection, tool: Tool, path: str) -> str | None:
    """The same version doctor reads locally (:meth:`Tool.version`), read on the host."""
    if not tool.version_args:
        out = conn.run(["dpkg-query", "-W", "-f", "${Version}", tool.package])
        v = out.stdout.strip()
        return f"{tool.command} {v} (Debian package {tool.package})" if out.returncode == 0 and v else None
    out = conn.run([path, *tool.version_args], timeout=15)
    text = (out.stdout or out.stderr).strip().splitlines()
    return text[0].strip() if text else None


def _tools(report: HostReport, conn: SshConnection, tools: Sequence[Tool]) -> None:
    found = dict(line.split("\t", 1) for line in
                 conn.run(["sh", "-c", _WHICH, "sh", *(t.command for t in tools)]).stdout.splitlines()
                 if "\t" in line)
    for tool in tools:
        path = found.get(tool.command, "").strip()
        needed = tool.command in NEEDED_TOOLS
        if not path:
            report.add(f"tool {tool.command}", False, "missing" + ("" if needed else " (needed by scenarios using it)"),
                       f"apt-get install {tool.package}", needed=needed)
            continue
        version = remote_version(conn, tool, path) or "present, version unknown"
        report.add(f"tool {tool.command}", True, version, needed=needed)


def own_addresses(conn: SshConnection) -> list[tuple[str, str]]:
    """(interface, address) for every address on the host's interfaces, as `ip -j addr` says. Raises HostError
    when it cannot be read."""
    done = conn.run(with_sbin(["ip", "-j", "addr", "show"]))
    try:
        return [(str(link["ifname"]), str(a["local"])) for link in json.loads(done.stdout)
                for a in link.get("addr_info", []) if "local" in a]
    except (ValueError, LookupError, TypeError, AttributeError):
        raise HostError(f"{conn.where()}: `ip -j addr show` did not give its addresses "
                        f"({(done.stderr.strip() or done.stdout.strip())[:100]!r})",
                        f"apt-get install {IP.package} there (iproute2 with JSON output)") from None


def _address(report: HostReport, conn: SshConnection, address: str) -> None:
    """Whether `address` (the scenario's hosts.addresses for this host) is on one of its interfaces: the run's
    traffic goes to the host the inventory names, never to an address of someone else's."""
    name = conn.host.name
    key = f"hosts.addresses.{name}"
    try:
        wanted = ipaddress.ip_address(address.split("%", 1)[0])  # a scope names the peers' interface
    except ValueError:
        report.add(f"address {address}", False, f"{key} = {address!r} is not an IP address", f"correct {key}")
        return
    present = []  # (interface, address), as parsed here: what the host printed is quoted only as an address
    for ifname, a in own_addresses(conn):
        try:
            present.append((clean(ifname)[:15], ipaddress.ip_address(a.split("%", 1)[0])))
        except ValueError:
            continue
    found = [ifname for ifname, a in present if a == wanted]
    if found:
        report.add(f"address {address}", True, f"on {', '.join(found)}")
        return
    listed = (", ".join(f"{a} ({ifname})" for ifname, a in present if a.version == wanted.version
                        and not a.is_loopback)[:300] or f"no IPv{wanted.version} address but loopback")
    report.add(f"address {address}", False,
               f"{key} = {address} is on none of {name}'s interfaces (it has {listed}): traffic to it would go "
               "to another machine",
               f"give {key} an address of {name}'s own, or remove it to use the inventory's")


def check_host(conn: SshConnection, tools: Sequence[Tool] = TOOLS, address: str | None = None) -> HostReport:
    report = HostReport(conn.host)
    try:
        if not _connection_checks(report, conn):
            return report
        _privileges(report, conn)
        _facts(report, conn)
        _tools(report, conn, tools)
        _shaping(report, conn)
        if address is not None:
            _address(report, conn, address)
    except HostError as e:  # the host went away half-way: say so where it happened
        report.add("connection", False, e.reason, e.fix)
    return report


def check_hosts(hosts: Sequence[InventoryHost], connect: Callable[[InventoryHost], SshConnection],
                tools: Sequence[Tool] = TOOLS, addresses: dict[str, str] | None = None) -> list[HostReport]:
    """Every host at once (at most FAN_OUT at a time), each over its own connection, closed at the end;
    `addresses` (host -> address) are checked to be on their hosts' interfaces."""

    def one(host: InventoryHost) -> HostReport:
        with connect(host) as conn:
            return check_host(conn, tools, (addresses or {}).get(host.name))

    with ThreadPoolExecutor(max_workers=max(1, min(FAN_OUT, len(hosts)))) as pool:
        return list(pool.map(one, hosts))


def table(reports: Sequence[HostReport]):
    """One row per check, one column per host; a cell is the finding, marked ok / no (needed) / - (optional)."""
    from rich.markup import escape
    from rich.table import Table

    t = Table(show_lines=False, header_style="bold")
    t.add_column("check")
    for r in reports:
        t.add_column(escape(r.host.name), overflow="fold")
    names = list(dict.fromkeys(c.name for r in reports for c in r.checks))
    for name in names:
        cells = []
        for r in reports:
            c = next((c for c in r.checks if c.name == name), None)
            if c is None:
                cells.append("[dim]not checked[/]")
            else:
                mark = "[green]ok[/]" if c.ok else ("[red]no[/]" if c.needed else "[yellow]--[/]")
                cells.append(f"{mark} {escape(c.detail)}")
        t.add_row(escape(name), *cells)
    return t


def fixes(reports: Sequence[HostReport]) -> list[str]:
    """Each thing a host lacks, with what to do about it: needed things first."""
    lines = []
    for needed in (True, False):
        for r in reports:
            for c in r.checks:
                if not c.ok and c.needed == needed and c.fix:
                    lines.append(f"{'needed' if needed else 'optional'}: {r.host.name}: {c.name}: {c.fix}")
    return lines


# The rest of a host's fingerprint, once a run holds it (runner/hosts_bench.survey_hosts): its CPU model,
# the controller's fingerprint sysctls, and the interface toward its peers ($1): driver, MTU, offloads (when
# ethtool is there; it is not required), root qdisc. One line "key<TAB>value" each.
_FINGERPRINT = (SBIN_PATH + r'''
printf 'cpu model\t%s\n' "$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
peer=$1; shift
for k in "$@"; do printf 'sysctl %s\t%s\n' "$k" "$(tr '\t\n' '  ' < "/proc/sys/$(printf %s "$k" | tr . /)" 2>/dev/null | sed 's/ *$//')"; done
dev=$(ip -o route get "$peer" 2>/dev/null | sed -n 's/.* dev \([^ ]*\).*/\1/p' | head -n 1)
[ -n "$dev" ] || exit 0
drv=$(basename "$(readlink "/sys/class/net/$dev/device/driver" 2>/dev/null)" 2>/dev/null)
[ -n "$drv" ] || drv=$(sed -n 's/^DEVTYPE=//p' "/sys/class/net/$dev/uevent" 2>/dev/null)
printf 'interface\t%s (driver %s, mtu %s)\n' "$dev" "${drv:-virtual}" "$(cat "/sys/class/net/$dev/mtu")"
if command -v ethtool >/dev/null 2>&1; then
    printf 'offloads\t%s\n' "$(ethtool -k "$dev" 2>/dev/null | grep -E '^(tcp-segmentation-offload|generic-segmentation-offload|generic-receive-offload|large-receive-offload):' | sed 's/-offload//; s/: /=/; s/ .*//' | tr '\n' ' ' | sed 's/ *$//')"
else
    printf 'offloads\t%s\n' "not read: ethtool is not installed"
fi
printf 'root qdisc\t%s\n' "$(tc qdisc show dev "$dev" root 2>/dev/null | head -n 1 | cut -d' ' -f2- | sed 's/ *$//')"
''')


def fingerprint(conn: SshConnection, peer: str, sysctls: Sequence[str]) -> dict[str, str]:
    """What a host is, beyond the preflight: CPU model, sysctls, and the interface it reaches `peer` through
    (driver, MTU, offloads, root qdisc), as "key": "value" for the run's fingerprint."""
    done = conn.run(["sh", "-c", _FINGERPRINT, "sh", peer, *sysctls])
    return {k: v for k, _, v in (line.partition("\t") for line in done.stdout.splitlines()) if k}
