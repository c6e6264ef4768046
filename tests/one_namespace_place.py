"""A toy third place, for tests/integration/test_third_place.py: every endpoint in one network namespace.

It is what a new place costs: this one module and one line in vnetbench.runner.places.PLACES (the test adds the
line). The receiver and its senders are names for the same namespace, which holds the endpoints' addresses on its
loopback; traffic between them never leaves that namespace. There are no links, so it takes
no link conditions and no environment but bare, and says so before anything is built.
"""

from __future__ import annotations

import argparse
import shutil
from typing import Any

from vnetbench.errors import ScenarioError
from vnetbench.impair.links import LinkManager, lab_links
from vnetbench.lab import netns
from vnetbench.lab.nodes import NamespaceNode, Interface, Namespace, placement_entry
from vnetbench.lab.teardown import Registry
from vnetbench.lab.topology import Group, Lab
from vnetbench.runner.bench import DumbbellBench, variant_of
from vnetbench.runner.places import Place
from vnetbench.runner.places.lab import check_root, workload_tools
from vnetbench.scenario.load import LoadedScenario
from vnetbench.scenario.plan import Configuration
from vnetbench.tools import require

IPV4, IPV6 = "198.18.0.1", "2001:2::1"


class OneNamespaceBench(DumbbellBench):
    """The run's bench: one namespace, every endpoint a name for it. What a trial does (servers, phases,
    recorders, path check) is the lab's; what the place is (its nodes, that it has no links) is here."""

    def setup(self) -> None:
        # The lab (and its registry) first: whatever is made from here on is torn down with it, also when a
        # later step fails.
        registry = Registry()
        self.lab = Lab(self.run_prefix, registry, cpu_wake_latency="not held: a toy place")
        registry.add(f"work directory {self.workdir}", lambda: shutil.rmtree(self.workdir, ignore_errors=True))
        ns = Namespace.create(f"{self.run_prefix}-one", registry)
        loopback = Interface(ns, "lo")  # the endpoints' addresses: traffic between them never leaves the namespace
        loopback.add_address(f"{IPV4}/32")
        loopback.add_address(f"{IPV6}/128")
        variant = variant_of(self.configs[0])
        names = ["r", *(f"s{i}" for i in range(1, self.senders + 1))]
        self.lab.endpoints = {n: OneNamespaceNode(n, ns, registry, ipv4=IPV4, ipv6=IPV6, iface=loopback) for n in names}
        self.lab.groups = {variant: Group(variant, "", None, "r", names[1:])}
        self.links = LinkManager(self.lab, registry, self.workdir, self.run_prefix, mtu=self.mtu)
        self.start_servers()

    def _realise(self, config: Configuration) -> bool:
        return False  # no links, no offloads: nothing a configuration changes

    def _state_problems(self, config: Configuration) -> list[str]:
        return []

    def environment_state(self, config: Configuration) -> dict[str, Any]:
        return {"environment": {"variant": "one-namespace", "env": "bare"}}


class OneNamespaceNode(NamespaceNode):
    def placement(self) -> dict[str, Any]:
        return placement_entry(f"one namespace {self.ns.name}", self.ipv4, self.ipv6, "lo", self.cpu)


class OneNamespacePlace(Place):
    name = "one-namespace"

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, command: str) -> None:
        parser.add_argument("--one-namespace", action="store_true", help="every endpoint in one namespace (a toy)")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "OneNamespacePlace | None":
        return cls() if getattr(args, "one_namespace", False) else None

    def prepare(self, loaded: LoadedScenario, configs: list[Configuration]
                ) -> tuple[list[Configuration], list[dict[str, object]]]:
        for c in configs:
            conditioned = [n for n, spec in lab_links(c.scenario.lab).items() if not spec.is_plain()]
            if c.scenario.lab.env != "bare" or conditioned:
                raise ScenarioError(f"{loaded.source}: {c.label_text}: one namespace has no links to condition "
                                    f"({', '.join(conditioned) or 'none'}) and no environment but bare")
        check_root()
        require(workload_tools(configs))
        return configs, []

    def bench(self, run_prefix: str, configs: list[Configuration]) -> OneNamespaceBench:
        return OneNamespaceBench.for_configs(run_prefix, configs, pin_cpus=False)

    def doctor(self, args: argparse.Namespace) -> int:
        return 0

    def clean(self, args: argparse.Namespace) -> int:
        left = [n for n in netns.list_names() if n.startswith(netns.PREFIX) and n.endswith("-one")]
        if not (args.dry_run or args.check):
            for name in left:
                netns.remove(name)
        return 1 if args.check and left else 0
