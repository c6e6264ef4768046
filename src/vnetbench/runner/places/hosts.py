"""Real hosts over SSH (`--hosts INVENTORY`): the endpoints are the machines the scenario's ``[hosts]`` table
names in an Ansible inventory (runner/hosts_bench.py says how a run uses them).

Preparing resolves the placement and checks every host at once over SSH (reachable, authenticated, every
tool, root and qdiscs where link conditions go); holding takes each host's run lock and only then reads what
another run could be changing (interfaces, clocks, fingerprints).
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.markup import escape

from vnetbench.errors import VnetbenchError
from vnetbench.runner.places.base import Place

# What reaches and runs on the hosts is imported where it is used: every command builds its parser from the
# places (runner/places/lab.py).
if TYPE_CHECKING:
    from vnetbench.hosts.ssh import HostAccess
    from vnetbench.runner import hosts_bench
    from vnetbench.scenario.load import LoadedScenario
    from vnetbench.scenario.plan import Configuration


class HostsPlace(Place):
    """The inventory's hosts, reached through `access`."""

    name = "hosts"

    def __init__(self, access: HostAccess):
        from vnetbench.hosts.lock import HostLocks

        self.access = access
        self.place: hosts_bench.Placement | None = None
        self.host_facts: dict[str, dict[str, Any]] = {}
        self.locks = HostLocks()

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, command: str) -> None:
        help_text = {
            "run": "run the endpoints on the real hosts of an Ansible inventory (YAML or INI), over SSH, as the "
                   "scenario's [hosts] table places them, instead of in the local lab",
            "doctor": "check the hosts of an Ansible inventory (YAML or INI) over SSH instead of this machine; "
                      "nothing is started or changed on them",
            "clean": "clean the hosts of an Ansible inventory over SSH instead of this machine: work directories "
                     "and link-condition steering (IFBs, clsact qdiscs) of killed runs",
        }[command]
        parser.add_argument("--hosts", metavar="INVENTORY", help=help_text)
        if command == "doctor":
            parser.add_argument("--limit", metavar="HOST|GROUP", action="append",
                                help="with --hosts: only these hosts or groups (repeatable)")
        parser.add_argument("--accept-new-host-keys", action="store_true",
                            help="with --hosts: add the host key of a host not yet in known_hosts (trust on first "
                                 "use); a changed key is still refused")
        parser.add_argument("--ssh-config", metavar="FILE",
                            help="with --hosts: this ssh client config instead of ~/.ssh/config (ssh -F)")
        parser.add_argument("--connect-timeout", type=float, default=10, metavar="SECONDS",
                            help="with --hosts: how long to wait for each host to answer (default 10)")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "HostsPlace | None":
        """The place when --hosts is given; the inventory is read here, so that a bad one is named before
        anything else happens."""
        if not getattr(args, "hosts", None):
            if getattr(args, "accept_new_host_keys", False) or getattr(args, "ssh_config", None):
                raise VnetbenchError("--accept-new-host-keys and --ssh-config go with --hosts INVENTORY")
            return None
        from vnetbench.hosts import inventory
        from vnetbench.hosts.ssh import HostAccess

        if args.ssh_config and not Path(args.ssh_config).is_file():
            raise VnetbenchError(f"--ssh-config {args.ssh_config}: no such file")
        return cls(HostAccess(inventory.load(args.hosts), accept_new_host_keys=args.accept_new_host_keys,
                              ssh_config=args.ssh_config, connect_timeout=args.connect_timeout))

    def prepare(self, loaded: LoadedScenario, configs: list[Configuration]
                ) -> tuple[list[Configuration], list[dict[str, object]]]:
        from vnetbench.runner import hosts_bench
        from vnetbench.runner.hosts_topology import topology_placement

        # Where each endpoint runs, checked against the scenario, then every host over SSH, all before anything is
        # stored or started anywhere.
        place = topology_placement if configs[0].scenario.topology is not None else hosts_bench.placement
        self.place = place(configs, self.access.inventory, loaded.source)
        self.host_facts = hosts_bench.check_hosts(self.place, hosts_bench.needed_tools(configs), self.access.connect,
                                                  rate_qdisc=configs[0].scenario.lab.qdisc)
        return configs, []

    def hold(self, run_id: str, scenario: str) -> None:
        # One run measures on each host at a time, whatever its controller; what another run may be changing
        # (interfaces, clocks) is read only once the locks are held.
        from vnetbench.hosts.lock import holder_line, lock_hosts
        from vnetbench.runner import hosts_bench

        self.locks = lock_hosts(self.place.hosts, self.access.connect, holder_line(run_id, scenario))
        self.host_facts = hosts_bench.survey_hosts(self.place, self.access.connect, self.host_facts)

    def release(self) -> None:
        self.locks.release()

    def facts(self) -> dict[str, Any]:
        return {"hosts": self.host_facts, "inventory": str(self.access.inventory.path)}  # as this session found

    def bench(self, run_prefix: str, configs: list[Configuration]) -> hosts_bench.HostsBench:
        from vnetbench.runner import hosts_bench
        from vnetbench.runner.hosts_topology import HostsTopologyBench

        if self.place.nodes:  # a declared topology's host nodes on the hosts
            bench: hosts_bench.HostsBench = HostsTopologyBench.for_topology(run_prefix, configs, self.place,
                                                                            self.access.connect, self.host_facts)
        else:
            bench = hosts_bench.HostsBench.for_hosts(run_prefix, configs, self.place, self.access.connect,
                                                     self.host_facts)
        bench.relock = self.locks.retake
        return bench

    def doctor(self, args: argparse.Namespace) -> int:
        """Preflight of the inventory's hosts over SSH; 1 when any host lacks something every run needs."""
        from vnetbench.cli_common import out
        from vnetbench.hosts import preflight

        inv = self.access.inventory
        hosts = inv.resolve(args.limit) if args.limit else list(inv.hosts.values())
        if not hosts:
            raise VnetbenchError(f"{inv.path}: the inventory has no hosts")
        reports = preflight.check_hosts(hosts, self.access.connect)
        out.print(preflight.table(reports))
        for line in preflight.fixes(reports):
            out.print(f"[dim]->[/] {escape(line)}")
        lacking = [r.host.name for r in reports if r.lacking]
        out.print(f"{len(reports) - len(lacking)} of {len(reports)} hosts ready"
                  + (f"; not ready: {escape(', '.join(lacking))}" if lacking else ""))
        return 1 if lacking else 0

    def clean(self, args: argparse.Namespace) -> int:
        """What killed runs left on the inventory's hosts (their work directories, the steering of link
        conditions), removed; --check and --dry-run only say what is there."""
        from vnetbench import runlock
        from vnetbench.cli_common import err, out
        from vnetbench.hosts.clean import clean_hosts
        from vnetbench.lab.netns import run_prefix

        if args.run or args.images:
            raise VnetbenchError("--run and --images are for this machine's leftovers; `clean --hosts` cleans every "
                                 "run's on the hosts")
        hosts = list(self.access.inventory.hosts.values())
        live = runlock.live_runs()
        skip = tuple(run_prefix(r.run_id) for r in live)
        for run in live:
            out.print(f"left alone: what {escape(run.describe())} uses on the hosts", soft_wrap=True)
        reports = clean_hosts(hosts, self.access.connect, skip, dry_run=args.dry_run or args.check)
        verb = "left behind" if args.check else "would remove" if args.dry_run else "removed"
        found = False
        for r in reports:
            items = r.found.items() if r.found else []
            found = found or bool(items)
            if items:
                out.print(f"{escape(r.host)}: {verb} {', '.join(map(escape, items))}", soft_wrap=True)
            if r.busy:
                out.print(f"{escape(r.host)}: left alone: {escape(r.busy)}", soft_wrap=True)
            for e in r.errors:
                err.print(f"[red]{escape(r.host)}:[/] {escape(e)}", soft_wrap=True)
        if not found and not any(r.errors or r.busy for r in reports):
            out.print(f"nothing of vnetbench's is left on {len(hosts)} hosts of "
                      f"{escape(str(self.access.inventory.path))}", soft_wrap=True)
        return 1 if any(r.errors for r in reports) or (args.check and found) else 0

    def resume_args(self) -> str:
        return f" --hosts {shlex.quote(str(self.access.inventory.path))}"

    def clean_command(self) -> str:
        return f"vnetbench clean --hosts {shlex.quote(str(self.access.inventory.path))}"
