"""The local lab: this machine's network namespaces, bridges, containers and guests (the default place).

Preparing checks the machine itself: root, every tool of every environment variant, the congestion controls,
the link backends; a configuration of an `if_available` environment this machine cannot make is left out,
and said so. The machine's run lock (runlock.py, taken by the runner for every run) is this place's lock.
"""

from __future__ import annotations

import argparse
import os
import subprocess
from typing import TYPE_CHECKING, Any

from rich.markup import escape

from vnetbench import machine
from vnetbench.errors import EnvironmentProblem, ScenarioError
from vnetbench.runner.places.base import Place
from vnetbench.tools import IP, PING, SS, TASKSET, Tool, require

# What runs a scenario is imported where it is used: every command (clean, show) builds its parser from the
# places, and these cost most of a second to import.
if TYPE_CHECKING:
    from vnetbench.lab.environments import Variant
    from vnetbench.runner.bench import DumbbellBench
    from vnetbench.scenario.load import LoadedScenario
    from vnetbench.scenario.plan import Configuration


class LabPlace(Place):
    """The endpoints in namespaces of this machine, on a dumbbell's switch (lab/topology.py) or a declared topology's graph (lab/graph_lab.py)."""

    name = "lab"

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, command: str) -> None:
        if command == "clean":
            parser.add_argument("--run", metavar="RUN_ID",
                                help="only what this run left (its full id or first 6 characters)")
            parser.add_argument("--images", action="store_true",
                                help="also remove the tools images vnetbench built in container engines (rebuilt "
                                     "when needed)")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "LabPlace":
        return cls()

    def prepare(self, loaded: LoadedScenario, configs: list[Configuration]
                ) -> tuple[list[Configuration], list[dict[str, object]]]:
        if loaded.scenario.hosts is not None:
            raise ScenarioError(f"{loaded.source}: its [hosts] table places the endpoints on real hosts: run it "
                                "with --hosts INVENTORY (or remove the table to run it in the local lab)")
        if loaded.scenario.kube is not None:
            raise ScenarioError(f"{loaded.source}: its [kube] table places the endpoints on a Kubernetes cluster: run "
                                "it with --kube (or remove the table to run it in the local lab)")
        configs, left_out = leave_out_unavailable(configs)
        preflight(configs)
        return configs, left_out

    def check_resume(self, fingerprint: dict[str, Any], run_id: str) -> None:
        if fingerprint.get("hosts"):
            raise ScenarioError(f"run {run_id} ran on the hosts of {fingerprint.get('inventory')}: resume it with "
                                f"--hosts INVENTORY")
        if fingerprint.get("kube"):
            raise ScenarioError(f"run {run_id} ran on the Kubernetes cluster at {fingerprint['kube'].get('server')}: "
                                "resume it with --kube (and its --kubeconfig, --context)")

    def calibrate(self, run_prefix: str) -> dict[str, Any] | None:
        from vnetbench.runner import calibration

        return calibration.measure(run_prefix)

    def bench(self, run_prefix: str, configs: list[Configuration]) -> DumbbellBench:
        from vnetbench.runner.bench import DumbbellBench
        from vnetbench.runner.graph_bench import GraphBench

        bench = GraphBench if configs[0].scenario.topology is not None else DumbbellBench
        return bench.for_configs(run_prefix, configs, pin_cpus=configs[0].scenario.lab.pin_cpus)

    def doctor(self, args: argparse.Namespace) -> int:
        from vnetbench.cli_common import out
        from vnetbench.doctor import run_checks

        for c in run_checks().checks:
            mark = "[green]ok[/]  " if c.ok else "[red]no[/]  "
            line = f"{mark}{c.name:28} {c.detail}"
            if not c.ok and c.fix:
                line += f"  [dim]-> {c.fix}[/]"
            out.print(line)
        return 0

    def clean(self, args: argparse.Namespace) -> int:
        from vnetbench.cli_common import err, out
        from vnetbench.lab.clean import (cgroup_leftovers, clean, engine_leftovers, file_leftovers,
                                         marked_leftovers, not_ours)
        from vnetbench.lab.marks import MARKS_DIR
        from vnetbench.lab.netns import PREFIX, run_prefix

        if args.check:
            engine_left, engine_errors = engine_leftovers()
            for e in engine_errors:
                err.print(f"[yellow]not checked:[/] {escape(e)}", soft_wrap=True)
            left = marked_leftovers() + cgroup_leftovers() + engine_left + [str(p) for p in file_leftovers()]
            for other in not_ours():
                out.print(f"not vnetbench's (no mark, left alone): {escape(other)}", soft_wrap=True)
            if left:
                err.print(f"[red]left behind by a run:[/] {', '.join(left)} (remove with `vnetbench clean`)")
                return 1
            out.print("nothing of vnetbench's is left on this machine")
            return 0
        prefix = run_prefix(args.run) + "-" if args.run else PREFIX
        report = clean(prefix=prefix, dry_run=args.dry_run, images=args.images)
        for run in report.live:
            out.print(f"left alone: the lab of {escape(run.describe())}, which is measuring now", soft_wrap=True)
        for other in report.not_ours:
            out.print(f"left alone: {escape(other)}, which vnetbench did not make (it has no mark in "
                      f"{escape(str(MARKS_DIR))})", soft_wrap=True)
        verb = "would remove" if args.dry_run else "removed"
        if report.engine_objects:
            out.print(f"{verb} {len(report.engine_objects)} container engine objects "
                      f"({', '.join(report.engine_objects)})", soft_wrap=True)
        if not report.namespaces and not report.cgroups and not report.engine_objects and not report.files:
            out.print(f"nothing to clean: no {prefix}* namespaces, cgroups, work directories or labelled containers "
                      "and networks")
        elif report.namespaces:
            out.print(f"{verb} {len(report.namespaces)} namespaces ({', '.join(report.namespaces)}) and "
                      f"{len(report.processes)} processes in them")
        if report.cgroups:
            out.print(f"{verb} {len(report.cgroups)} cgroups ({', '.join(report.cgroups)})")
        if report.files:
            out.print(f"{verb} {len(report.files)} work directories ({', '.join(report.files)})", soft_wrap=True)
        for e in report.errors:
            err.print(f"[red]could not remove[/] {e}")
        return 1 if report.errors else 0


def check_root() -> None:
    if os.geteuid() != 0:
        raise EnvironmentProblem(
            "vnetbench builds its lab from network namespaces, which needs root: run it with sudo (nothing was built)"
        )


def wanted_congestion_controls(configs: list[Configuration]) -> tuple[list[str], set[str]]:
    """(the TCP congestion controls the run's streams ask for, those the kernel has loaded now)."""
    wanted = sorted({c.stream.congestion_control for c in configs if c.stream and c.stream.proto == "tcp"})
    return wanted, set((machine.read_sysctl("net.ipv4.tcp_available_congestion_control") or "").split())


def tools_by_variant(configs: list[Configuration]) -> dict[Variant, list[tuple[str, str]]]:
    """Per environment variant, the (command, Debian package) its configurations' workloads run."""
    from vnetbench.runner.bench import variant_of
    from vnetbench.workloads import registry

    tools: dict[Variant, list[tuple[str, str]]] = {}
    for c in configs:
        needed = tools.setdefault(variant_of(c), [])
        needed.extend((t.command, t.package) for w in c.scenario.active.values() for t in registry.of(w).requires)
    return tools


def check_congestion_controls(configs: list[Configuration]) -> None:
    wanted, available = wanted_congestion_controls(configs)
    for cc in wanted:
        if cc in available:
            continue
        # Most algorithms are modules (tcp_bbr, tcp_htcp...): try loading before giving up.
        try:
            subprocess.run(["modprobe", f"tcp_{cc}"], capture_output=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired):
            pass  # no modprobe, or it hung: the check below says what is missing
        available = set((machine.read_sysctl("net.ipv4.tcp_available_congestion_control") or "").split())
        if cc not in available:
            raise EnvironmentProblem(
                f"TCP congestion control {cc!r} is not available on this kernel (available: "
                f"{', '.join(sorted(available))}); choose one with --set congestion_control=NAME"
            )


def workload_tools(configs: list[Configuration]) -> list[Tool]:
    """The binaries the run needs: the lab's own and every workload's (each with its Debian package)."""
    from vnetbench.workloads import registry

    # pinning; the lab and its TCP metrics; the servers' readiness check; the path check
    tools = [TASKSET, IP, SS, PING]
    for c in configs:
        for w in c.scenario.active.values():
            tools.extend(registry.of(w).requires)
    return list(dict.fromkeys(tools))


def leave_out_unavailable(configs: list[Configuration], probe: bool = True
                          ) -> tuple[list[Configuration], list[dict[str, object]]]:
    """(the configurations to run, what was left out): a configuration from an `if_available` matrix entry
    whose environment this machine cannot build, or cannot run its tools in, is left out, with the reason
    per environment (for the console, the run's fingerprint and its report). Refuses when nothing is left."""
    from vnetbench.lab import environments
    from vnetbench.runner.bench import variant_of

    unsure = tools_by_variant([c for c in configs if c.if_available])
    reasons = {}
    for variant, tools in unsure.items():
        found = environments.problems([variant], probe=probe) or environments.tool_problems({variant: tools})
        if found:
            reasons[variant] = "; ".join(found)
    if not reasons:
        return configs, []
    kept = [c for c in configs if not (c.if_available and variant_of(c) in reasons)]
    left_out = [{"environment": str(variant), "reason": reason,
                 "configurations": sum(1 for c in configs if c.if_available and variant_of(c) == variant)}
                for variant, reason in reasons.items()]
    if not kept:
        raise EnvironmentProblem("every configuration of this scenario is marked if_available, and this machine "
                                 "has none of them (nothing was built):\n  " + "\n  ".join(reasons.values()))
    return kept, left_out


def preflight(configs: list[Configuration]) -> None:
    from vnetbench.impair import links
    from vnetbench.lab import environments

    check_root()
    require(workload_tools(configs))
    check_congestion_controls(configs)
    # before anything is built: every environment exists here, and runs every tool its workloads need
    tools = tools_by_variant(configs)
    environments.check(list(tools), tools)
    links.preflight(configs)  # link backends: explicit ones can do what is asked here; vnb-link is built
