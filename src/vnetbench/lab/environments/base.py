"""What every environment shares: the lab it attaches to, addresses, and the
namespaces the lab wired for its endpoints (the one way an endpoint joins the
lab's network: lab/graph_lab.py makes every link, a dumbbell's too).

Address plan (benchmarking ranges only, RFC 2544 / RFC 5180)::

    underlay (nodes on the switch)  198.18.0.0/16        2001:2::/64
    subnet k (k = 1..255): a container bridge, an overlay segment or a node's
    routed container block          198.19.k.0/24        2001:2:0:1kk::/64
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from vnetbench.errors import LabError
from vnetbench.lab import offload
from vnetbench.lab.nodes import Interface, Namespace, NamespaceNode
from vnetbench.lab.teardown import Registry

UNDERLAY_V4_PREFIXLEN = 16
UNDERLAY_V6_PREFIXLEN = 64
SUBNET_V4_PREFIXLEN = 24
SUBNET_V6_PREFIXLEN = 64


def underlay_addresses(n: int) -> tuple[str, str]:
    """The n-th node's underlay addresses (n >= 1): 198.18.0.2, ..., 198.18.1.1, ...; 2001:2::1, ..."""
    if not 1 <= n <= 63_749:
        raise LabError(f"host number {n} is outside the benchmarking range plan (1..63749)")
    return f"198.18.{n // 250}.{n % 250 + 1}", f"2001:2::{n:x}"


@dataclass(frozen=True)
class Subnet:
    """A /24 in 198.19.0.0/16 and its /64 in 2001:2:0:100::/56 (k = 1..255)."""

    index: int

    def v4(self, host: int) -> str:
        return f"198.19.{self.index}.{host}"

    def v6(self, host: int) -> str:
        return f"2001:2:0:{0x100 + self.index:x}::{host:x}"

    @property
    def cidr4(self) -> str:
        return f"198.19.{self.index}.0/{SUBNET_V4_PREFIXLEN}"

    @property
    def cidr6(self) -> str:
        return f"2001:2:0:{0x100 + self.index:x}::/{SUBNET_V6_PREFIXLEN}"


@dataclass
class LabContext:
    """The lab under construction, as an environment sees it."""

    run_prefix: str
    registry: Registry
    workdir: Path | None = None
    # The namespaces the lab wired before the environment came, by endpoint: each joined to its links with the
    # graph's addresses (a dumbbell's endpoint on the switch, a declared topology's host on its links), as the
    # lab's graph builder made them (lab/graph_lab.py). An environment's endpoint sits in or behind its own.
    wired: dict[str, "WiredNamespace"] = field(default_factory=dict)
    # Whether an engine's endpoints may sit on a network of the engine's own, beside the lab's (a dumbbell's
    # containers on Docker's bridge, which stands in for the switch); a declared topology's hosts are all on the
    # graph's links.
    engine_networks: bool = True
    # The lab's IP forwarders between the endpoints' namespaces (a declared topology's routers): a routed overlay
    # gives them routes to its container blocks, as Calico's BGP tells the fabric's routers.
    routers: list[Namespace] = field(default_factory=list)
    _subnets: int = 0

    def ns_name(self, node: str) -> str:
        return f"{self.run_prefix}-{node}"

    def new_subnet(self) -> Subnet:
        self._subnets += 1
        if self._subnets > 255:
            raise LabError("more than 255 container/overlay subnets requested: 198.19.0.0/16 is full")
        return Subnet(self._subnets)


# ------------------------------------------------------------ the registry

@dataclass(frozen=True)
class Capability:
    """One thing an environment needs from this machine, and whether it has it."""

    name: str  # "container", "overlay (vxlan)", "vm (e1000)", ...
    ok: bool
    detail: str
    fix: str = ""


class EnvironmentOptions(BaseModel):
    """The lab fields an environment owns (none: bare). Each is optional: None is "this environment's default",
    and the environment says which that is."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class EnvironmentType:
    """What an environment module declares about itself (its class inherits this and is registered):

    - ``kind``: the value of the scenario's ``env``;
    - ``tag``: the letter its endpoints' names start with when a run has several environments;
    - ``Options``: the lab fields that belong to it, as a model of their own (type, default, description and
      checks, written once: the scenario's ``[lab]`` table and :class:`~vnetbench.lab.environments.Variant` take
      them from here). They are rejected with an ``env`` that does not declare them; two environments may declare
      the same one when it means the same in both, as a container's limits (one inherits the other's model).
      ``options`` is their names, set by :func:`register`;
    - ``probes_kernel``: its checks need :func:`vnetbench.lab.environments.probe_kernel`;
    - ``setup_s``: about how long building its endpoints takes (``vnetbench plan``'s estimate);
    - :meth:`capabilities`: what it needs from this machine, for one variant or (None) all of them;
    - :meth:`tool_problems`: which of the workloads' tools it cannot run;
    - :meth:`counters`: what its endpoints count of a trial's traffic beyond their interfaces (an overlay's
      tunnel devices), read before and after every trial.
    """

    kind: ClassVar[str] = ""
    tag: ClassVar[str] = ""
    Options: ClassVar[type[EnvironmentOptions]] = EnvironmentOptions
    options: ClassVar[tuple[str, ...]] = ()  # Options' field names (register sets it)
    probes_kernel: ClassVar[bool] = False
    setup_s: ClassVar[float] = 1.0

    @classmethod
    def capabilities(cls, variant: Any | None, kernel: dict[str, str | None] | None) -> list[Capability]:
        return [Capability(cls.kind, True, "")]

    @classmethod
    def tool_problems(cls, variant: Any, tools: list[tuple[str, str]]) -> list[str]:
        """Why these (command, Debian package) cannot run in this environment; an environment that
        runs the host's own binaries (namespaces) has none beyond the host's own preflight."""
        return []

    @classmethod
    def memory_problem(cls, variant: Any, needed: int) -> str | None:
        """Why a tool that allocates `needed` bytes cannot run in this variant (a guest too small, a
        container limit too low), with what to change; None when it fits."""
        return None

    def counters(self) -> Any:
        """What this environment counts of the traffic, read before and after each trial and stored with its
        raw output (runner/recorders.EnvironmentRecorder); None where it counts nothing of its own."""
        return None

    def guests(self) -> list[Any]:
        """The endpoints that are machines of their own (a QEMU guest's kernel has CPUs of its own): each trial
        samples their CPUs from inside too (runner/recorders.GuestsCpuRecorder). None here."""
        return []

    def on_lab_network(self) -> bool:
        """Whether this environment's endpoints join the lab's own network (wired by the lab before
        :meth:`attach`, found in LabContext.wired), or bring a network of their own that the lab does not
        make (an engine's bridge network, whose bridge and veths the engine makes)."""
        return True

    def host_namespace(self, endpoint: "Endpoint") -> str | None:
        """The namespace an endpoint on the lab's network is to have, made by this environment before the lab
        is wired, by name: the lab then wires the endpoint's links into it (an engine's container, whose
        namespace only the engine can make). None: the lab makes it, and :meth:`attach` finds it in
        LabContext.wired (bare, container, overlay and vm sit in or behind a namespace of the lab's own)."""
        return None

    def cpu_parts(self) -> dict[str, list[Any]]:
        """What of this machine carries the environment's endpoints, by what it is: processes (pids: a guest's
        QEMU, {"qemu": [pids]}) or cgroups (lab/cgroups.CpuAccount: an engine's containers). Their CPU over
        each trial is the environment's own cost (``cpu.<what>_pct``, runner/recorders.CpuRecorder). None here:
        namespaces run the workloads' own processes, which each trial meters as it starts them."""
        return {}

    def cpu_part_of(self, endpoint: str) -> str | None:
        """The part of :meth:`cpu_parts` whose CPU time holds what runs on `endpoint` (a guest's QEMU, a
        container's cgroup): an instrument's own CPU there is taken out of that part, as it is out of the
        machine's busy time. None: no part holds it."""
        return None


REGISTRY: dict[str, type[EnvironmentType]] = {}


def register(cls: type[EnvironmentType]) -> type[EnvironmentType]:
    """Class decorator: make an environment known under its ``kind``."""
    if not cls.kind or not cls.tag:
        raise TypeError(f"{cls.__name__} must set kind and tag")
    if REGISTRY.get(cls.kind, cls) is not cls:
        raise TypeError(f"two environments are registered as {cls.kind!r}")
    cls.options = tuple(cls.Options.model_fields)
    REGISTRY[cls.kind] = cls
    return cls


@dataclass(frozen=True)
class Endpoint:
    """One endpoint the topology asks an environment for."""

    name: str  # endpoint name in the lab: "r", "s1", or with a variant tag "c-r"
    number: int  # its node's underlay address number
    cpu: int | None  # CPU to pin its workloads to (None: not pinned)
    mtu: int  # underlay MTU
    receiver: bool = False  # the workloads' servers run here


@dataclass
class WiredNamespace:
    """A namespace joined to the lab's links: a bare endpoint's own, or the one a container or guest sits behind."""

    ns: Namespace
    iface: Interface  # its end of the link to the switch ("eth0"; a topology's host: its first link's end)
    port: Interface | None  # the switch's end, named after the endpoint (None: a topology's, not one port)
    ipv4: str
    ipv6: str
    prefixlens: tuple[int, int] = (UNDERLAY_V4_PREFIXLEN, UNDERLAY_V6_PREFIXLEN)  # of ipv4 and ipv6 on iface
    # Its routes beyond its own segment (destination, gateway): a topology's host behind a router; a guest that
    # takes over the namespace's addresses takes these too.
    routes: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class Attached:
    """An endpoint, ready: the node its workloads run on, and the link impairments attach to."""

    node: Any  # what runs its commands: a NamespaceNode, or another RunsCommands (a container, a guest)
    port: Interface  # switch side: its egress carries traffic toward the endpoint
    uplink: Interface  # endpoint side of the same link: its egress carries the endpoint's traffic out
    offload_ifaces: list[Interface] = field(default_factory=list)  # host-side interfaces on the path


class NamespaceEnvironment(EnvironmentType):
    """What the environments built of namespaces share (bare, container, overlay): the endpoints they
    attached, and offloads switched on the host-side interfaces of those endpoints' paths."""

    def __init__(self, ctx: LabContext, variant: Any):
        self.ctx = ctx
        self.variant = variant
        self.attached: list[Attached] = []
        self._offload: offload.OffloadControl | None = None

    def finish(self) -> None:
        """Called once every endpoint is attached; environments that join their wired namespaces override it."""

    def set_offload(self, on: bool) -> list[dict[str, Any]]:
        if self._offload is None:
            self._offload = offload.OffloadControl([i for a in self.attached for i in a.offload_ifaces])
        return self._offload.set(on)


def wired_namespace(ctx: LabContext, name: str) -> WiredNamespace:
    """The namespace the lab wired for endpoint `name`: on its links, with its addresses and routes. An
    impairment on its link (the emulator) is spliced in later, between the two ends (vnetbench.lab.splice):
    this stays the endpoint's view of it."""
    wired = ctx.wired.get(name)
    if wired is None:
        raise LabError(f"endpoint {name!r}: the lab wired no namespace for it (wired: "
                       f"{', '.join(sorted(ctx.wired)) or 'none'})")
    return wired


def new_namespace(ctx: LabContext, name: str) -> Namespace:
    """A namespace of this lab whose IPv6 addresses are usable at once: no duplicate address
    detection, also for link-local ones (neighbour discovery waits for them otherwise)."""
    ns = Namespace.create(ctx.ns_name(name), ctx.registry)
    for scope in ("all", "default"):
        ns.sysctl(f"net.ipv6.conf.{scope}.accept_dad", "0")
    return ns


def add_default_routes(ns: Namespace, iface: Interface, gw4: str, gw6: str) -> None:
    ns.ipr.route("add", dst="0.0.0.0/0", gateway=gw4, oif=iface.index)
    ns.ipr.route("add", dst="::/0", gateway=gw6, oif=iface.index, family=10)


def add_route(ns: Namespace, cidr: str, via: str) -> None:
    net = ipaddress.ip_network(cidr)
    ns.ipr.route("add", dst=str(net), gateway=via, family=10 if net.version == 6 else 2)


def enable_forwarding(ns: Namespace) -> None:
    ns.sysctl("net.ipv4.ip_forward", "1")
    ns.sysctl("net.ipv6.conf.all.forwarding", "1")


def namespace_node(endpoint: Endpoint, ns: Namespace, registry: Registry, iface: Interface, ipv4: str, ipv6: str,
                   **kwargs: Any) -> NamespaceNode:
    return NamespaceNode(name=endpoint.name, ns=ns, registry=registry, ipv4=ipv4, ipv6=ipv6, cpu=endpoint.cpu,
                         iface=iface, **kwargs)
