"""A declared topology on real hosts (`run --hosts` with a ``[topology]`` table): its host nodes on the machines
``hosts.nodes`` names, its workloads between them as in the lab, each host's link under its conditions.

Nothing of the graph is built: the network between the hosts is the real one, which the topology's switches
and routers stand for. What a real network lets vnetbench make is a host's own link, on the host's interface
(hosts/shaping.py): a star's leaves each at a distance of their own (seed 004's sites), a parking lot's
senders each behind its own rate. A link between two switches or routers cannot be made on any host, and is
refused when a configuration gives it conditions::

    [topology] template = "star", leaves = 2          h1 ──┐
    [hosts] nodes = { srv = "server-a",                     ├── x1 ──> srv
                      h1 = "site-1", h2 = "site-2" }   h2 ──┘
    [lab.link.h1] forward = { rate = "20Mbit" }        link h1 on site-1's interface, outbound (h1 -> x1)

Each link's ``forward`` leaves its ``a`` end: on a host that is the link's a end it is the interface's egress,
on one at the b end its ingress (steered into an IFB of the run's, as a dumbbell's bottleneck is).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vnetbench.errors import ScenarioError
from vnetbench.hosts import shaping
from vnetbench.hosts.inventory import Inventory, InventoryHost
from vnetbench.impair.model import lab_links
from vnetbench.lab.teardown import Registry
from vnetbench.lab.topology import Group, Lab
from vnetbench.runner.graph_bench import Pair, WorkloadPairs, config_pairs, graph_key
from vnetbench.runner.hosts_bench import BARE, HostsBench, Placement, completed, hosts_table, lab_problems
from vnetbench.runner.recorders import LinkRecorder, MachinesCpuRecorder, Recorder
from vnetbench.scenario.plan import Configuration
from vnetbench.topology.graph import Graph, Link


def topology_placement(configs: list[Configuration], inventory: Inventory, source: str) -> Placement:
    """The topology's host nodes that the configurations' workloads run on, each on its inventory host, and
    the conditions of each host's link on that host; everything real hosts cannot do refused before any
    connection is made (ScenarioError naming the key and what to change)."""
    first = configs[0].scenario
    spec, topology = hosts_table(configs, inventory, source), first.topology
    assert topology is not None
    shapes = {graph_key(c) for c in configs}
    if len(shapes) > 1:
        raise ScenarioError(f"{source}: the matrix changes the topology's shape ({len(shapes)} graphs); on real hosts "
                            "the hosts are the network's, the same machines for every graph: run one shape at a "
                            "time (a matrix over its links' conditions and its workloads' endpoints is fine)")
    graph = topology.graph(first.lab.mtu)
    pairs = {c.key: config_pairs(c, graph) for c in configs}
    used = _used_nodes(pairs.values())
    unplaced = [n for n in used if n not in spec.nodes]
    if unplaced:
        raise ScenarioError(f"{source}: the workloads run on {', '.join(map(repr, unplaced))}, which hosts.nodes "
                            f"places on no host: add {unplaced[0]} = \"INVENTORY HOST\" to hosts.nodes")
    nodes: dict[str, InventoryHost] = {}
    for node in used:
        found = inventory.resolve(spec.nodes[node])
        if len(found) != 1:
            raise ScenarioError(f"{source}: hosts.nodes.{node} = {spec.nodes[node]!r} names {len(found)} hosts "
                                f"({', '.join(h.name for h in found)}); name one")
        twice = [n for n, h in nodes.items() if h.name == found[0].name]
        if twice:
            raise ScenarioError(f"{source}: hosts.nodes places {twice[0]} and {node} both on {found[0].name}: a host "
                                "is one endpoint; give each node a host of its own")
        nodes[node] = found[0]
    for key in ("addresses", "interfaces"):
        unknown = sorted(set(getattr(spec, key)) - {h.name for h in nodes.values()})
        if unknown:
            raise ScenarioError(f"{source}: hosts.{key} names {', '.join(map(repr, unknown))}, which runs none of "
                                f"the workloads' nodes ({', '.join(f'{n} on {h.name}' for n, h in nodes.items())})")
    links: dict[str, Link] = {}  # node -> its one link
    for node in used:
        own = graph.links_of(node)
        if len(own) != 1:
            raise ScenarioError(f"{source}: topology host {node!r} has {len(own)} links "
                                f"({', '.join(x.name for x in own)}); on a real host it has one interface toward "
                                "its peers, so a host the workloads run on has one link there")
        if own[0].mtu != first.lab.mtu:
            raise ScenarioError(f"{source}: link {own[0].name!r} declares mtu = {own[0].mtu}; a real host's "
                                f"interface keeps its own MTU (recorded with the run): remove the link's mtu")
        links[node] = own[0]
    carriers = {link.name: nodes[node].name for node, link in links.items() if carrier(link, links) == node}
    for c in configs:
        problems = lab_problems(c) + _unmakeable(c, graph, carriers)
        if problems:
            raise ScenarioError(f"{source} [configuration {c.label_text}]: with --hosts, " + "; ".join(problems))
    shaped = shaping.links_by_host(configs, lambda c: carriers)
    place = Placement(None, [], {}, first.lab.ip_version, shaped, nodes=nodes,
                      outward={nodes[node].name: link.a == node for node, link in links.items()})
    return completed(place, configs, inventory, source)


def carrier(link: Link, links: dict[str, Link]) -> str:
    """The endpoint whose host makes `link`'s conditions, of the run's endpoints with their links (`links`): its
    a end when both ends are (two hosts joined straight: forward is then the a host's egress)."""
    return link.a if links.get(link.a) == link else link.b


def _used_nodes(pairs: Any) -> list[str]:
    """The nodes the workloads run on, over every configuration: servers first (the first is the run's
    receiver, as a dumbbell's), then the clients, each once. (The topology's own pair counts only where a
    workload runs between it: a host no workload uses is no host's to stand for.)"""
    found: list[Pair] = [p for _, own in pairs for p in own.values()]
    return list(dict.fromkeys([*(server for _, server in found), *(c for clients, _ in found for c in clients)]))


def _unmakeable(config: Configuration, graph: Graph, carriers: dict[str, str]) -> list[str]:
    """The configuration's conditioned links no host of the run carries: between two switches or routers (the
    real network), or at a host no workload runs on."""
    out = []
    for name, spec in lab_links(config.scenario.lab).items():
        if spec.is_plain() or name in carriers:
            continue
        link = graph.links[name]
        ends = f"{link.a} ({graph.kind(link.a)}) and {link.b} ({graph.kind(link.b)})"
        hosts = [n for n in (link.a, link.b) if graph.kind(n) == "host"]
        why = (f"host {hosts[0]!r} runs none of the workloads, so no real host stands for it" if hosts else
               "the network between the real hosts is what it is")
        out.append(f"link {name!r} joins {ends}: {why}; on real hosts a link's conditions go on the interface of "
                   f"a host the workloads run on ({', '.join(sorted(carriers)) or 'none'})")
    return out


@dataclass
class HostsTopologyLab(Lab):
    """The hosts as the link manager sees a lab: each endpoint's one link (at the endpoint's key), crossed out
    of the host forward where the host is the link's a end."""

    link_of: dict[str, str] = field(default_factory=dict)  # endpoint -> its link's name
    outward: dict[str, bool] = field(default_factory=dict)  # endpoint -> forward leaves it

    def path_links(self, receiver: str, senders: list[str]) -> dict[str, str]:
        return {h: self.link_of[h] for h in (receiver, *senders) if h in self.link_of}

    def route(self, sender: str, receiver: str) -> list[tuple[str, bool]]:
        """Out of the sender's link, into the receiver's: forward where the packet leaves the a end."""
        return [(h, forward) for h, forward in ((sender, self.outward.get(sender, True)),
                                                (receiver, not self.outward.get(receiver, False)))
                if h in self.link_of]


@dataclass
class HostsTopologyBench(WorkloadPairs, HostsBench):
    """The hosts' bench with a declared topology's endpoints: one group per (clients, server) pair of the
    configurations' workloads, every workload between its own pair, as GraphBench runs them in the lab."""

    graph: Graph | None = None
    _pairs_of: dict[str, tuple[Pair, dict[str, Pair]]] = field(default_factory=dict)  # config key -> its pairs
    _slots: dict[str, int] = field(default_factory=dict)  # client -> its slot (TrialEndpoints.slots)

    @classmethod
    def for_topology(cls, run_prefix: str, configs: list[Configuration], place: Placement, connect: Any,
                     host_facts: dict[str, dict[str, str]]) -> "HostsTopologyBench":
        topology = configs[0].scenario.topology
        assert topology is not None
        graph = topology.graph(configs[0].scenario.lab.mtu)
        pairs = {c.key: config_pairs(c, graph) for c in configs}
        clients = list(dict.fromkeys(c for _, own in pairs.values() for cs, _ in own.values() for c in cs))
        spec = configs[0].scenario.hosts
        return cls(run_prefix, senders=len(clients), pin_cpus=False, variants=[(BARE, len(clients))],
                   configs=list(configs), place=place, connect=connect, host_facts=host_facts,
                   remote_workdir=f"/tmp/{run_prefix}", wait_for_host=spec.wait_for_host if spec else 30.0,
                   graph=graph, _pairs_of=pairs, _slots={c: i for i, c in enumerate(clients)})

    def _lab(self, registry: Registry) -> Lab:
        assert self.graph is not None
        links = {node: self.graph.links_of(node)[0] for node in self.place.nodes}
        carried = {n: x for n, x in links.items() if carrier(x, links) == n}  # a link two endpoints share: once
        return HostsTopologyLab(self.run_prefix, registry, link_of={n: x.name for n, x in carried.items()},
                                outward={n: x.a == n for n, x in carried.items()})

    def _groups(self) -> None:
        assert self.lab is not None
        for _, own in self._pairs_of.values():
            for clients, server in own.values():
                self.lab.groups.setdefault((clients, server),  # type: ignore[index]
                                           Group(BARE, "", None, server, list(clients), named_roles=True))

    def group(self, config: Configuration) -> Group:
        """The group of the configuration's first workload's pair."""
        assert self.lab is not None
        return self.lab.groups[next(iter(self._pairs(config)[1].values()))]  # type: ignore[index]

    def _pairs(self, config: Configuration) -> tuple[Pair, dict[str, Pair]]:
        return self._pairs_of[config.key]

    def recorders(self, group: Group) -> list[Recorder]:
        """The links' counters, and the CPUs of the machines of every endpoint the run's workloads use (a trial
        may run several pairs at once), the first pair's server first."""
        assert self.lab is not None and self.links is not None
        first = self.lab.endpoints[group.receiver]
        others = [node for name, node in self.lab.endpoints.items() if name != group.receiver]
        one_server = len({g.receiver for g in self.lab.groups.values()}) == 1  # else no receiver's side alone
        return [LinkRecorder(self.links), MachinesCpuRecorder(first, others, self.machine_of, self.workdir,
                                                              sides=one_server)]
