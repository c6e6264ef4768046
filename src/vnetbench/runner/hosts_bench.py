"""A run on real hosts over SSH (`vnetbench run SCENARIO --hosts INVENTORY`): the same trials as in the lab,
on the machines the scenario's ``[hosts]`` table names.

Nothing is built: the endpoints are the hosts as they are, reached through one multiplexed SSH connection
each (:mod:`vnetbench.hosts.ssh`), and every workload runs there through :class:`vnetbench.hosts.node.SshNode`.
What a run leaves on a host is registered before it is made and removed at teardown: the run's work
directory (servers' files), and every process, which ends with its local ssh client.

Link conditions go on a host's interface only where the inventory opts it in (``vnetbench_shape_interfaces``),
steered into IFBs of the run's so that the interface's own qdisc and the host's other traffic are untouched
(:mod:`vnetbench.hosts.shaping`). Offloads go off only on the interfaces the inventory opts in (``HostOffload``); environments that need the
local lab (an `env` other than bare) are refused before anything starts.
"""

from __future__ import annotations

import ipaddress
import shlex
import shutil
import socket
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

from vnetbench.errors import EnvironmentProblem, HostError, HostsGone, ScenarioError
from vnetbench.hosts import preflight as host_preflight
from vnetbench.hosts import shaping
from vnetbench.hosts.inventory import Inventory, InventoryHost
from vnetbench.hosts.node import STAMP, SshNode
from vnetbench.hosts.ssh import SshConnection
from vnetbench.impair import backends as B
from vnetbench.impair.links import LinkManager
from vnetbench.impair.model import LinkSpec, lab_links
from vnetbench.lab.environments import Variant
from vnetbench.lab.teardown import Registry
from vnetbench.lab.topology import Group, Lab
from vnetbench.runner.bench import DumbbellBench, TrialOutcome
from vnetbench.runner.fingerprint import SYSCTLS
from vnetbench.runner.recorders import LinkRecorder, MachinesCpuRecorder, Recorder
from vnetbench.scenario.model import HostsSpec
from vnetbench.scenario.plan import Configuration
from vnetbench.workloads import registry as workloads
from vnetbench.tools import ETHTOOL, FLOCK, IP, PING, SS, TC, Tool
from vnetbench.workloads.base import Measurement, Started, TrialContext

BARE = Variant("bare")
# How long before they begin the clients of a trial are started on their hosts, to begin together (see
# HostsBench.clients_start_together): twice the slowest host's command round trip, and a few ms for each
# client the controller forks, within these bounds.
START_LEAD_MIN_S, START_LEAD_MAX_S, START_LEAD_PER_CLIENT_S = 0.02, 0.5, 0.005


@dataclass
class Placement:
    """Which inventory host each endpoint is, and the address its peers send to. On the dumbbell the endpoints
    are the receiver and the senders, named after their hosts; on a declared topology (`nodes`), its host
    nodes, each on the host hosts.nodes gives it (runner/hosts_topology.py)."""

    receiver: InventoryHost | None
    senders: list[InventoryHost]
    addresses: dict[str, str]  # host name -> the address workloads use (resolved to an IP)
    ip_version: int = 4
    shaped: dict[str, dict[str, list[LinkSpec]]] = field(default_factory=dict)  # host -> its links' conditions
    # Found by check_hosts, once connected: the interface each shaped host's conditions go on, and the backend
    # (tbf, htb, netem) each link's conditions are made with there.
    interfaces: dict[str, shaping.InterfaceFacts] = field(default_factory=dict)
    backends: dict[str, str] = field(default_factory=dict)
    named: dict[str, str] = field(default_factory=dict)  # hosts.interfaces: host -> the interface it must use
    offload_hosts: list[str] = field(default_factory=list)  # hosts whose data interface's offloads a run sets
    # hosts.addresses: host -> the address the scenario gives it, checked to be on one of its interfaces
    # (check_hosts). The inventory's are the user's own, and may be a NAT's or a load balancer's: not checked.
    given: dict[str, str] = field(default_factory=dict)
    # A declared topology's: host node -> the inventory host it runs on (the workloads' nodes only), and per
    # host whether its link's forward direction leaves it (the host is the link's a end).
    nodes: dict[str, InventoryHost] = field(default_factory=dict)
    outward: dict[str, bool] = field(default_factory=dict)

    def changes(self, host: str) -> bool:
        """Whether the run changes something on `host`'s data interface (link conditions, offloads)."""
        return host in self.shaped or host in self.offload_hosts

    @property
    def endpoints(self) -> dict[str, InventoryHost]:
        """Endpoint name -> its host: the dumbbell's are named after their hosts, a topology's after its nodes."""
        if self.nodes:
            return dict(self.nodes)
        assert self.receiver is not None
        return {h.name: h for h in (self.receiver, *self.senders)}

    @property
    def hosts(self) -> list[InventoryHost]:
        return list(self.endpoints.values())

    def peers(self, host: str) -> list[str]:
        """The addresses whose traffic with `host` its link carries: on the dumbbell the senders' for the
        receiver, the receiver's for a sender; on a topology every other endpoint's (a host's one link carries
        all it exchanges)."""
        if self.nodes:
            return [self.addresses[h.name] for h in self.hosts if h.name != host]
        assert self.receiver is not None
        if host == self.receiver.name:
            return [self.addresses[s.name] for s in self.senders]
        return [self.addresses[self.receiver.name]]

    def upstream(self, host: str, link: str) -> bool:
        """Whether `link`'s forward direction leaves `host` (its egress): a dumbbell sender's link does, the
        bottleneck enters the receiver; a topology's link leaves its a end."""
        return self.outward[host] if self.nodes else link != "bottleneck"


def hosts_table(configs: list[Configuration], inventory: Inventory, source: str) -> HostsSpec:
    """The scenario's `[hosts]` table; a ScenarioError saying what to write when it has none."""
    spec = configs[0].scenario.hosts
    if spec is None:
        example = ("hosts.nodes = {NODE = \"server-a\", ...}" if configs[0].scenario.topology is not None else
                   "[hosts] receiver = \"server-a\", senders = [\"client-1\"] (or --set hosts.receiver=NAME "
                   "--set hosts.senders=[NAME])")
        raise ScenarioError(f"{source}: --hosts {inventory.path} needs a [hosts] table in the scenario naming where "
                            f"the endpoints run, e.g. {example}; hosts: {', '.join(inventory.hosts) or '(none)'}")
    return spec


def placement(configs: list[Configuration], inventory: Inventory, source: str) -> Placement:
    """The scenario's `[hosts]` resolved against the inventory, and everything a host run cannot do checked,
    before any connection is made (a declared topology's: runner/hosts_topology.topology_placement). Raises
    ScenarioError naming the key and what to change."""
    spec = hosts_table(configs, inventory, source)
    receivers = inventory.resolve(spec.receiver)  # type: ignore[arg-type]  # the dumbbell's: the model checked it
    if len(receivers) != 1:
        raise ScenarioError(f"{source}: hosts.receiver = {spec.receiver!r} names {len(receivers)} hosts "
                            f"({', '.join(h.name for h in receivers)}); name one")
    senders = inventory.resolve(spec.senders)
    if receivers[0] in senders:
        raise ScenarioError(f"{source}: hosts.senders includes the receiver {receivers[0].name!r}: a host is one "
                            "endpoint")
    needed = max(c.active_senders for c in configs)
    if needed > len(senders):
        raise ScenarioError(f"{source}: the scenario uses {needed} senders but hosts.senders names "
                            f"{len(senders)} ({', '.join(h.name for h in senders)}): add hosts, or set lab.senders")
    for key in ("addresses", "interfaces"):
        unknown = sorted(set(getattr(spec, key)) - {h.name for h in [*receivers, *senders]})
        if unknown:
            raise ScenarioError(f"{source}: hosts.{key} names {', '.join(map(repr, unknown))}, which is no endpoint "
                                "of this scenario")
    for c in configs:
        problems = lab_problems(c)
        if problems:
            raise ScenarioError(f"{source} [configuration {c.label_text}]: with --hosts, " + "; ".join(problems))
    ip_version = configs[0].scenario.lab.ip_version
    shaped = shaping.links_by_host(configs, lambda c: shaping.dumbbell_carriers(
        receivers[0].name, [h.name for h in senders[:needed]], c.active_senders))
    return completed(Placement(receivers[0], senders[:needed], {}, ip_version, shaped), configs, inventory, source)


def completed(place: Placement, configs: list[Configuration], inventory: Inventory, source: str) -> Placement:
    """`place` (its endpoints and their link conditions) completed with what every place on hosts checks the
    same way: each host whose interface the run changes (link conditions; offloads off, which change every
    endpoint's) opted in by the inventory, the addresses the peers send to, the interfaces hosts.interfaces
    names. Raises ScenarioError naming the host and the inventory key."""
    spec = configs[0].scenario.hosts
    assert spec is not None
    chosen = place.hosts
    offload_off = any(c.scenario.lab.offload == "off" for c in configs)
    for host in chosen:
        problem = (shaping.opt_in_problem(host, inventory.path, shaping.conditions_on(host.name,
                                                                                      place.shaped[host.name]))
                   if host.name in place.shaped else None)
        if problem is None and offload_off:
            problem = shaping.opt_in_problem(host, inventory.path, f'offloads off (lab.offload = "off") on {host.name}')
        if problem:
            raise ScenarioError(f"{source}: {problem}")
    place.addresses = {h.name: _ip_of(h, spec.addresses.get(h.name), place.ip_version, source) for h in chosen}
    place.named = {h.name: spec.interfaces[h.name] for h in chosen if h.name in spec.interfaces}
    place.offload_hosts = [h.name for h in chosen] if offload_off else []
    place.given = {h.name: place.addresses[h.name] for h in chosen if h.name in spec.addresses}
    return place


def lab_problems(config: Configuration) -> list[str]:
    lab = config.scenario.lab
    problems = []
    if lab.env != "bare":
        problems.append(f"lab.env = {lab.env!r} needs the local lab: the hosts run the workloads as they are "
                        "(remove env, or run without --hosts)")
    for name, spec in lab_links(lab).items():
        problem = shaping.lab_only_problem(name, spec)
        if problem:
            problems.append(problem)
    return problems


def _ip_of(host: InventoryHost, given: str | None, ip_version: int, source: str) -> str:
    """The address a host's peers send to: hosts.addresses, else the inventory's, resolved here (as the
    tools take addresses, and one resolution for every sender) to the scenario's IP version."""
    name = given or host.address
    try:
        ip = ipaddress.ip_address(name)
        if ip.version != ip_version:
            raise ScenarioError(f"{source}: {host.name}'s address {name} is IPv{ip.version} but lab.ip_version = "
                                f"{ip_version}: give hosts.addresses.{host.name} an IPv{ip_version} address")
        return str(ip)
    except ValueError:
        pass
    family = socket.AF_INET6 if ip_version == 6 else socket.AF_INET
    try:
        return socket.getaddrinfo(name, None, family, socket.SOCK_STREAM)[0][4][0]
    except OSError as e:
        raise ScenarioError(f"{source}: {host.name}'s address {name!r} does not resolve to an IPv{ip_version} "
                            f"address here ({e}): give hosts.addresses.{host.name} = \"IP\"") from None


def needed_tools(configs: list[Configuration]) -> list[Tool]:
    """What the hosts must have: every workload's binaries, ss (servers are checked listening with it), flock
    (each host's run lock, hosts/lock.py), ping (the path check before trials) and ip (TCP's per-destination
    metrics are flushed before every trial)."""
    tools = [SS, FLOCK, PING, IP]
    if any(not spec.is_plain() for c in configs for spec in lab_links(c.scenario.lab).values()):
        tools.append(TC)  # link conditions: tc on the hosts that carry them
    if any(c.scenario.lab.offload == "off" for c in configs):
        tools.append(ETHTOOL)  # offloads turned off and back on
    for c in configs:
        for w in c.scenario.active.values():
            tools.extend(workloads.of(w).requires)
    return list(dict.fromkeys(tools))


def check_hosts(place: Placement, tools: list[Tool], connect: Callable[[InventoryHost], SshConnection],
                rate_qdisc: str = "tbf") -> dict[str, dict[str, str]]:
    """Preflight of every host at once, before anything starts anywhere: reachable, host key known,
    authenticated, every tool of the scenario present, each address hosts.addresses gives on its host; where
    link conditions go, root and the qdiscs they need
    (the backend of each link, recorded in `place`). Raises EnvironmentProblem naming each host's lack and its
    fix; returns each host's findings (kernel, CPUs, tool versions...) for the run's fingerprint. What
    depends on the hosts' state (interfaces, clocks) is `survey_hosts`, once the run holds their locks."""
    reports = host_preflight.check_hosts(place.hosts, connect, tools, place.given)
    wanted = {f"tool {t.command}" for t in tools}
    lacking = []
    for r in reports:
        shaped = r.host.name in place.shaped
        before = len(lacking)
        for c in r.checks:
            # root only where its interface is changed (link conditions, offloads): nothing else changes a host
            needed = c.name != "privileges" or place.changes(r.host.name)
            if not c.ok and needed and (c.needed or c.name in wanted):
                lacking.append(f"{r.host.name}: {c.name}: {c.detail}" + (f" -> {c.fix}" if c.fix else ""))
        if shaped and len(lacking) == before:  # reachable and able: which qdiscs its links get
            qdiscs = {kind: None if ok else detail for kind, ok, detail in
                      ((c.name.split()[1], c.ok, c.detail) for c in r.checks if c.name.startswith("qdisc "))}
            for name, specs in place.shaped[r.host.name].items():
                try:
                    choice = shaping.host_backend(name, specs, qdiscs, rate_qdisc, f"{r.host.name}: ")
                except (HostError, EnvironmentProblem, ScenarioError) as e:
                    lacking.append(str(e))
                    continue
                if choice:
                    place.backends[name] = choice
    if lacking:
        raise EnvironmentProblem("the hosts cannot run this scenario (nothing was started on any host):\n  "
                                 + "\n  ".join(lacking))
    return {r.host.name: {c.name: c.detail for c in r.checks} for r in reports}


def survey_hosts(place: Placement, connect: Callable[[InventoryHost], SshConnection],
                 found: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Once the run holds the hosts' locks (what another run has made there is not this run's to judge):
    the interface each shaped host's conditions go on, checked (opted in, no clsact of someone else's), and
    every host's fingerprint (CPU, sysctls, its interface's driver, offloads and qdisc) and clock offset. Raises EnvironmentProblem naming each problem; returns `found` with both."""
    lacking = []
    for host in place.hosts:
        with connect(host) as conn:
            try:
                if place.changes(host.name):
                    place.interfaces[host.name] = shaping.interface_facts(conn, place.peers(host.name),
                                                                          place.named.get(host.name))
                    found[host.name]["shaped interface"] = place.interfaces[host.name].record()
                elif host.name in place.named:  # checked against its routes, as a shaped one's
                    shaping.route_interface(conn, place.peers(host.name), place.named[host.name])
            except HostError as e:
                lacking.append(str(e))
            found[host.name].update(host_preflight.fingerprint(conn, place.peers(host.name)[0], SYSCTLS))
            found[host.name]["clock"] = clock_offset(conn)
    if lacking:
        raise EnvironmentProblem("the hosts cannot run this scenario (nothing was started on any host):\n  "
                                 + "\n  ".join(lacking))
    return found


CLOCK_SAMPLES = 8


def machine_id(conn: Any, name: str) -> str:
    """The machine a host (or a pod: anything with ``run(argv)``) is, as far as its CPUs go: its kernel's boot
    id (hosts that are containers or namespaces of one machine share it); the host's own name where it cannot
    be read."""
    done = conn.run(["cat", "/proc/sys/kernel/random/boot_id"])
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else name


# A host's wall clock, in seconds; a node's uptime (the clock its pods' CPU samplers stamp with: busybox's date,
# the tools image's, has whole seconds only).
WALL_CLOCK = ("date", "+%s.%N")
UPTIME_CLOCK = ("cat", "/proc/uptime")


def clock_offset(conn: Any, samples: int = CLOCK_SAMPLES, clock: Sequence[str] = WALL_CLOCK) -> dict[str, Any]:
    """The host's clock minus the controller's, as NTP estimates it: the host's time (`clock`'s first word,
    read through ``conn.run``: an SSH connection, a pod) is read between two local readings t0 and t1, so it
    is (t0 + t1) / 2 give or take half the round trip; the sample with the shortest round trip bounds it best.
    Over SSH a round trip is a few ms (a channel, a fork on the host), which is the stored `uncertainty_ms`;
    one-way delays need clocks far closer than that (PTP, or NTP on the hosts' own network), which this
    measures only the upper bound of."""
    best: tuple[float, float] | None = None
    trips = []
    for _ in range(samples):
        t0 = time.time()
        done = conn.run(list(clock))
        t1 = time.time()
        trips.append(t1 - t0)
        try:
            remote = float(done.stdout.split()[0])
        except (ValueError, IndexError):
            return {"offset_ms": None, "uncertainty_ms": None,
                    "note": f"`{' '.join(clock)}` printed {done.stdout.strip()[:40]!r} (a date without %N?)"}
        if best is None or t1 - t0 < best[1]:
            best = (remote - (t0 + t1) / 2, t1 - t0)
    offset, rtt = best
    # The median round trip is what starting a command there takes (a session opened, a process forked): it
    # sizes how far ahead a trial's clients are started to begin together (HostsBench.clients_start_together).
    return {"offset_ms": round(offset * 1e3, 3), "uncertainty_ms": round(rtt / 2 * 1e3, 3), "samples": samples,
            "session_ms": round(sorted(trips)[len(trips) // 2] * 1e3, 3)}


@dataclass
class HostsBench(DumbbellBench):
    """The lab's bench with real hosts for endpoints: one variant (the hosts as they are), link
    conditions on the interfaces the inventory opts in (HostLinkManager), servers in a work directory of the run's
    on each host."""

    place: Placement | None = None
    connect: Callable[[InventoryHost], SshConnection] | None = None
    host_facts: dict[str, dict[str, str]] = field(default_factory=dict)
    remote_workdir: str = ""
    wait_for_host: float = 30.0
    offloads: dict[str, shaping.HostOffload] = field(default_factory=dict)  # host -> its data interface's
    machine_of: dict[str, str] = field(default_factory=dict)  # host -> its machine (boot id): CPUs counted once
    _offload_on: bool | None = True  # the hosts' offloads now: their own (True), off, or unknown (None)
    _offload_state: list[dict[str, Any]] = field(default_factory=list)  # as the hosts read them back
    # Called with the names of hosts that dropped out and came back (the run's locks there went with their
    # sessions): takes them again, or raises.
    relock: Callable[[list[str]], None] | None = None
    _dropped: dict[str, str] = field(default_factory=dict)  # host -> why, after the last failed trial

    @classmethod
    def for_hosts(cls, run_prefix: str, configs: list[Configuration], place: Placement,
                  connect: Callable[[InventoryHost], SshConnection],
                  host_facts: dict[str, dict[str, str]]) -> "HostsBench":
        return cls(run_prefix, senders=len(place.senders), pin_cpus=False, variants=[(BARE, len(place.senders))],
                   configs=list(configs), place=place, connect=connect, host_facts=host_facts,
                   remote_workdir=f"/tmp/{run_prefix}",
                   wait_for_host=spec.wait_for_host if (spec := configs[0].scenario.hosts) else 30.0)

    def setup(self) -> None:
        registry = Registry()
        registry.add(f"work directory {self.workdir}", lambda: shutil.rmtree(self.workdir, ignore_errors=True))
        self.lab = self._lab(registry)
        ip_version = self.configs[0].scenario.lab.ip_version
        host_links: dict[str, shaping.HostLink] = {}  # endpoint -> the link it carries
        for endpoint, host in self.place.endpoints.items():
            conn = self.connect(host)
            registry.add(f"ssh connection to {host.name}", conn.close)
            self._make_workdir(conn, registry)
            if host.name in self.place.offload_hosts:
                self.offloads[host.name] = shaping.HostOffload(conn, self.place.interfaces[host.name].name,
                                                               self.remote_workdir, registry)
            for link_name in self.place.shaped.get(host.name, {}):  # the host's one link: its endpoint's
                host_links[endpoint] = shaping.HostLink(
                    link_name, conn, self.place.interfaces[host.name], self.place.peers(host.name), ip_version,
                    self.run_prefix, registry, host_upstream=self.place.upstream(host.name, link_name))
            address = self.place.addresses[host.name]
            # the interface its traffic uses: the shaped one, else the one named, else the route's (as surveyed:
            # "eth1 (driver virtio_net, mtu 1500)")
            iface = self.place.interfaces.get(host.name)
            routed = str(self.host_facts.get(host.name, {}).get("interface") or "").split(" ")[0] or None
            node = SshNode(endpoint, conn, registry, ipv4=address if ip_version == 4 else "",
                           ipv6=address if ip_version == 6 else "", facts=self.host_facts.get(host.name),
                           interface=iface.name if iface is not None else self.place.named.get(host.name, routed))
            clock = self.host_facts.get(host.name, {}).get("clock") or {}
            node.offset_s = (clock.get("offset_ms") or 0.0) / 1e3
            self.lab.endpoints[endpoint] = node
            self.machine_of[endpoint] = machine_id(conn, host.name)
        self._groups()
        self.lab.bringup_s[BARE] = 0.0
        self.links = HostLinkManager(self.lab, registry, self.workdir, self.run_prefix, auto=dict(self.place.backends),
                                     host_links=host_links)
        self.start_servers()

    def _lab(self, registry: Registry) -> Lab:
        """The lab as the link manager sees it: the dumbbell's (the bottleneck at the receiver, sN at the Nth
        sender)."""
        return Lab(self.run_prefix, registry)

    def _groups(self) -> None:
        """The endpoints' groups: the dumbbell's one (its receiver and senders)."""
        assert self.lab is not None and self.place.receiver is not None
        self.lab.groups[BARE] = Group(BARE, "", None, self.place.receiver.name, [h.name for h in self.place.senders])

    def _make_workdir(self, conn: SshConnection, registry: Registry) -> None:
        # mkdir (not -p) with mode 0700, so only this user can use it; what was there already is taken only
        # when it is a real directory of this user's (hosts that share /tmp, as the tests' namespaces do),
        # never a planted symlink. Registered before it is made: removing what does not exist is harmless.
        path = self.remote_workdir
        registry.add(f"work directory {path} on {conn.host.name}", lambda: _remove_dir(conn, path))
        done = conn.run(["sh", "-c", 'mkdir -m 0700 -- "$1" || { [ -d "$1" ] && [ ! -L "$1" ] && [ -O "$1" ]; }',
                         "sh", path])
        if done.returncode != 0:
            raise HostError(f"{conn.where()}: cannot make the run's work directory {path}: "
                                     f"{done.stderr.strip() or f'exit status {done.returncode}'}",
                                     "if a killed run left it, `vnetbench clean` on that host removes it "
                                     f"(or `rm -r {shlex.quote(path)}` there)")

    @property
    def server_workdir(self) -> str:
        return self.remote_workdir

    # ---------------------------------------------------------------- clients that start together

    @contextmanager
    def clients_start_together(self, ctx: TrialContext) -> Iterator[list[float]]:
        """With several senders, the leader's clients wait on their hosts for one instant, far enough ahead
        (start_lead) for every ssh session to open, so that none begins late; with one, it begins at once."""
        if len(ctx.endpoints.senders) < 2:
            yield [0.0]
            return
        nodes = [ctx.endpoints.receiver, *ctx.endpoints.senders]
        lead = self.start_lead(nodes)
        at = time.time() + lead
        for node in nodes:
            node.start_at = at
        try:
            yield [lead]
        finally:
            for node in nodes:
                node.start_at = None

    def start_lead(self, nodes: list[SshNode]) -> float:
        slowest = max(((self.host_facts.get(n.conn.host.name, {}).get("clock") or {}).get("session_ms") or 50.0)
                      for n in nodes) / 1e3
        lead = 2 * slowest + START_LEAD_PER_CLIENT_S * len(nodes)
        return min(START_LEAD_MAX_S, max(START_LEAD_MIN_S, lead))

    def start_spread(self, runs: list[tuple[str, Started]]) -> float | None:
        """The leader's client starts, as their hosts stamped them (START_AT) and put on the controller's clock
        with each host's offset: last minus first, in ms (None for a single client). The stamps are taken out
        of the clients' standard error, which is the tools' own again."""
        if not runs:
            return None
        _, leader = runs[0]
        starts = []
        for label, out in leader.outputs.items():
            err = out.with_suffix(".err")
            try:
                lines = err.read_text(errors="replace").splitlines(keepends=True)
            except OSError:
                continue
            stamps = [ln for ln in lines if ln.startswith(STAMP)]
            if not stamps:
                continue
            err.write_text("".join(ln for ln in lines if not ln.startswith(STAMP)))
            node = self.lab.endpoints.get(label)
            try:
                stamp = stamps[0][len(STAMP):].strip().replace(",", ".")  # bash's locale may write a comma
                starts.append(float(stamp) - (node.offset_s if node else 0.0))
            except ValueError:
                continue
        if len(starts) < 2:
            return None
        return (max(starts) - min(starts)) * 1e3

    # ---------------------------------------------------------------- a host that drops out

    def run_trial(self, config: Configuration, trial_tag: str) -> TrialOutcome:
        """The lab's trial; when it fails, whether a host dropped out is asked, and the reason says so."""
        try:
            outcome = super().run_trial(config, trial_tag)
        except HostError as e:  # a host went while its servers were restarted after the trial
            now = time.time()
            outcome = TrialOutcome("failed", str(e), now, now, Measurement(), {})
        if outcome.status != "ok":
            self._dropped = self.unreachable()
            if self._dropped:
                gone = "; ".join(f"{h} dropped out: {why}" for h, why in self._dropped.items())
                outcome.reason = f"{gone}; the trial: {outcome.reason}"
        return outcome

    def unreachable(self) -> dict[str, str]:
        """host -> why, for each host that does not answer over ssh now."""
        out = {}
        for node in self.lab.endpoints.values():
            try:
                node.conn.run(["true"], timeout=node.conn.connect_timeout + 5)
            except HostError as e:
                out[node.conn.host.name] = e.reason.removeprefix(f"{node.conn.where()}: ")
        return out

    def after_trial(self, outcome: TrialOutcome) -> None:
        """After a trial a host dropped out of: wait up to wait_for_host for every host to answer again, then
        take its lock again, and bring back what the run had there (work directory, servers, link
        conditions); raises HostsGone when a host stays away."""
        if not self._dropped:
            return
        dropped, self._dropped = self._dropped, {}
        deadline = time.monotonic() + self.wait_for_host
        while True:
            away = self.unreachable()
            if not away:
                break
            if time.monotonic() >= deadline:
                raise HostsGone(f"{', '.join(away)} dropped out and did not answer again within "
                                f"{self.wait_for_host:g} s (hosts.wait_for_host): {'; '.join(away.values())}")
            time.sleep(min(2.0, max(0.1, deadline - time.monotonic())))
        if self.relock is not None:
            self.relock(sorted(dropped))
        for node in self.lab.endpoints.values():
            if node.conn.host.name in dropped:
                self._make_workdir(node.conn, self.lab.registry)
        self.links.forget()  # a host that restarted lost its qdiscs: every link's conditions again
        self._offload_on = None  # and its offloads are its own again, or still off: set them at the next one
        self.start_servers()

    def _realise(self, config: Configuration) -> bool:
        """The configuration's link conditions on the hosts that carry them (nothing on the others), and its
        offloads; whether anything changed. The qdiscs as the hosts' kernels report them are the lab state."""
        on = config.scenario.lab.offload == "on"
        changed = False
        if on != self._offload_on:
            self._offload_state = [o.set(on) for o in self.offloads.values()]
            self._offload_on = on
            changed = True
        state = self.links.apply(config, self.flows(config))
        self.lab_state = state["qdiscs"]
        return changed or self.links.changed

    def _group_offload_unknown(self, config: Configuration) -> None:
        self._offload_on = None

    def recorders(self, group: Group) -> list[Recorder]:
        """The links' counters, and the CPUs of the hosts' machines, sampled there (this machine's are not
        theirs)."""
        assert self.lab is not None
        return [LinkRecorder(self.links),
                MachinesCpuRecorder(self.lab.endpoints[group.receiver], [self.lab.endpoints[n] for n in group.senders],
                                    self.machine_of, self.workdir)]

    def variant_name(self, group: Group) -> str:
        return "hosts"  # the one variant: the inventory's hosts, as they are

    def environment_state(self, config: Configuration) -> dict[str, Any]:
        group = self.group(config)
        used = dict.fromkeys(n for receiver, senders in self.flows(config) for n in (receiver, *senders))
        hosts = {n: self.place.endpoints[n].name for n in used}
        return {"environment": {"variant": self.variant_name(group), "env": "bare",
                                "hosts": {n: {**({"host": h} if h != n else {}), "address": self.place.addresses[h],
                                              **self.host_facts.get(h, {})} for n, h in hosts.items()},
                                "offload": (self._offload_state if not self._offload_on and self.offloads
                                            else "the hosts' own settings")}}


@dataclass
class HostLinkManager(LinkManager):
    """The lab's link manager with each link's conditions made on the host that carries it
    (:class:`vnetbench.hosts.shaping.HostLinkBackend`); the backends were chosen by check_hosts from what
    each host's kernel has (`auto`), and a link without conditions in any configuration has no host link:
    nothing on its host is touched."""

    host_links: dict[str, shaping.HostLink] = field(default_factory=dict)  # endpoint -> the link it carries

    def plan(self, configs: list) -> None:
        pass  # chosen per host by check_hosts, before anything started

    def _name_of(self, name: str, spec: LinkSpec, lab: Any) -> str:
        if spec.backend != "auto":
            return spec.backend
        return self.auto.get(name) or lab.qdisc  # a link without conditions anywhere: nothing is made

    def reset_path(self) -> None:
        """Every host link on the path removed (its IFBs and redirects), and made again by the next apply()."""
        for host, target in list(self._targets.items()):
            self._remove(host)
            link = self.host_links.get(host)
            if link is not None:
                link.reset()

    def _plain_problems(self, name: str, host: str) -> list[str]:
        return []  # a link no configuration conditions: nothing of the run's is on its host

    def forget(self) -> None:
        """After a host dropped out: what the run made there may be gone (a restart) or still there (a lost
        session); either way it is removed and made again at the next configuration."""
        for link in self.host_links.values():
            link.reset()
        super().forget()

    def _backend(self, name: str, host: str, backend_name: str, rate_qdisc: str) -> B.Backend:
        current = self.backends.get(host)
        wanted = shaping.HostLinkBackend(self.host_links.get(host), backend_name, rate_qdisc)
        if current is not None and (current.name, current.rate_qdisc) == (wanted.name, wanted.rate_qdisc):
            return current
        if current is not None:
            current.clear()
            self._records.pop(host, None)
        self.backends[host] = wanted
        return wanted


def _remove_dir(conn: SshConnection, path: str) -> None:
    """Remove the run's directory on the host (a HostError when the host is gone: teardown reports it and goes
    on with the others). A server stopped a moment ago may still be writing there until its wrapper's SIGKILL,
    2 s after the SIGTERM: one more try after that."""
    for attempt in range(2):
        done = conn.run(["rm", "-rf", "--", path], timeout=30)
        if done.returncode == 0:
            return
        if attempt == 0:
            time.sleep(2.5)
    raise HostError(f"{conn.where()}: could not remove {path}: {done.stderr.strip()}", f"rm -r {shlex.quote(path)} there")
