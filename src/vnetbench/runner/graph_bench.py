"""A run on a declared topology (the scenario's ``[topology]`` table): the graph built in namespaces
(:mod:`vnetbench.lab.graph_lab`), its clients and server as the trial's endpoints, its links under their
conditions.

Everything a trial does is the dumbbell bench's (:class:`vnetbench.runner.bench.DumbbellBench`): the servers,
the phases, the recorders, the path check. What differs is the lab underneath, and the lab says it through
the four questions the link manager asks any lab (:class:`GraphLabView`): which links lie on the trial's
paths, which links a packet crosses from one host to another and which way, what the two ends of a link are,
and where an emulator on a link runs.

::

    [topology] template = "linear", hops = 3          h1 ── l1 ── x1 ── l2 ── x2 ── l3 ── h2
    clients = ["h1"], server = "h2"                    (client)                       (server)
"""

from __future__ import annotations

import ipaddress
import shutil
import time
from dataclasses import dataclass, field
from typing import Any

from vnetbench.errors import LabError, ScenarioError
from vnetbench.impair.backend import LabLink
from vnetbench.impair.links import LinkManager
from vnetbench.lab import netns
from vnetbench.lab.environments import Variant
from vnetbench.lab import environments
from vnetbench.lab.environments.base import Attached, Endpoint, LabContext, NamespaceEnvironment, WiredNamespace
from vnetbench.lab.graph_lab import GraphLab, build_graph
from vnetbench.lab import idle
from vnetbench.lab.nodes import Interface, Namespace, NamespaceNode
from vnetbench.lab.teardown import Registry
from vnetbench.lab.topology import Group, Lab, _cpu_plan
from vnetbench.runner.bench import DumbbellBench, variant_of
from vnetbench.workloads.base import TrialEndpoints
from vnetbench.scenario.plan import Configuration
from vnetbench.topology.graph import Graph
from vnetbench.topology.spec import TopologySpec

Pair = tuple[tuple[str, ...], str]  # (clients, server)
# Where the container environment takes its endpoints' subnets from (lab.environments.base.Subnet)
CONTAINER_V4 = ipaddress.ip_network("198.19.0.0/16")
CONTAINER_V6 = ipaddress.ip_network("2001:2:0:100::/56")


@dataclass
class GraphLabView(Lab):
    """A built graph as the bench and the link manager see a lab: endpoints by node name, a group per (clients,
    server) pair, and each link found by its own name."""

    built: GraphLab | None = None
    _namespaces: dict[str, Namespace] = field(default_factory=dict)
    _routes: dict[tuple[str, str], list[tuple[str, bool]]] = field(default_factory=dict)

    def namespace(self, node: str) -> Namespace:
        """Node `node`'s namespace with a netlink socket in it, opened when first asked for (a 1,000-node lab
        needs a few of them, and each costs milliseconds)."""
        ns = self._namespaces.get(node)
        if ns is None:
            name = self.built.namespaces[node]  # type: ignore[union-attr]
            ipr = netns.open_iproute(name)
            self.registry.add(f"netlink socket of {name}", ipr.close)
            ns = self._namespaces[node] = Namespace(name, ipr)
        return ns

    def route(self, sender: str, receiver: str) -> list[tuple[str, bool]]:
        found = self._routes.get((sender, receiver))
        if found is None:
            found = self._routes[(sender, receiver)] = self.built.graph.path(self.built.plan, sender, receiver)  # type: ignore[union-attr]
        return found

    def path_links(self, receiver: str, senders: list[str]) -> dict[str, str]:
        """Every link a packet crosses between a sender and the receiver, either way: key = name."""
        out: dict[str, str] = {}
        for sender in senders:
            for name, _ in self.route(sender, receiver) + self.route(receiver, sender):
                out[name] = name
        return out

    def link(self, name: str, key: str) -> LabLink:
        """Link `name`'s two ends. An emulator moves the end called ``switch_end`` into its namespace: a
        switch's port when the link has one (nothing else is on it), else the b end (the splice carries its
        addresses and routes, lab/splice.py). ``forward`` is from the a end."""
        built = self.built
        assert built is not None
        link = built.graph.links.get(name)
        if link is None:
            raise ScenarioError(f"the topology has no link {name!r}")
        ends = {node: Interface(self.namespace(node), self._ifname(node, name)) for node in (link.a, link.b)}
        moved = link.a if built.graph.kind(link.a) == "switch" and built.graph.kind(link.b) != "switch" else link.b
        stays = link.b if moved == link.a else link.a
        return LabLink(name=name, switch_end=ends[moved], host_end=ends[stays], host_upstream=stays == link.a)

    def _ifname(self, node: str, link: str) -> str:
        built = self.built
        assert built is not None
        if built.graph.kind(node) == "switch":
            return built.plan.ports[(node, link)]
        return next(i.ifname for i in built.plan.interfaces[node] if i.link == link)

    def emulator_namespace(self, key: str) -> str:
        return f"{self.run_prefix}-e+{key}"[:60]  # no node's name holds a "+"


class GraphEndpoints(NamespaceEnvironment):
    """The topology's workload hosts, bare, as an environment: the graph's own namespaces, whose offloads are
    switched on every interface they have. (Another environment, a container, is made by its own module and
    takes the graph's namespaces as its wired namespaces: GraphBench._build.)"""

    kind = "bare"
    tag = "b"

    def __init__(self, variant: Variant, description: str):
        super().__init__(None, variant)  # type: ignore[arg-type]  # the graph is built already
        self.description = description

    def facts(self) -> dict[str, Any]:
        return {"env": "bare", "path": self.description}


class WorkloadPairs:
    """The trial's endpoints on a declared topology, in the lab (GraphBench) and on real hosts
    (runner/hosts_topology.HostsTopologyBench): every workload between its own (clients, server) pair, worked
    out per configuration by ``_pairs``, each client with a slot of its own in ``_slots``."""

    lab: Any
    links: Any
    _slots: dict[str, int]

    def _pairs(self, config: Configuration) -> tuple[Pair, dict[str, Pair]]:
        raise NotImplementedError

    def flows(self, config: Configuration) -> list[tuple[str, list[str]]]:
        """Each server the configuration's workloads run to, with their clients: one per distinct pair."""
        return [(server, list(clients)) for clients, server in dict.fromkeys(self._pairs(config)[1].values())]

    def workload_endpoints(self, config: Configuration, workload: str) -> TrialEndpoints:
        clients, server = self._pairs(config)[1][workload]
        return self._hosts(server, list(clients))

    def group_endpoints(self, group: Group) -> TrialEndpoints:
        return self._hosts(group.receiver, group.senders)

    def cores(self, group: Group, config: Configuration) -> dict[str, Any]:
        """Each host of the configuration's workloads (a node's name is its role) and each emulator: its core."""
        hosts = dict.fromkeys(h for server, clients in self.flows(config) for h in (server, *clients))
        return {"endpoints": {h: self.lab.endpoints[h].cpu for h in hosts},  # type: ignore[union-attr]
                "emulators": self.links.emulator_cores()}  # type: ignore[union-attr]

    def _hosts(self, server: str, clients: list[str]) -> TrialEndpoints:
        """Endpoints, each client with its slot: its place among every client of the run, so that a server
        keeps a port of its own for each client whatever pair it is in (an iperf3 server runs one test at a
        time)."""
        assert self.lab is not None
        return TrialEndpoints(self.lab.endpoints[server], [self.lab.endpoints[c] for c in clients],
                              slots=[self._slots[c] for c in clients])


@dataclass
class GraphBench(WorkloadPairs, DumbbellBench):
    """The dumbbell bench's trials on a declared topology's lab: one group of endpoints per (clients, server)
    the run's configurations name, all on the one graph."""

    topology: TopologySpec | None = None

    @classmethod
    def for_configs(cls, run_prefix: str, configs: list[Configuration],
                    pin_cpus: bool = True) -> "GraphBench | GraphsBench":
        """The bench of these configurations' graph; where they declare several (a matrix over the topology's
        template, its numbers, nodes or links), one bench per graph, side by side (GraphsBench)."""
        graphs: dict[str, list[Configuration]] = {}
        for c in configs:
            graphs.setdefault(graph_key(c), []).append(c)
        if len(graphs) > 1:
            # Each graph's namespaces and emulators under a prefix of its own: <run prefix>-g<k>+-<node> (no
            # node's name holds a "+", so no graph's name can be another's); `vnetbench clean` finds them by the
            # run's prefix.
            return GraphsBench({key: cls.for_configs(run_prefix if k == 0 else f"{run_prefix}-g{k}+", group,
                                                     pin_cpus)  # type: ignore[misc]
                                for k, (key, group) in enumerate(graphs.items())})
        first = configs[0]
        return cls(run_prefix, senders=max(c.active_senders for c in configs), mtu=first.scenario.lab.mtu,
                   pin_cpus=pin_cpus, variants=[(variant_of(first), first.active_senders)], configs=list(configs),
                   topology=first.scenario.topology)

    def setup(self) -> None:
        registry = Registry()
        registry.add(f"work directory {self.workdir}", lambda: shutil.rmtree(self.workdir, ignore_errors=True))
        try:
            self.lab = self._build(registry)
            self.links = LinkManager(self.lab, registry, self.workdir, self.run_prefix, mtu=self.mtu)
            if self.configs:
                self.links.plan(self.configs)
            self.start_servers()
        except BaseException:
            registry.teardown()
            raise

    def group(self, config: Configuration) -> Group:
        """The group of the configuration's topology endpoints (its clients and server)."""
        assert self.lab is not None
        return self.lab.groups[self._pairs(config)[0]]  # type: ignore[index]

    def _pairs(self, config: Configuration) -> tuple[Pair, dict[str, Pair]]:
        """The configuration's topology endpoints, and each active workload's (its own, else those): worked out
        once per configuration (a thousand-node graph is not built again per trial)."""
        found = self._pairs_of.get(config.key)
        if found is None:
            graph = self.lab.built.graph if self.lab is not None and self.lab.built is not None else \
                self.topology.graph(self.mtu)  # type: ignore[union-attr]
            found = self._pairs_of[config.key] = config_pairs(config, graph)
        return found

    # Every group's endpoints are hosts of the one graph, on the same devices: the offloads last set are every
    # group's.
    _offload_now: bool | None = None
    _slots: dict[str, int] = field(default_factory=dict)  # client endpoint -> its slot (TrialEndpoints.slots)
    _pairs_of: dict[str, tuple[Pair, dict[str, Pair]]] = field(default_factory=dict)  # config key -> _pairs()

    def _realise(self, config: Configuration) -> bool:
        group = self.group(config)
        group.offload = self._offload_now
        try:
            return super()._realise(config)
        finally:
            self._offload_now = group.offload

    def _group_offload_unknown(self, config: Configuration) -> None:
        super()._group_offload_unknown(config)
        self._offload_now = self.group(config).offload

    def _build(self, registry: Registry) -> GraphLabView:
        assert self.topology is not None
        graph = self.topology.graph(self.mtu)
        configs = self.configs or []
        pairs = list(dict.fromkeys(pair for c in configs for pair in (self._pairs(c)[0],
                                                                      *self._pairs(c)[1].values()))) or [
            (tuple(self.topology.endpoints(graph)[0]), self.topology.endpoints(graph)[1])]
        lab = GraphLabView(self.run_prefix, registry)
        lab.wake = idle.held(registry, self.run_prefix, self.idle_cores)
        t0 = time.perf_counter()
        variant = self.variants[0][0] if self.variants else Variant(env="bare", mtu=self.mtu)
        kinds = [n.kind for n in graph.nodes.values()]
        shape = (f"{kinds.count('host')} hosts, {kinds.count('switch')} switches, {kinds.count('router')} routers, "
                 f"{len(graph.links)} links")
        # Servers on the last core, clients spread over the others (a host that is both: a server's core)
        servers = list(dict.fromkeys(server for _, server in pairs))
        clients = [c for c in dict.fromkeys(c for cs, _ in pairs for c in cs) if c not in servers]
        self._slots = {c: i for i, c in enumerate(dict.fromkeys(c for cs, _ in pairs for c in cs))}
        rx_cpu, tx_cpus = _cpu_plan(len(clients))
        placed = [*((s, rx_cpu) for s in servers), *zip(clients, tx_cpus)]
        endpoints = {name: Endpoint(name=name, number=number, cpu=cpu if self.pin_cpus else None,
                                    receiver=name in servers,
                                    mtu=graph.links_of(name)[0].mtu)
                     for number, (name, cpu) in enumerate(placed, 1)}
        env: NamespaceEnvironment
        provided: dict[str, str] = {}
        if variant.env == "bare":
            env = GraphEndpoints(variant, f"namespaces on a declared topology: {shape}")
        else:
            # The workloads' hosts in the variant's environment, each behind the namespace the graph wired for it
            # (LabContext.wired, filled in below), as a dumbbell container's wired namespace sits on the switch;
            # or in a namespace the environment makes itself before the graph is wired (an engine's container).
            # The topology's other hosts stay bare: no workload runs there.
            ctx = LabContext(self.run_prefix, registry, engine_networks=False)
            env = environments.create(variant, ctx)
            provided = {name: ns for name, e in endpoints.items() if (ns := env.host_namespace(e)) is not None}
        lab.built = build_graph(self.run_prefix, graph, registry, provided=provided)
        wired = {name: self._wired(lab, name) for name in endpoints}
        if variant.env != "bare":
            ctx.wired.update(wired)
            ctx.routers.extend(lab.namespace(n) for n, spec in graph.nodes.items() if spec.kind == "router")
            _keep_apart(lab.built, env)
        for name, endpoint in endpoints.items():
            if variant.env == "bare":
                node = wired[name]
                interfaces = [Interface(node.ns, i.ifname) for i in lab.built.plan.interfaces[name]]
                host = NamespaceNode(name=name, ns=node.ns, registry=registry, ipv4=node.ipv4, ipv6=node.ipv6,
                                     cpu=endpoint.cpu, iface=node.iface,
                                     env_facts={"env": "bare", "netns": node.ns.name})
                env.attached.append(Attached(node=host, port=None, uplink=node.iface, offload_ifaces=interfaces))
            else:
                host = env.attach(endpoint).node
            lab.endpoints[name] = host
        env.finish()
        for key in pairs:
            lab.groups[key] = Group(variant, "", env, key[1], list(key[0]), named_roles=True)  # type: ignore[index]
        lab.bringup_s[variant] = time.perf_counter() - t0
        return lab

    def _wired(self, lab: GraphLabView, name: str) -> WiredNamespace:
        """Host `name` as the graph wired it: its namespace, its first link's end, its addresses and routes."""
        assert lab.built is not None
        plan = lab.built.plan
        ns = lab.namespace(name)
        first = plan.interfaces[name][0]
        return WiredNamespace(ns=ns, iface=Interface(ns, first.ifname), port=None,
                              ipv4=plan.address(name, 4), ipv6=plan.address(name, 6),
                              prefixlens=plan.prefixlens[(name, first.ifname)],
                              routes=[(str(r.dst), r.gateway) for r in plan.routes.get(name, [])])


def _keep_apart(built: GraphLab, env: NamespaceEnvironment) -> None:
    """A container's own subnets (198.19.k.0/24, 2001:2:0:1kk::/64, lab.environments.base.Subnet) must not be
    any of the graph's: the graph plans from the bottom of 198.18.0.0/15 and 2001:2::/48, so only a graph of
    tens of thousands of addresses reaches them."""
    taken = [net for s in built.plan.segments for net, mine in ((s.v4, CONTAINER_V4), (s.v6, CONTAINER_V6))
             if net is not None and net.overlaps(mine)]
    if taken:
        raise LabError(f"the topology's segment {taken[0]} overlaps the subnets {env.kind} endpoints get "
                       f"({CONTAINER_V4}, {CONTAINER_V6}): use a smaller topology, or env = \"bare\"")


def graph_key(config: Configuration) -> str:
    """What makes a configuration's graph: its topology table without the endpoints, the links' MTU and the
    environment its hosts run in (a matrix over lab.env builds one graph per environment, side by side)."""
    topology = config.scenario.topology
    assert topology is not None
    return topology.model_copy(update={"clients": None, "server": None}).model_dump_json() + \
        f"mtu={config.scenario.lab.mtu}" + f"variant={variant_of(config)!r}"


def config_pairs(config: Configuration, graph: Graph) -> tuple[Pair, dict[str, Pair]]:
    """(the topology's (clients, server), each active workload's: its own, else the topology's)."""
    topology = config.scenario.topology
    assert topology is not None
    clients, server = topology.endpoints(graph)
    own = {}
    for name, w in config.scenario.active.items():
        cs, sv = topology.endpoints(graph, clients=w.clients, server=w.server)
        own[name] = (tuple(cs), sv)
    return (tuple(clients), server), own


class GraphsBench:
    """A run over several graphs (``"topology.hops" = [1, 2, 4, 8]``): one GraphBench per graph, all built at
    setup as a dumbbell's environment variants are, each configuration measured on its own graph's. Before a
    configuration's trials every other graph's links are idled, so no emulator of another graph spins beside
    them. The runner sees one bench."""

    def __init__(self, benches: dict[str, GraphBench]):
        self.benches = benches
        self._current: GraphBench | None = None

    def of(self, config: Configuration) -> GraphBench:
        return self.benches[graph_key(config)]

    @property
    def keep_dir(self) -> Any:
        return next(iter(self.benches.values())).keep_dir

    @keep_dir.setter
    def keep_dir(self, where: Any) -> None:
        for bench in self.benches.values():
            bench.keep_dir = where

    @property
    def cpu_wake_latency(self) -> str:
        return next(iter(self.benches.values())).cpu_wake_latency

    @property
    def cpu_wake_up(self) -> dict | None:
        return next(iter(self.benches.values())).cpu_wake_up

    def setup(self) -> None:
        done: list[GraphBench] = []
        try:
            for bench in self.benches.values():
                bench.setup()
                done.append(bench)
                bench.links.idle()  # type: ignore[union-attr]  # until its configurations run
        except BaseException:
            for bench in reversed(done):
                bench.teardown()
            raise

    def teardown(self) -> list[str]:
        return [problem for bench in reversed(list(self.benches.values())) for problem in bench.teardown()]

    def endpoints(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Each graph's endpoints, under its variant's name and the graph's number."""
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for k, bench in enumerate(self.benches.values(), start=1):
            for variant, mapping in bench.endpoints().items():
                out[f"{variant}, graph {k}"] = mapping
        return out

    def prepare(self, config: Configuration) -> list[dict[str, Any]]:
        bench = self.of(config)
        if bench is not self._current:
            for other in self.benches.values():
                if other is not bench and other.links is not None:
                    other.links.idle()
            self._current = bench
        return bench.prepare(config)

    def unavailable(self, config: Configuration) -> tuple[str, dict[str, Any]] | None:
        return self.of(config).unavailable(config)

    def run_trial(self, config: Configuration, trial_tag: str) -> Any:
        return self.of(config).run_trial(config, trial_tag)

    def environment_state(self, config: Configuration) -> dict[str, Any]:
        return self.of(config).environment_state(config)

    def link_state(self, config: Configuration) -> dict[str, Any]:
        return self.of(config).link_state(config)

    def after_trial(self, outcome: Any) -> None:
        if self._current is not None:
            self._current.after_trial(outcome)
