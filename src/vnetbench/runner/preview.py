"""`vnetbench plan`: what a scenario will do, checked and costed, without building or writing anything.

A user runs it before a two-hour campaign, and a CI job runs it to lint
scenario files: the scenario is loaded and expanded exactly as `run` does (the
same validation, the same errors), then each configuration's trial is timed
from its workloads' own timing, and the machine is asked, without changing it,
whether it has the tools, environments and link backends the run needs.

Root is not needed. Without it, what only root can probe (the kernel's qdiscs
and VXLAN/NAT support, in throw-away namespaces) is said to be "not probed"
rather than guessed; `vnetbench doctor` as root probes everything.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from vnetbench.errors import EnvironmentProblem, VnetbenchError
from vnetbench.impair.model import lab_links
from vnetbench.lab import environments
from vnetbench.runner import calibration
from vnetbench.runner.bench import variant_of
from vnetbench.runner.places.lab import (leave_out_unavailable, tools_by_variant, wanted_congestion_controls,
                                         workload_tools)
from vnetbench.scenario.load import LoadedScenario
from vnetbench.scenario.plan import MAX_CONFIGURATIONS, Configuration, expand
from vnetbench.workloads import registry

#: What a trial costs beyond its workloads' own seconds: starting the clients, reading and parsing their
#: output, applying the link conditions and committing to the database. bench/workloads.py measures it per
#: tool (0.03 s for iperf3 to 0.14 s for wrk on this project's 2-core VM); this is a round upper figure.
TRIAL_OVERHEAD_S = 0.3


@dataclass
class PlannedConfiguration:
    labels: dict[str, Any]
    environment: str  # the variant it is built in, e.g. "vm(nic=e1000)"
    phases: list[str]  # "stream (iperf3) + probe (ping)", ...
    trial_s: float  # one trial, overhead included


@dataclass
class Plan:
    scenario: str
    source: str
    configurations: list[PlannedConfiguration]
    repetitions: tuple[int, int]  # fixed: (n, n); adaptive: (min, max) per configuration
    warmup: bool
    setup_s: float  # building every environment once
    tools: list[dict[str, Any]]  # command, package, path (None: missing)
    environments: list[dict[str, Any]]  # variant, problems
    links: dict[str, Any]  # choice per link, or why it is not known
    problems: list[str] = field(default_factory=list)  # what stops `run` on this machine
    left_out: list[dict[str, Any]] = field(default_factory=list)  # if_available environments this machine lacks
    hosts: dict[str, Any] | None = None  # the scenario's [hosts] placement (run --hosts INVENTORY)
    kube: list[dict[str, Any]] | None = None  # the configurations' [kube] placements, each once (run --kube)
    scale: str | None = None  # the line rate a [scale] table chose here, and why
    topology: dict[str, Any] | None = None  # a declared topology: nodes, links, addresses, routes, paths

    @property
    def trials(self) -> tuple[int, int]:
        extra = 1 if self.warmup and self.configurations else 0
        n = len(self.configurations)
        return n * self.repetitions[0] + extra, n * self.repetitions[1] + extra

    @property
    def wall_s(self) -> tuple[float, float]:
        per_round = sum(c.trial_s for c in self.configurations)
        warm = self.configurations[0].trial_s if self.warmup and self.configurations else 0.0
        return tuple(self.setup_s + warm + per_round * r for r in self.repetitions)  # type: ignore[return-value]

    def as_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario, "source": self.source, "valid": True, "ready": not self.problems,
            "configurations": [{"labels": c.labels, "environment": c.environment, "phases": c.phases,
                                "trial_s": round(c.trial_s, 1)} for c in self.configurations],
            "repetitions": {"min": self.repetitions[0], "max": self.repetitions[1]}, "warmup": self.warmup,
            "trials": {"min": self.trials[0], "max": self.trials[1]},
            "estimated_s": {"min": round(self.wall_s[0]), "max": round(self.wall_s[1]),
                            "setup": round(self.setup_s, 1), "per_trial_overhead": TRIAL_OVERHEAD_S},
            "tools": self.tools, "environments": self.environments, "links": self.links,
            "problems": self.problems, "left_out": self.left_out, "hosts": self.hosts, "kube": self.kube,
            "scale": self.scale,
            "topology": self.topology,
        }


def trial_seconds(config: Configuration) -> tuple[float, list[str]]:
    """One trial of `config`: its phases one after the other, each its leader's warm-up and measured
    time (companions run inside it), plus the per-trial overhead."""
    active = config.scenario.active
    total, phases = TRIAL_OVERHEAD_S, []
    for leader, companions in config.scenario.phases():
        options = active[leader]
        warm_s, measured_s = registry.of(options).timing(options, config)
        total += warm_s + measured_s
        names = [leader] + companions
        phases.append(" + ".join(f"{n} ({active[n].tool})" for n in names))
    return total, phases


def _tools(configs: list[Configuration]) -> list[dict[str, Any]]:
    return [{"command": t.command, "package": t.package, "path": t.path()} for t in workload_tools(configs)]


def _environments(configs: list[Configuration], probe: bool) -> tuple[list[dict[str, Any]], float]:
    out, setup = [], 0.0
    for variant, needed in tools_by_variant(configs).items():
        found = environments.problems([variant], probe=probe)
        found += environments.tool_problems({variant: needed}) if not found else []
        out.append({"variant": str(variant), "problems": found})
        setup += environments.kind(variant.env).setup_s
    return out, setup


def _links(configs: list[Configuration], root: bool) -> dict[str, Any]:
    from vnetbench.impair import links

    if configs and configs[0].scenario.hosts is not None:
        return _host_links(configs)
    if configs and configs[0].scenario.kube is not None:
        return _host_links(configs, on_pods=True)
    if not root:
        return {"choice": None, "note": "the link backends are chosen at run time: probing the kernel's qdiscs "
                                        "needs root (vnetbench doctor, as root, lists them)"}
    n = max((c.active_senders for c in configs), default=1)
    try:
        choice = links.check_configs(configs, n_senders=n)
    except VnetbenchError as e:
        return {"choice": None, "note": "", "problem": str(e)}
    # a link with nothing to emulate in any configuration (bottleneck = "unlimited") gets no backend at all
    shaped = {name for c in configs for name, spec in lab_links(c.scenario.lab).items() if spec.needs()}
    return {"choice": {k: v for k, v in choice.items() if k in shaped}, "note": ""}


def _host_links(configs: list[Configuration], on_pods: bool = False) -> dict[str, Any]:
    """A scenario placed on real hosts (or on a cluster's pods: `on_pods`): its links are made there, with their
    kernels' qdiscs, chosen when the run has checked them; what only the lab can do is a problem here already (on
    a cluster, placement() names what it refuses)."""
    from vnetbench.hosts import shaping

    shaped: dict[str, Any] = {}
    for c in configs:
        for name, spec in lab_links(c.scenario.lab).items():
            if not spec.is_plain():
                shaped.setdefault(name, spec)
    if not shaped:
        return ({"choice": None, "note": "none: a run on Kubernetes changes nothing on the cluster's network"}
                if on_pods else {"choice": {}, "note": ""})
    problems = [p for name, spec in shaped.items() if (p := shaping.lab_only_problem(name, spec))]
    topology = configs[0].scenario.topology
    if topology is not None:  # on hosts: a link's conditions go on the host at its end (runner/hosts_topology.py)
        graph = topology.graph(configs[0].scenario.lab.mtu)
        ends = {name: [n for n in (graph.links[name].a, graph.links[name].b) if graph.kind(n) == "host"]
                for name in shaped}
        where = {name: f"host {ends[name][0]}" if ends[name] else "no host (it joins two switches or routers)"
                 for name in shaped}
    else:
        where = {name: ("the receiver" if name == "bottleneck" else f"sender {name[1:]}") + ("'s pod" if on_pods
                                                                                            else "")
                 for name in shaped}
    if on_pods:
        note = ("inside the pods (kube.shape_pods), with the pods' kernel qdiscs (tbf, htb; netem where the nodes' "
                "kernel has it), chosen when the pods are up: " + ", ".join(f"{name} on {where[name]}'s interface"
                                                                            for name in shaped)
                + "; nothing on the nodes changes")
        return {"choice": None, "note": note}
    note = ("on the hosts, with each host's kernel qdiscs (tbf, htb; netem where it has it), chosen when the run "
            "has checked them: " + ", ".join(f"{name} on {where[name]}'s interface" for name in shaped)
            + "; the inventory must opt each interface in (vnetbench_shape_interfaces)")
    return {"choice": None, "note": note, **({"problem": "; ".join(problems)} if problems else {})}


def _congestion_controls(configs: list[Configuration]) -> list[str]:
    wanted, available = wanted_congestion_controls(configs)
    # `run` loads a missing one's module (tcp_NAME) first; plan changes nothing, so it only says so
    return [f"TCP congestion control {cc!r} is not loaded (available: {', '.join(sorted(available))}); `run` "
            f"tries modprobe tcp_{cc}" for cc in wanted if cc not in available]


def topology_plan(configs: list[Configuration]) -> dict[str, Any] | None:
    """A declared topology as the run would build it: its nodes, its links with the conditions each
    configuration gives them, every IP node's addresses and routes, and each configuration's endpoints with the
    links between them (None: the dumbbell). Where the configurations declare several graphs (a matrix over
    the topology), the first graph's, with "graphs": each graph's, with its configurations' labels."""
    if not configs or configs[0].scenario.topology is None:
        return None
    from vnetbench.runner.graph_bench import graph_key

    graphs: dict[str, list[Configuration]] = {}
    for c in configs:
        graphs.setdefault(graph_key(c), []).append(c)
    plans = [dict(_graph_plan(group), configurations=[dict(c.labels) for c in group]) for group in graphs.values()]
    if len(plans) == 1:
        del plans[0]["configurations"]
        return plans[0]
    return dict(plans[0], graphs=plans)


def _graph_plan(configs: list[Configuration]) -> dict[str, Any]:
    """topology_plan of configurations that share one graph."""
    first = configs[0].scenario
    graph = first.topology.graph(first.lab.mtu)  # type: ignore[union-attr]
    plan = graph.plan()
    conditions: dict[str, list[str]] = {}
    for c in configs:
        declared = lab_links(c.scenario.lab)
        for name in graph.links:
            text = declared[name].describe() if name in declared else "plain"
            if text not in conditions.setdefault(name, []):
                conditions[name].append(text)
    pairs: list[dict[str, Any]] = []  # each (clients, server) a workload runs between, with the workloads
    for c in configs:
        topology = c.scenario.topology
        for workload, w in c.scenario.active.items():
            clients, server = topology.endpoints(graph, clients=w.clients, server=w.server)  # type: ignore[union-attr]
            entry = next((e for e in pairs if (e["clients"], e["server"]) == (clients, server)), None)
            if entry is None:
                entry = {"clients": clients, "server": server, "workloads": [],
                         "paths": {client: [name for name, _ in graph.path(plan, client, server)] for client in clients}}
                pairs.append(entry)
            if workload not in entry["workloads"]:
                entry["workloads"].append(workload)
    on_hosts = first.hosts is not None
    return {
        **({"on_hosts": True} if on_hosts else {}),  # the hosts' network is theirs: no address or route is made
        "template": first.topology.template,  # type: ignore[union-attr]
        "containerlab": first.topology.containerlab,  # type: ignore[union-attr]
        "nodes": {name: node.kind for name, node in graph.nodes.items()},
        "links": [{"name": link.name, "a": link.a, "b": link.b, "mtu": link.mtu, "conditions": conditions[link.name]}
                  for link in graph.links.values()],
        "addresses": {node: {i.ifname: {"link": i.link, "ipv4": f"{plan.addresses[(node, i.ifname)][0]}/"
                                                                f"{plan.prefixlens[(node, i.ifname)][0]}",
                                        "ipv6": f"{plan.addresses[(node, i.ifname)][1]}/"
                                                f"{plan.prefixlens[(node, i.ifname)][1]}"}
                             for i in ifs} for node, ifs in plan.interfaces.items()} if not on_hosts else {},
        "routes": {node: [f"{r.dst} via {r.gateway} dev {r.ifname}" for r in routes]
                   for node, routes in plan.routes.items() if routes} if not on_hosts else {},
        "endpoints": pairs,
    }


def topology_record(configs: list[Configuration]) -> dict[str, Any] | None:
    """A declared topology as a run stores it (its fingerprint's "topology"), for `show` and the report to draw:
    :func:`topology_plan` without every address and route, which `plan --json` lists (a thousand hosts' take
    hundreds of kilobytes)."""
    found = topology_plan(configs)
    if found is None:
        return None
    for graph in [found, *found.get("graphs", [])]:
        if "routes" in graph:
            graph["routes_count"] = sum(len(r) for r in graph.pop("routes").values())
        graph.pop("addresses", None)
    return found


def make_plan(loaded: LoadedScenario, max_configurations: int = MAX_CONFIGURATIONS) -> Plan:
    """Expand and cost `loaded`; raises ScenarioError (as `run` would) when the scenario is not valid."""
    root = os.geteuid() == 0
    configs = expand(loaded, max_configurations)
    try:
        configs, left_out = leave_out_unavailable(configs, probe=root)
    except EnvironmentProblem:
        left_out = []  # none of them can run here: the environments' problems below say why
    planned = []
    for c in configs:
        seconds, phases = trial_seconds(c)
        planned.append(PlannedConfiguration(dict(c.labels), str(variant_of(c)), phases, seconds))
    rep = loaded.scenario.repeat
    repetitions = (rep.repetitions, rep.repetitions) if not rep.adaptive else (rep.n_min, rep.n_max)
    tools = _tools(configs)
    envs, setup = _environments(configs, probe=root)
    if loaded.scenario.hosts is None and loaded.scenario.kube is None:
        setup += calibration.SECONDS  # the local lab calibrates its machine before and after (runner/calibration)
    link_info = _links(configs, root)
    problems = [f"missing tool: {t['command']} -> apt-get install {t['package']}" for t in tools if not t["path"]]
    problems += [p for e in envs for p in e["problems"]]
    problems += [link_info["problem"]] if link_info.get("problem") else []
    problems += _congestion_controls(configs)
    if loaded.scenario.kube is not None:
        from vnetbench.kube.bench import placement

        try:
            placement(configs, loaded.source, "")
        except VnetbenchError as e:
            problems.append(str(e))
    if not root:
        problems.append("vnetbench run needs root (it builds network namespaces): run it with sudo")
    return Plan(scenario=loaded.scenario.name, source=loaded.source, configurations=planned,
                repetitions=repetitions, warmup=rep.warmup, setup_s=setup, tools=tools, environments=envs,
                links=link_info, problems=list(dict.fromkeys(problems)), left_out=left_out,
                hosts=loaded.scenario.hosts.model_dump() if loaded.scenario.hosts else None,
                kube=_kube_placements(configs) if loaded.scenario.kube else None,
                scale=loaded.scale_note, topology=topology_plan(configs))


def _kube_placements(configs: list[Configuration]) -> list[dict[str, Any]]:
    """Each distinct [kube] placement of the configurations (a matrix over kube.* gives several), as the
    scenario says it: the cluster's nodes are only known when the run starts."""
    seen: dict[str, dict[str, Any]] = {}
    for c in configs:
        spec = c.scenario.kube
        if spec is not None:
            entry = {k: v for k, v in spec.model_dump().items() if k not in ("image", "image_pull_policy")}
            seen.setdefault(json.dumps(entry, sort_keys=True), entry)
    return list(seen.values())
