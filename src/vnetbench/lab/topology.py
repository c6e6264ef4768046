"""The dumbbell lab: the ``dumbbell`` template's graph made by the graph builder, with each run's
environments attached to it.

Names: every namespace is ``vnb-<run id>-<node>`` so `vnetbench clean` can find
what a killed run left, and touch nothing else. Addresses come from the
benchmarking ranges only: 198.18.0.0/15 (RFC 2544) and 2001:2::/48 (RFC 5180);
the plan is in :mod:`vnetbench.lab.environments.base`.
"""

from __future__ import annotations

import ipaddress
import os
import time
from dataclasses import dataclass, field, replace
from typing import Any

from vnetbench.errors import EnvironmentUnavailable, LabError
from vnetbench.impair.backend import LabLink
from vnetbench.lab import environments
from vnetbench.lab.environments import Variant
from vnetbench.lab.environments.base import (UNDERLAY_V4_PREFIXLEN, UNDERLAY_V6_PREFIXLEN, Endpoint, LabContext,
                                             WiredNamespace, underlay_addresses)
from vnetbench.lab import idle, netns
from vnetbench.lab.graph_lab import build_graph
from vnetbench.lab.idle import WakeLatency
from vnetbench.lab.nodes import Interface, NamespaceNode, Namespace
from vnetbench.lab.teardown import Registry
from vnetbench.topology import templates
from vnetbench.topology.graph import Graph, Plan

IPV4_PREFIXLEN = UNDERLAY_V4_PREFIXLEN
IPV6_PREFIXLEN = UNDERLAY_V6_PREFIXLEN
host_addresses = underlay_addresses



@dataclass
class Group:
    """One variant's endpoints: a receiver and its senders, all in the same environment."""

    variant: Variant
    tag: str  # name prefix of its endpoints ("" when the lab has one variant)
    env: Any  # the Environment that built them
    receiver: str
    senders: list[str]
    offload: bool | None = None  # as last applied (None: as the kernel made it)
    unavailable: EnvironmentUnavailable | None = None  # did not come up: its trials fail with this
    named_roles: bool = False  # the scenario names its endpoints itself (a declared topology's hosts)

    def roles(self, senders: int | None = None) -> dict[str, str]:
        """The scenario's endpoint names (r, s1, s2, ...; a declared topology's own host names) to this
        variant's host names; the first `senders` senders only when given (a configuration's active ones)."""
        active = self.senders if senders is None else self.senders[:senders]
        if self.named_roles:
            return {name: name for name in (self.receiver, *active)}
        return {"r": self.receiver, **{f"s{i}": name for i, name in enumerate(active, 1)}}


@dataclass
class Lab:
    """A built testbed: its endpoints by name plus the interfaces impairments attach to."""

    run_prefix: str
    registry: Registry
    endpoints: dict[str, NamespaceNode] = field(default_factory=dict)
    switch: Namespace | None = None
    ports: dict[str, Any] = field(default_factory=dict)  # host name -> switch-side Interface
    uplinks: dict[str, Any] = field(default_factory=dict)  # host name -> endpoint-side end of the same link
    groups: dict[Variant, Group] = field(default_factory=dict)
    # The hold on the CPUs' wake-up latency while the lab is up (vnetbench.lab.idle); where there is none, why
    wake: WakeLatency | None = None
    cpu_wake_latency: str = "not held: the endpoints are not this machine's (real hosts)"
    bringup_s: dict[Variant, float] = field(default_factory=dict)  # wall time to attach + join each variant
    # (guests boot in parallel: a later variant's join may find them already up)

    def teardown(self) -> list[str]:
        return self.registry.teardown()

    def ns_name(self, node: str) -> str:
        return f"{self.run_prefix}-{node}"

    # The lab's links as the link manager sees them (impair/links.py). A link of the run is found by its key: in
    # a dumbbell, the host at its end (each variant has a "bottleneck" of its own, on its receiver's port).

    def path_links(self, receiver: str, senders: list[str]) -> dict[str, str]:
        """The links on the paths from `senders` to `receiver`: key -> link name."""
        return {receiver: "bottleneck", **{host: f"s{i}" for i, host in enumerate(senders, start=1)}}

    def route(self, sender: str, receiver: str) -> list[tuple[str, bool]]:
        """The keys of the links a packet from `sender` to `receiver` crosses, each with whether it crosses it
        forward (from its a end): the receiver's, then the sender's; both forward, the stream's way."""
        return [(receiver, True), (sender, True)]

    def link(self, name: str, key: str) -> LabLink:
        """Link `name` at key `key`: its two ends and which way is forward."""
        host_end = self.uplinks.get(key) or (self.endpoints[key].iface if key in self.endpoints else None)
        if key not in self.ports or host_end is None:
            raise LabError(f"the lab has no link {name!r} on endpoint {key!r} "
                           f"(endpoints: {', '.join(sorted(self.ports))})")
        return LabLink(name=name, switch_end=self.ports[key], host_end=host_end, host_upstream=(name != "bottleneck"))

    def emulator_namespace(self, key: str) -> str:
        """The name of the namespace an emulator on the link at `key` runs in."""
        return f"{self.run_prefix}-e{key}"[:60]

    def group(self, variant: Variant) -> Group:
        try:
            return self.groups[variant]
        except KeyError:
            built = ", ".join(str(v) for v in self.groups) or "none"
            raise LabError(f"the lab has no endpoints for environment {variant} (built: {built})") from None


def _cpu_plan(n_senders: int) -> tuple[int, list[int]]:
    """Receiver on the last CPU, senders spread over the others (all CPUs on a 1-CPU box)."""
    cpus = sorted(os.sched_getaffinity(0))
    receiver = cpus[-1]
    others = cpus[:-1] or cpus
    return receiver, [others[i % len(others)] for i in range(n_senders)]


def variant_tags(variants: list[Variant]) -> dict[Variant, str]:
    """Short, readable host-name prefixes: none for a single variant, else b, c, o1, o2, v1, ..."""
    if len(variants) == 1:
        return {variants[0]: ""}
    counts: dict[str, int] = {}
    for v in variants:
        counts[v.env] = counts.get(v.env, 0) + 1
    seen: dict[str, int] = {}
    tags = {}
    for v in variants:
        base = environments.kind(v.env).tag
        seen[v.env] = seen.get(v.env, 0) + 1
        tags[v] = f"{base}{seen[v.env]}-" if counts[v.env] > 1 else f"{base}-"
    return tags


def build_dumbbell(run_prefix: str, senders: int, mtu: int = 1500, pin_cpus: bool = True,
                   registry: Registry | None = None,
                   variants: list[tuple[Variant, int]] | None = None, idle_cores: str = "pm-qos") -> Lab:
    """Senders behind a switch whose port toward the receiver is the bottleneck.

    ::

        s1 ──┐
        s2 ──┤                         bottleneck
        ...  ├── [ switch: bridge br0 ] ──────────── r
        sN ──┘      (port "r" egress: tbf/htb = rate + buffer)

    Endpoints: ``r`` (receiver) and ``s1..sN``; each attaches through its
    environment (bare: ``eth0`` straight to the switch). With several
    ``variants`` (environment, senders), each gets its own receiver and
    senders on the same switch, named with a tag, so trials of any variant
    run without rebuilding::

        b-s1 ──┐                        ┌── b-r    bare
        c-s1 ──┤                        ├── c-r    container: wired ns (NAT) + container ns
        o1-s1 ─┼── [ switch: br0 ] ─────┼── o1-r   overlay vxlan: wired ns + container ns
        o2-s1 ─┤                        ├── o2-r   overlay routed
        v1-s1 ─┘                        └── v1-r   vm: wired ns (tap, bridge) + QEMU guest

    Each receiver's switch port is its variant's bottleneck. The switch and every link to it are the
    ``dumbbell`` template's graph (topology/templates.py), made by the graph builder as any declared topology
    is (lab/graph_lab.py), with the underlay addresses every dumbbell has had (198.18.0.x/16, 2001:2::x/64,
    lab/environments/base.py). An engine's endpoints on a network of the engine's own (Docker's bridge) are
    not on the switch: the engine wires them.
    """
    registry = registry or Registry()
    variants = variants or [(Variant(env="bare", mtu=mtu), senders)]
    lab = Lab(run_prefix, registry)
    lab.wake = idle.held(registry, run_prefix, idle_cores)
    try:
        ctx = LabContext(run_prefix=run_prefix, registry=registry)
        tags = variant_tags([v for v, _ in variants])
        planned: list[tuple[Variant, Any, list[Endpoint]]] = []
        number = 0
        for variant, n_senders in variants:
            t0 = time.perf_counter()
            env = environments.create(variant, ctx)
            rx_cpu, tx_cpus = _cpu_plan(n_senders)
            tag = tags[variant]
            names = [f"{tag}r"] + [f"{tag}s{i}" for i in range(1, n_senders + 1)]
            if max(len(n) for n in names) > 15:
                raise LabError(f"host name {max(names, key=len)!r} is longer than an interface name may be")
            endpoints = []
            for name, cpu in zip(names, [rx_cpu] + tx_cpus):
                number += 1
                endpoints.append(Endpoint(name=name, number=number, cpu=cpu if pin_cpus else None,
                                          mtu=variant.mtu, receiver=name == names[0]))
            planned.append((variant, env, endpoints))
            lab.bringup_s[variant] = time.perf_counter() - t0
        _wire(lab, ctx, [(variant, env, endpoints, tags[variant]) for variant, env, endpoints in planned])
        # Every variant's endpoints first, then each joins (and guests finish booting): guests of
        # several variants boot at the same time instead of one after the other.
        for variant, env, endpoints in planned:
            t0 = time.perf_counter()
            for endpoint in endpoints:
                att = env.attach(endpoint)
                lab.endpoints[endpoint.name] = att.node
                lab.ports[endpoint.name] = att.port
                lab.uplinks[endpoint.name] = att.uplink
            lab.groups[variant] = Group(variant, tags[variant], env, endpoints[0].name,
                                        [e.name for e in endpoints[1:]])
            lab.bringup_s[variant] += time.perf_counter() - t0
        for variant, group in lab.groups.items():
            t0 = time.perf_counter()
            try:
                group.env.finish()
            except EnvironmentUnavailable as e:
                group.unavailable = e  # the other variants still run; teardown removes this one too
            lab.bringup_s[variant] += time.perf_counter() - t0
    except BaseException:
        registry.teardown()
        raise
    return lab


def _wire(lab: Lab, ctx: LabContext, planned: list[tuple[Variant, Any, list[Endpoint], str]]) -> None:
    """The switch and the links of every endpoint on the lab's network, in one graph made at once; each
    endpoint's namespace is then in ``ctx.wired`` for its environment to attach (or to sit behind). The time
    it takes is shared among the variants by their endpoints."""
    on_switch = [(variant, env, endpoints, tag) for variant, env, endpoints, tag in planned if env.on_lab_network()]
    if not on_switch:
        return
    t0 = time.perf_counter()
    endpoints = {e.name: e for _, _, eps, _ in on_switch for e in eps}
    # Namespaces an environment makes itself (an engine's container with its host's network), by endpoint
    provided = {e.name: ns for _, env, eps, _ in on_switch for e in eps if (ns := env.host_namespace(e)) is not None}
    shape = templates.dumbbell(groups=[(tag, len(eps) - 1) for _, _, eps, tag in on_switch])
    host_end = {name: link.b if link.a == "sw" else link.a for name, link in shape.links.items()}
    graph = Graph(shape.nodes.values(), [replace(link, mtu=endpoints[host_end[link.name]].mtu)
                                         for link in shape.links.values()])
    plan = _underlay_plan(graph.check(), endpoints)
    built = build_graph(lab.run_prefix, graph, lab.registry, provided=provided, plan=plan)
    lab.switch = _namespace(lab.registry, built.namespaces["sw"])
    for name, endpoint in endpoints.items():
        ns = _namespace(lab.registry, built.namespaces[name])
        (iface,) = plan.interfaces[name]
        port = plan.ports[("sw", iface.link)]
        v4, v6 = plan.addresses[(name, iface.ifname)]
        ctx.wired[name] = WiredNamespace(ns=ns, iface=Interface(ns, iface.ifname), port=Interface(lab.switch, port),
                                         ipv4=v4, ipv6=v6, prefixlens=plan.prefixlens[(name, iface.ifname)])
    took = time.perf_counter() - t0
    for variant, _, eps, _ in on_switch:
        lab.bringup_s[variant] += took * len(eps) / len(endpoints)


def _underlay_plan(graph: Graph, endpoints: dict[str, Endpoint]) -> Plan:
    """The dumbbell's graph's plan with the underlay addresses of lab/environments/base.py (endpoint n at
    underlay_addresses(n), in 198.18.0.0/16 and 2001:2::/64) in place of the plan's own: the addresses every
    stored dumbbell run has, and the ones its environments' subnets (198.19.k.0/24) are planned beside."""
    plan = graph.plan()
    (segment,) = plan.segments
    segment.v4 = ipaddress.IPv4Network(f"198.18.0.0/{UNDERLAY_V4_PREFIXLEN}")
    segment.v6 = ipaddress.IPv6Network(f"2001:2::/{UNDERLAY_V6_PREFIXLEN}")
    for name, endpoint in endpoints.items():
        for iface in plan.interfaces[name]:
            plan.addresses[(name, iface.ifname)] = underlay_addresses(endpoint.number)
            plan.prefixlens[(name, iface.ifname)] = (UNDERLAY_V4_PREFIXLEN, UNDERLAY_V6_PREFIXLEN)
    return plan


def _namespace(registry: Registry, name: str) -> Namespace:
    """Namespace `name` with a netlink socket in it (closed at teardown)."""
    ipr = netns.open_iproute(name)
    registry.add(f"netlink socket of {name}", ipr.close)
    return Namespace(name, ipr)
