"""Link conditions on real hosts (`run --hosts`), where the inventory lets vnetbench change a host's
interface (its ``vnetbench_shape_interfaces`` variable; without it nothing on a host's interfaces changes), and
inside a cluster's pods (`run --kube` with ``kube.shape_pods = true``: :mod:`vnetbench.kube.conditions`), each
through a :class:`Shell` that runs commands where the interface is.

The interface's own qdisc is never replaced. Only the traffic between the scenario's endpoints is steered,
by u32 filters on a ``clsact`` qdisc added to the interface, into IFB devices made for the run, one per side
that has conditions; the conditions are qdiscs on those IFBs, built by the same tc commands as the lab's
kernel backends (tbf or htb alone, or netem with a tbf/htb child: :mod:`vnetbench.impair.netem`)::

    receiver, link "bottleneck"   ingress from the senders  -> IFB <run prefix>-i   forward conditions
                                  egress toward the senders -> IFB <run prefix>-e   reverse conditions
    sender N, link "sN"           egress toward the receiver -> IFB <run prefix>-e  forward conditions
                                  ingress from the receiver  -> IFB <run prefix>-i  reverse conditions

So the host's other traffic (its SSH session, its services) is never shaped, and undoing is deleting the
clsact qdisc (its filters go with it) and the IFBs; the interface's qdiscs are read before and compared
after, and a difference is reported. The bottleneck is on the receiver's ingress because that is where every
sender's traffic meets, as at the port of a switch in front of it: the packets have crossed the wire, and the
senders feel the queue only through its delay and drops. A sender's own link is on its egress, where its
stack does feel the queue (TCP small queues, a UDP socket's send buffer), as any shaping on a host does.

What is made is registered in the run's teardown before it is made; after a kill -9 of the controller,
`vnetbench clean --hosts INVENTORY` finds it by name (:mod:`vnetbench.hosts.clean`).
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from vnetbench.errors import HostError, LabError
from vnetbench.hosts.inventory import SHAPE_VAR, InventoryHost
from vnetbench.hosts.ssh import SshConnection, with_sbin
from vnetbench.impair import backends as B
from vnetbench.impair import netem
from vnetbench.impair.backend import RATE_QDISC_NEEDS, Backend, TrialCounters
from vnetbench.impair.model import LinkSpec, capability_list, lab_links
from vnetbench.impair.tc import installed_roots
from vnetbench.lab import offload
from vnetbench.lab.teardown import Registry

STEERING_QDISCS = ("clsact", "ingress")
SIDES = ("ingress", "egress")


def ifb_name(run_prefix: str, side: str) -> str:
    """The IFB of a run's `side` on a host: "vnb-abcdef-i" / "-e" (15 bytes at most, as IFNAMSIZ allows)."""
    return f"{run_prefix}-{side[0]}"[:15]


def side_of(direction: str, host_upstream: bool) -> str:
    """Which side of the host's interface carries `direction` of its link: the stream's data (forward) leaves
    a sender (upstream) and arrives at the receiver."""
    return "egress" if (direction == "forward") == host_upstream else "ingress"


class Shell(Protocol):
    """Where an interface's commands run, as root: an SSH connection to a host, or a pod's exec
    (kube/conditions.py). `name` is what records and messages call the endpoint; `where()` says how to find it."""

    name: str

    def run(self, argv: list[str], timeout: float = 30.0, pin: bool = False, root: bool = False) -> Any: ...

    def where(self) -> str: ...


# --------------------------------------------------------------------------------- planning (no connection)


def links_by_host(configs: list, carriers: Callable[[Any], dict[str, str]]) -> dict[str, dict[str, list[LinkSpec]]]:
    """host -> {link name: its distinct specs with conditions, over the configurations}, on the host that carries
    it in each configuration (`carriers(config)`: link name -> host, e.g. {"bottleneck": the receiver, "s1": the
    first sender})."""
    out: dict[str, dict[str, list[LinkSpec]]] = {}
    for c in configs:
        hosts = carriers(c)
        for name, spec in lab_links(c.scenario.lab).items():
            if name in hosts and not spec.is_plain():
                specs = out.setdefault(hosts[name], {}).setdefault(name, [])
                if spec not in specs:
                    specs.append(spec)
    return out


def dumbbell_carriers(receiver: str, senders: list[str], active: int) -> dict[str, str]:
    """Which endpoint carries each link of a dumbbell: the bottleneck the receiver, sN the Nth of the `active`
    senders."""
    return {"bottleneck": receiver, **{f"s{i}": h for i, h in enumerate(senders[:active], 1)}}


def lab_only_problem(name: str, spec: LinkSpec, place: str = "on a host") -> str | None:
    """Why a link's conditions cannot be made with the kernel qdiscs of a host (or of a pod: `place`), or None."""
    if spec.backend == "userspace":
        return (f"lab.link.{name}.backend = 'userspace': the emulator runs in the local lab only; {place} use "
                "'auto', 'tbf', 'htb' or 'netem'")
    beyond = B.unable("netem", spec.needs())
    if beyond:
        return (f"link {name!r} asks for {capability_list(beyond)}, which only the userspace emulator does (in the "
                f"local lab); {place}, conditions are its kernel's qdiscs: rate, buffer, delay, jitter, "
                "loss, reordering, duplication and corruption")
    return None


def conditions_on(host: str, links: dict[str, list[LinkSpec]]) -> str:
    """"link conditions on HOST (LINK: what; ...)", for messages."""
    return f"link conditions on {host} (" + "; ".join(
        f"{n}: {specs[0].describe()}" + (f" (and {len(specs) - 1} more)" if len(specs) > 1 else "")
        for n, specs in links.items()) + ")"


def opt_in_problem(host: InventoryHost, inventory_path: Any, what: str) -> str | None:
    """Why `what` (a change to `host`'s interfaces) cannot be made: the inventory does not opt the host in."""
    if host.shape_interfaces:
        return None
    return (f"the scenario puts {what}, and {inventory_path} does not let vnetbench change {host.name}'s "
            f"interfaces: add `{SHAPE_VAR}: [IFACE]` (the interface toward the other endpoints) to {host.name}'s "
            "variables; nothing on a host's interfaces is changed without it")


def host_backend(name: str, specs: list[LinkSpec], qdiscs: dict[str, str | None], rate_qdisc: str,
                 where: str) -> str | None:
    """On a host whose kernel has `qdiscs` (None: usable, else why not): every explicit backend of the link's
    specs checked, and the one its `auto` specs get, chosen once over all they ask (one instrument for a
    sweep, as in the lab): the rate qdisc alone for rate and buffer, else netem. None when no spec is auto."""
    caps = B.Capabilities(qdiscs=qdiscs, vnb_link=None)
    auto = [spec for spec in specs if spec.backend == "auto"]
    for spec in specs:
        if spec.backend != "auto":
            B.choose(spec, caps=caps, rate_qdisc=rate_qdisc, where=where)
    if not auto:
        return None
    needs = set().union(*(spec.needs() for spec in auto))
    if needs <= RATE_QDISC_NEEDS and caps.available(rate_qdisc):
        return rate_qdisc
    if caps.available("netem"):
        return "netem"
    missing = rate_qdisc if needs <= RATE_QDISC_NEEDS else "netem"
    raise HostError(f"{where}link {name!r} ({capability_list(needs)}) needs the {missing} qdisc: "
                    f"{caps.why_not(missing)}",
                    f"load it in the kernel of the host (or of the pods' node): modprobe sch_{missing}; or drop "
                    "the conditions only netem makes")


# -------------------------------------------------------------------------------------------- the host side


@dataclass
class InterfaceFacts:
    """The interface a host reaches its peers through, found before anything starts."""

    name: str
    mtu: int
    qdiscs: list[dict[str, Any]]  # as `tc -j qdisc show dev` printed them before the run

    def record(self) -> str:
        return f"{self.name} (mtu {self.mtu})"


def route_interface(conn: Shell, peers: list[str], named: str | None = None,
                    no_route_fix: str = "") -> str:
    """The interface the host's routes send to `peers` through (one for all of them); when the scenario
    `named` one (hosts.interfaces), it must be that one. `no_route_fix` says what to do when a peer has no
    route (by default: a host's route, or its address in hosts.addresses)."""
    devs = set()
    for peer in peers:
        done = conn.run(with_sbin(["ip", "-j", "route", "get", peer]))
        try:
            devs.add(json.loads(done.stdout)[0]["dev"])
        except (ValueError, LookupError, TypeError):
            raise HostError(f"{conn.where()}: `ip route get {peer}` found no route "
                            f"({(done.stderr or done.stdout).strip()[:200]})",
                            no_route_fix or f"give {conn.name} a route to {peer}, or the right address in "
                            "hosts.addresses") from None
    if len(devs) != 1:
        raise HostError(f"{conn.where()}: the routes to the other endpoints ({', '.join(peers)}) leave through "
                        f"several interfaces ({', '.join(sorted(devs))}); vnetbench shapes one",
                        "route the endpoints' addresses through one interface")
    dev = devs.pop()
    if named and dev != named:
        raise HostError(f"{conn.where()}: hosts.interfaces.{conn.name} = {named!r}, but its routes to the "
                        f"other endpoints ({', '.join(peers)}) leave through {dev}",
                        f"give hosts.addresses on {named}'s network, or name {dev}")
    return dev


def interface_facts(conn: SshConnection, peers: list[str], named: str | None = None) -> InterfaceFacts:
    """Which interface link conditions go on, checked: the one the routes to the peers use (and the scenario
    named, if it did), the inventory opted it in, vnetbench can steer it (it has no clsact or ingress qdisc of
    someone else's). Raises HostError naming the fix."""
    host = conn.host
    name = route_interface(conn, peers, named)
    if name not in host.shape_interfaces:
        raise HostError(f"{conn.where()}: the other endpoints are reached through {name}, and {SHAPE_VAR} lets "
                        f"vnetbench change only {', '.join(host.shape_interfaces)}",
                        f"add {name} to {host.name}'s {SHAPE_VAR} in the inventory, or give addresses on the "
                        "opted-in interface in hosts.addresses")
    return read_interface(conn, name, "`vnetbench clean --hosts INVENTORY` removes it")


def read_interface(conn: Shell, name: str, clean_fix: str) -> InterfaceFacts:
    """The interface `name` as it is before the run (MTU, qdiscs), checked steerable: no clsact or ingress qdisc
    of someone else's is on it (`clean_fix` says how to remove one a killed run left). Raises HostError."""
    link = conn.run(with_sbin(["ip", "-j", "link", "show", "dev", name]))
    qdiscs = _qdiscs(conn, name)
    try:
        mtu = int(json.loads(link.stdout)[0]["mtu"])
    except (ValueError, LookupError, TypeError):
        raise HostError(f"{conn.where()}: `ip -j link show dev {name}` printed {link.stdout.strip()[:200]!r}",
                        "") from None
    taken = [q["kind"] for q in qdiscs if q.get("kind") in STEERING_QDISCS]
    if taken:
        raise HostError(f"{conn.where()}: {name} already has a {taken[0]} qdisc, which vnetbench does not share",
                        f"if a killed vnetbench run left it, {clean_fix}; "
                        f"otherwise use another interface (tc qdisc show dev {name} shows it)")
    return InterfaceFacts(name, mtu, qdiscs)


def _qdiscs(conn: Shell, dev: str) -> list[dict[str, Any]]:
    done = conn.run(with_sbin(["tc", "-s", "-j", "qdisc", "show", "dev", dev]), root=True)
    if done.returncode != 0:
        raise HostError(f"{conn.where()}: `tc qdisc show dev {dev}` failed: {done.stderr.strip()[:300]}", "")
    return netem.parse_show(done.stdout)


def _shape(q: dict[str, Any]) -> tuple:
    """A qdisc without its counters: what must be the same before and after a run."""
    return (q.get("kind"), q.get("handle"), q.get("parent"), bool(q.get("root")))


@dataclass
class HostLink:
    """One link of the scenario on a host: the interface, the peers whose traffic is steered, and the IFBs
    made for it. Steering is made once per side, when a configuration first needs it, and kept for the run."""

    name: str  # "bottleneck" or "sN"
    conn: Shell
    interface: InterfaceFacts
    peers: list[str]
    ip_version: int
    run_prefix: str
    registry: Registry
    host_upstream: bool  # a sender's link: forward leaves this host
    steered: set[str] = field(default_factory=set)
    _made: list[str] = field(default_factory=list)  # IFBs, in the order they were (about to be) made
    _clsact: bool = False  # the clsact qdisc on the interface is this run's
    _registered: bool = False

    @property
    def host(self) -> str:
        return self.conn.name

    def ifb(self, direction: str) -> str:
        return ifb_name(self.run_prefix, side_of(direction, self.host_upstream))

    def run(self, argv: list[str], check: bool = True) -> Any:
        done = self.conn.run(with_sbin(argv), root=True)
        if check and done.returncode != 0:
            raise LabError(f"{self.conn.where()}: `{shlex.join(argv)}` failed: "
                           f"{(done.stderr or done.stdout).strip()[:300] or f'exit status {done.returncode}'}")
        return done

    def steer(self, direction: str) -> str:
        """The IFB that carries `direction`, with the endpoints' traffic on that side sent through it."""
        side = side_of(direction, self.host_upstream)
        ifb = ifb_name(self.run_prefix, side)
        if side in self.steered:
            return ifb
        dev = self.interface.name
        if not self._registered:
            # One undo for everything made here, registered before the first of it is made: it removes the
            # clsact qdisc only once it was made by this run (one of someone else's was refused up front).
            self.registry.add(f"link conditions on {dev} of {self.host}", self._restore)
            self._registered = True
        self._made.append(ifb)
        self.run(["ip", "link", "add", "name", ifb, "mtu", str(self.interface.mtu), "type", "ifb"])
        self.run(["ip", "link", "set", "dev", ifb, "up"])
        if not self._clsact:
            self.run(["tc", "qdisc", "add", "dev", dev, "clsact"])
            self._clsact = True
        proto, match = ("ipv6", "ip6") if self.ip_version == 6 else ("ip", "ip")
        field_ = "src" if side == "ingress" else "dst"
        bits = 128 if self.ip_version == 6 else 32
        for peer in self.peers:
            self.run(["tc", "filter", "add", "dev", dev, side, "protocol", proto, "prio", "1", "u32",
                      "match", match, field_, f"{peer}/{bits}", "action", "mirred", "egress", "redirect",
                      "dev", ifb])
        self.steered.add(side)
        return ifb

    def reset(self) -> None:
        """Whatever of this run's steering is on the host now removed (a host that restarted has none), to be
        made again by the next `steer`; the teardown registered already stays."""
        dev = self.interface.name
        if self._clsact:
            self.run(["tc", "qdisc", "del", "dev", dev, "clsact"], check=False)
            self._clsact = False
        for ifb in self._made:
            self.run(["ip", "link", "del", "dev", ifb], check=False)
        self._made.clear()
        self.steered.clear()

    def _restore(self) -> None:
        """The interface as it was: the clsact qdisc (its filters with it) first, so that nothing is sent to
        an IFB that is gone, then the IFBs, each checked gone; the interface's qdiscs are compared with what
        they were. Every step is tried whatever the others did; what failed is raised at the end."""
        dev = self.interface.name
        problems = []
        if self._clsact:
            try:
                self.run(["tc", "qdisc", "del", "dev", dev, "clsact"])
                self._clsact = False
            except (LabError, HostError) as e:
                problems.append(str(e))
        for ifb in reversed(self._made):
            problem = self._remove_ifb(ifb)
            if problem:
                problems.append(problem)
        self._made.clear()
        self.steered.clear()
        now = sorted(map(str, (_shape(q) for q in _qdiscs(self.conn, dev))))
        before = sorted(map(str, (_shape(q) for q in self.interface.qdiscs)))
        if now != before:
            problems.append(f"{dev}'s qdiscs differ from before the run: before {before}, now {now}")
        if problems:
            raise HostError(f"{self.conn.where()}: " + "; ".join(problems),
                            "`vnetbench clean --hosts INVENTORY` removes what is left")

    def _remove_ifb(self, ifb: str) -> str | None:
        """Delete the IFB and check that it is gone (one never made is gone already); the problem, or None."""
        said = ""
        for _ in range(3):
            done = self.run(["ip", "link", "del", "dev", ifb], check=False)
            still = self.run(["ip", "link", "show", "dev", ifb], check=False)
            if still.returncode != 0:
                return None
            said = (done.stderr or done.stdout).strip()[:200] or f"exit status {done.returncode}"
            time.sleep(0.2)
        return f"{ifb} is still there after `ip link del` ({said})"

    def show(self, dev: str) -> list[dict[str, Any]]:
        return [dict(q, host=self.host, dev=dev) for q in _qdiscs(self.conn, dev)]


class HostLinkBackend(Backend):
    """A link's conditions on a host, with the host's kernel qdiscs on the run's IFBs (module docstring).
    `name` is tbf, htb or netem (the rate qdisc under netem is `rate_qdisc`)."""

    def __init__(self, link: HostLink | None, backend: str, rate_qdisc: str = "tbf"):
        super().__init__(link, link.interface.mtu if link else 1500,
                         backend if backend in ("tbf", "htb") else rate_qdisc)
        self.name = backend
        self._seed_ok: bool | None = None
        self._conditioned: list[str] = []  # directions with conditions now
        self._before: dict[str, dict[str, float]] = {}

    def _seed(self, spec: LinkSpec) -> int | None:
        if self._seed_ok is None:
            self._seed_ok = netem.tc_supports_seed(self.link.run(["tc", "-V"], check=False).stdout)
        return spec.seed if self._seed_ok else None

    def apply(self, spec: LinkSpec) -> dict:
        out: dict[str, Any] = {"backend": self.name, "directions": {}}
        if self.link is None:  # a host without conditions in any configuration: nothing is touched
            out["directions"] = {d: {"plain": True} for d in ("forward", "reverse")}
            return out
        self._conditioned = []
        for d in ("forward", "reverse"):
            cond = spec.direction(d)
            if cond.is_plain():
                if side_of(d, self.link.host_upstream) in self.link.steered:
                    self.link.run(["tc", "qdisc", "del", "dev", self.link.ifb(d), "root"], check=False)
                out["directions"][d] = {"plain": True}
                continue
            ifb = self.link.steer(d)
            self.link.run(["tc", "qdisc", "del", "dev", ifb, "root"], check=False)
            if self.name == "netem":
                cmds = netem.commands("", ifb, cond, self.rate_qdisc, self.mtu, self._seed(spec))
            else:
                cmds = netem.rate_qdisc_commands("", ifb, cond, self.name, self.mtu)
            for argv in cmds:
                self.link.run(argv)
            self._conditioned.append(d)
            out["directions"][d] = {"host": self.link.host, "interface": self.link.interface.name,
                                    "side": side_of(d, self.link.host_upstream), "ifb": ifb,
                                    "commands": [shlex.join(c[1:]) for c in cmds], "qdiscs": self.link.show(ifb)}
        if self.name == "netem" and self._seed_ok is False:
            out["note"] = "the host's tc has no netem seed option (iproute2 < 6.5): loss patterns are not reproducible"
        return out

    def check(self, spec: LinkSpec) -> list[str]:
        """The IFB of each conditioned direction holds the layout apply() made (netem, or the rate qdisc alone), and
        the IFB of a plain one nothing, as the host's kernel reports them."""
        if self.link is None:
            return []
        out = []
        for d in ("forward", "reverse"):
            cond = spec.direction(d)
            if cond.is_plain() and side_of(d, self.link.host_upstream) not in self.link.steered:
                continue  # never steered: nothing of the run's on this side
            ifb = self.link.ifb(d)
            shown = self.link.show(ifb)
            if self.name == "netem":
                problem = netem.layout_problem(shown, cond, self.rate_qdisc)
            else:
                roots = [q.get("kind") for q in installed_roots(shown)]
                problem = (None if roots == ([] if cond.is_plain() else [self.name])
                           else f"the host's kernel has {', '.join(map(str, roots)) or 'none'} at the root")
            if problem:
                out.append(f"{d} on {self.link.host}/{ifb}: {problem}")
        return out

    def qdiscs(self) -> list[dict]:
        if self.link is None:
            return []
        return [q for d in self._conditioned for q in self.link.show(self.link.ifb(d))]

    def _counters(self) -> dict[str, dict[str, float]]:
        out = {}
        for d in self._conditioned:
            root = next((q for q in _qdiscs(self.link.conn, self.link.ifb(d)) if q.get("root")), {})
            out[d] = {"packets": float(root.get("packets", 0)), "drops": float(root.get("drops", 0))}
        return out

    def start_trial(self, spec: LinkSpec, seconds: float) -> None:
        self._before = self._counters() if self.link is not None else {}

    def end_trial(self) -> TrialCounters:
        if not self._before:
            return TrialCounters()
        after = self._counters()
        out = TrialCounters()
        for d, before in self._before.items():
            drops = after[d]["drops"] - before["drops"]
            packets = after[d]["packets"] - before["packets"]
            # netem counts its loss model's drops with the queue's, as the lab's netem backend says.
            key = "drops" if self.name == "netem" else "dropped_queue"
            out.per_direction[d] = {key: drops, "packets": packets}
        return out

    def clear(self) -> None:
        if self.link is None:
            return
        for d in self._conditioned:
            self.link.run(["tc", "qdisc", "del", "dev", self.link.ifb(d), "root"], check=False)
        self._conditioned = []


# ------------------------------------------------------------------------------------------------ offloads

#: In the run's work directory on a host, + ".net<network namespace inode>": the `ethtool -K` arguments that put
#: its interface's offloads back as they were before the run changed them, one line "DEV ARG ...", written
#: before the first change; teardown applies them, and `clean --hosts` does after a killed run (hosts/clean.py).
OFFLOAD_RESTORE = "offload-restore"


class HostOffload:
    """The offloads (TSO, GSO, GRO, checksums) of a host's data interface, for `offload = "off"` where the
    inventory opts it in: "on" is what the host had before the run (as in the lab, each device's own), "off"
    turns them off; the host's own settings are back at the end, at teardown or by `clean --hosts`."""

    def __init__(self, conn: SshConnection, interface: str, workdir: str, registry: Registry):
        self.conn, self.interface, self.workdir, self.registry = conn, interface, workdir, registry
        self.defaults: dict[str, bool] | None = None

    def _ethtool(self, args: list[str]) -> Any:
        done = self.conn.run(with_sbin(["ethtool", *args]), root=True)
        if done.returncode != 0 and "-k" not in args:
            raise LabError(f"{self.conn.where()}: `ethtool {shlex.join(args)}` failed: "
                           f"{(done.stderr or done.stdout).strip()[:300]}")
        return done

    def read(self) -> dict[str, Any]:
        features = offload.parse_features(self._ethtool(["--json", "-k", self.interface]).stdout)
        if not features:  # an ethtool before --json
            features = offload.parse_features(self._ethtool(["-k", self.interface]).stdout)
        return {"host": self.conn.host.name, "dev": self.interface, **features}

    def set(self, on: bool) -> dict[str, Any]:
        if self.defaults is None:
            now = self.read()
            self.defaults = {f: bool(now[f]) for f in offload.FEATURES if f in now}
            restore = f"{self.interface} {' '.join(offload.ethtool_args(self.defaults))}"
            # Kept on the host before anything changes, for `clean --hosts` after a kill; undone here too.
            # Named after the host's network stack: hosts that share a /tmp (namespaces, containers of one
            # machine) each find their own.
            kept = self.conn.run(["sh", "-c", 'printf "%s\\n" "$3" >> "$1/$2.net$(readlink /proc/self/ns/net | '
                                  'tr -cd 0-9)"', "sh", self.workdir, OFFLOAD_RESTORE, restore])
            if kept.returncode != 0:
                raise LabError(f"{self.conn.where()}: cannot keep the offloads to restore in {self.workdir}: "
                               f"{kept.stderr.strip()[:300]}")
            self.registry.add(f"offloads of {self.interface} on {self.conn.host.name}", self.restore)
        wanted = dict(self.defaults) if on else {f: False for f in self.defaults}
        self._ethtool(["-K", self.interface, *offload.ethtool_args(wanted)])
        return self.read()

    def restore(self) -> None:
        if self.defaults is not None:
            self._ethtool(["-K", self.interface, *offload.ethtool_args(self.defaults)])
