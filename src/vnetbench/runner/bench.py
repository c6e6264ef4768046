"""One lab for a whole run, and how a trial runs on it.

The lab's structure (hosts, links) is built once for the run: one receiver and
as many senders as any configuration needs, for every environment variant the
matrix names (``env`` and its options: bare, a container, a VM with e1000, a
routed overlay, ...), all on the same switch. A trial runs on the hosts of its
configuration's variant. What changes between configurations without
rebuilding (the bottleneck's rate and buffer, offloads on or off) is
re-applied before a trial when it differs from what is installed. Building per
trial would add seconds of overhead (a guest boot: many seconds) and no
fidelity.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator

from vnetbench.errors import EnvironmentUnavailable, LabError, PathNotAsDeclared
from vnetbench.impair.links import LinkFailed, LinkManager
from vnetbench.lab.environments import Variant
from vnetbench.lab.netns import WORKDIR_PREFIX
from vnetbench.lab.nodes import NamespaceNode, run_on_each, without_cpu_time
from vnetbench.lab.teardown import Registry, kill_group, poll_metered, stop_groups, wait_metered
from vnetbench.lab.topology import Group, Lab, build_dumbbell
from vnetbench.metrics import QUALIFIER, base_name, qualified
from vnetbench.output import write_bytes
from vnetbench.runner import pathcheck
from vnetbench.runner.recorders import (CpuRecorder, EnvironmentRecorder, GuestsCpuRecorder, LinkRecorder,
                                        QdiscRecorder, Recorder, Window, cpu_inside)
from vnetbench.scenario.plan import Configuration
from vnetbench.topology.fairness import share_fairness
from vnetbench.workloads import ping, registry
from vnetbench.workloads.base import Measurement, ServerSpec, Started, ToolFailed, TrialContext, TrialEndpoints

SERVER_READY_TIMEOUT = 5.0
# How long a trial waits for the connections of the trial before it to end on its servers: their last messages
# queue behind the path's buffers and delays (seconds, on a slow link with a deep buffer). Longer, and a server
# is taken to hang and is started afresh.
SERVER_FREE_TIMEOUT = 30.0
# A TCP socket in these states is a connection its server still holds (established; closed by the client only;
# being accepted). A server that has closed its side (TIME-WAIT, FIN-WAIT-*, LAST-ACK) is free for the next.
HELD_STATES = ("ESTAB", "CLOSE-WAIT", "SYN-RECV")
PATH_CHECK_TIMEOUT = 30.0  # seconds a path probe may take at most (its own deadline is shorter)
# How long the path check waits for a sender's first echo reply before it probes: the kernel's neighbour
# resolution gives up after 3 solicitations a second apart.
NEIGHBOURS_WAIT_S = 3
GUEST_READY_TIMEOUT = 60.0


@dataclass
class TrialOutcome:
    status: str  # ok | failed | timeout
    reason: str | None
    started: float
    ended: float
    measurement: Measurement
    raw: dict[str, Any]


@dataclass
class DumbbellBench:
    run_prefix: str
    senders: int
    mtu: int = 1500
    pin_cpus: bool = True
    variants: list[tuple[Variant, int]] | None = None  # (environment, senders); None: one bare variant
    lab: Lab | None = None
    workdir: Path = None  # type: ignore[assignment]  # made in __post_init__, named after the run
    _qdiscs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # receiver -> kernel's view
    _offload: dict[Variant, list[dict[str, Any]]] = field(default_factory=dict)  # variant -> read-back
    _servers: dict[str, subprocess.Popen] = field(default_factory=dict)  # "<endpoint>:<label>" -> its server
    _server_index: dict[str, int] = field(default_factory=dict)  # "<endpoint>:<label>" -> n of its server-n.out/.err
    _facts: dict[Variant, dict[str, Any]] = field(default_factory=dict)
    lab_state: list[dict[str, Any]] = field(default_factory=list)
    configs: list[Configuration] = field(default_factory=list)  # the run's: link backends are chosen over all
    links: LinkManager | None = None  # link conditions (impair/): tbf/htb, netem or the userspace emulator
    keep_dir: Path | None = None  # where evidence of a variant that did not come up (console logs) is kept
    _unavailable: dict[Variant, tuple[str, dict[str, Any]]] = field(default_factory=dict)  # -> reason, raw
    # the paths (_path_identity) that passed their probe since the lab last changed: configurations that differ only in
    # their workloads (a sweep of rates or protocols) cross the same path, probed once
    _path_checked: set[tuple[Any, ...]] = field(default_factory=set)
    _offload_seen: dict[tuple[Variant, bool], list[dict[str, Any]]] = field(default_factory=dict)  # first read-back
    _offload_problems: dict[Variant, list[str]] = field(default_factory=dict)  # of each variant's last setting

    def __post_init__(self) -> None:
        if self.workdir is None:
            # Named after the run (WORKDIR_PREFIX + its prefix), so `vnetbench clean` finds it when a killed run
            # could not remove it; teardown removes it otherwise.
            self.workdir = Path(tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{self.run_prefix}-"))

    @classmethod
    def for_configs(cls, run_prefix: str, configs: list[Configuration], pin_cpus: bool = True) -> "DumbbellBench":
        """A bench with every environment variant these configurations use, each with as many
        senders as its configurations need."""
        per: dict[Variant, int] = {}
        for c in configs:
            v = variant_of(c)
            per[v] = max(per.get(v, 0), c.active_senders)
        first = next(iter(per))
        return cls(run_prefix, senders=max(per.values()), mtu=first.mtu, pin_cpus=pin_cpus, variants=list(per.items()),
                   configs=list(configs))

    # ------------------------------------------------------------ lifecycle

    def setup(self) -> None:
        registry = Registry()
        registry.add(f"work directory {self.workdir}", lambda: shutil.rmtree(self.workdir, ignore_errors=True))
        self.lab = build_dumbbell(self.run_prefix, self.senders, mtu=self.mtu, pin_cpus=self.pin_cpus,
                                  registry=registry, variants=self.variants, idle_cores=self.idle_cores)
        for group in self.lab.groups.values():
            if group.unavailable is not None:
                self._unavailable[group.variant] = self._keep_evidence(group.unavailable)
        self.links = LinkManager(self.lab, registry, self.workdir, self.run_prefix, mtu=self.mtu)
        if self.configs:
            self.links.plan(self.configs)  # the emulators' cores (endpoints move off them per configuration)
        self.start_servers()

    def _keep_evidence(self, problem: EnvironmentUnavailable) -> tuple[str, dict[str, Any]]:
        """Copy a failed variant's console logs out of the work directory (teardown removes it):
        into ``keep_dir`` and, their last 64 kB, into each of its trials' raw record."""
        kept: dict[str, str] = {}
        texts: dict[str, str] = {}
        for path in problem.evidence:
            path = Path(path)
            if not path.exists():
                continue
            texts[path.name] = path.read_bytes()[-65536:].decode(errors="replace")
            if self.keep_dir is not None:
                self.keep_dir.mkdir(parents=True, exist_ok=True)
                target = self.keep_dir / f"{path.parent.name}-{path.name}"
                write_bytes(target, path.read_bytes(), what="console log")  # replaces, never writes through, a link
                kept[path.name] = str(target)
        reason = str(problem).replace(str(self.workdir), "<work dir, removed>")
        if kept:
            reason += "\nconsole logs kept at: " + ", ".join(kept.values())
        return reason, {"environment_unavailable": {"reason": str(problem), "console_logs": texts, "kept": kept}}

    def unavailable(self, config: Configuration) -> tuple[str, dict[str, Any]] | None:
        """Why this configuration's environment cannot run trials (and the evidence), or None."""
        return self._unavailable.get(variant_of(config))

    def teardown(self) -> list[str]:
        return self.lab.teardown() if self.lab else []

    @property
    def idle_cores(self) -> str:
        """What the machine's idle cores do while the lab is up (lab.idle_cores: the same in every configuration
        of a run)."""
        return self.configs[0].scenario.lab.idle_cores if self.configs else "pm-qos"

    @property
    def cpu_wake_latency(self) -> str:
        """What the lab's hold on the CPUs' wake-up latency obtained (vnetbench.lab.idle), for the fingerprint."""
        if self.lab is None:
            return "not held: no lab was built"
        return self.lab.wake.state if self.lab.wake is not None else self.lab.cpu_wake_latency

    @property
    def cpu_wake_up(self) -> dict | None:
        """What a wake-up cost on the lab's machine while the hold was on (vnetbench.lab.idle.probe_wake_up)."""
        return self.lab.wake.wake_up if self.lab and self.lab.wake else None

    @property
    def receiver(self) -> NamespaceNode:
        """The receiver of the only (or first) variant."""
        return self.lab.endpoints[next(iter(self.lab.groups.values())).receiver]

    def group(self, config: Configuration) -> Group:
        return self.lab.group(variant_of(config))

    def flows(self, config: Configuration) -> list[tuple[str, list[str]]]:
        """Where this configuration's traffic goes: each receiver with the senders that send to it (the
        dumbbell: its one receiver and the configuration's senders). The links on these paths carry the
        configuration's conditions and are probed before its trials."""
        group = self.group(config)
        return [(group.receiver, group.senders[:config.active_senders])]

    def workload_endpoints(self, config: Configuration, workload: str) -> TrialEndpoints:
        """The endpoints workload `workload` of this configuration runs between (the dumbbell: every workload
        between the configuration's senders and its receiver)."""
        group = self.group(config)
        return TrialEndpoints(self.lab.endpoints[group.receiver],
                              [self.lab.endpoints[n] for n in group.senders[:config.active_senders]])

    def variant_name(self, group: Group) -> str:
        """What a variant's endpoints are called in the run's record: its environment and options
        ("vm(nic=e1000)")."""
        return str(group.variant)

    def endpoints(self) -> dict[str, dict[str, dict[str, Any]]]:
        """The endpoint -> node mapping, per environment variant as built: the scenario's endpoint names (r, s1,
        s2, ...) to where each runs, its addresses, interface and CPU. Stored with the run ("endpoints" in its
        fingerprint), shown by `show` and the report; the same for every place."""
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for group in self.lab.groups.values():
            out.setdefault(self.variant_name(group), {}).update(  # a declared topology's groups share one variant
                {role: self.lab.endpoints[name].placement() for role, name in group.roles().items()
                 if name in self.lab.endpoints})  # one that did not come up may lack some
        return out

    def cores(self, group: Group, config: Configuration) -> dict[str, Any]:
        """Where this trial's processes ran, stored with it: each endpoint's core (None: not pinned; a guest's:
        where its QEMU threads start) and each emulator's on the path. Placement changes between configurations
        (an emulator on the path takes a core), so the run's endpoint record alone cannot say it."""
        return {"endpoints": {role: getattr(self.lab.endpoints[name], "cpu", None)
                              for role, name in group.roles(config.active_senders).items()},
                "emulators": self.links.emulator_cores()}

    def start_servers(self, groups: list[Group] | None = None) -> None:
        """Every server the run's workloads keep on each variant's endpoints (iperf3: one per sender on
        the receiver; sockperf: a TCP and a UDP server), restarted from scratch; then wait until all
        listen."""
        specs = self.server_specs(groups)
        stopped = set()
        for spec in specs:
            key = f"{spec.node.name}:{spec.label}"
            proc = self._servers.pop(key, None)
            if proc is not None and proc.poll() is None:
                # its whole process group (nginx's workers too), and SIGKILL: a hung or stopped
                # server would ignore SIGTERM
                kill_group(proc)
                proc.wait(timeout=5)
                stopped.add(spec.node.name)
        for host in stopped:
            self._wait_released(host, [s for s in specs if s.node.name == host])
        for spec in specs:
            key = f"{spec.node.name}:{spec.label}"
            self._servers[key] = spec.node.popen(spec.argv, *self._server_files(key))
        for host in dict.fromkeys(spec.node.name for spec in specs):
            self._wait_listening(host, [s for s in specs if s.node.name == host])

    def server_specs(self, groups: list[Group] | None = None) -> list[Any]:
        """The servers start_servers keeps (every group's, or these groups'): one per host and label, so that
        groups that share a receiver (a declared topology's, a cluster's) share its servers."""
        groups = groups if groups is not None else list(self.lab.groups.values())
        groups = [g for g in groups if g.unavailable is None]
        per_tool: dict[str, list[Any]] = {}  # tool -> its distinct options over the run's configurations
        for c in self.configs:
            for w in c.scenario.active.values():
                if w not in per_tool.setdefault(w.tool, []):
                    per_tool[w.tool].append(w)
        if not self.configs:  # a bench made by hand (tests): the iperf3 stream of the first version
            per_tool = {"iperf3": [registry.driver("iperf3").Options()]}
        ipv = self.configs[0].scenario.lab.ip_version if self.configs else 4
        return list({f"{spec.node.name}:{spec.label}": spec
                     for g in groups for tool, opts in per_tool.items()
                     for spec in registry.driver(tool).servers(self.group_endpoints(g), ipv, opts,
                                                               self.server_workdir)}.values())

    def group_endpoints(self, group: Group) -> TrialEndpoints:
        """A group's endpoints as its workloads' servers see them: its receiver and every sender."""
        return TrialEndpoints(self.lab.endpoints[group.receiver], [self.lab.endpoints[n] for n in group.senders])

    def _server_files(self, key: str) -> tuple[Path, Path]:
        """A server's output files, named by its index: its key holds a host name, an inventory's in a run on
        real hosts, and no file name is made of a name a user chose."""
        n = self._server_index.setdefault(key, len(self._server_index))
        return self.workdir / f"server-{n}.out", self.workdir / f"server-{n}.err"

    @property
    def server_workdir(self) -> str:
        """The run's directory that servers may use, on the nodes they run on (the lab's nodes share this
        machine's file system)."""
        return str(self.workdir)

    def _listening(self, host: str) -> set[tuple[str, int]]:
        """(transport, port) of every socket listening (TCP) or bound (UDP) on `host`."""
        try:
            out = self.lab.endpoints[host].run(["ss", "-Hlntu"], timeout=10).stdout
        except subprocess.TimeoutExpired:
            return set()
        ready = set()
        for line in out.splitlines():
            fields = line.split()
            if len(fields) >= 5:
                ready.add((fields[0], int(fields[4].rsplit(":", 1)[1])))
        return ready

    def _wait_servers_free(self, group: Group) -> None:
        """Until no connection of an earlier trial is held on `group`'s servers. A client that has exited has
        not ended its test on the server while its last messages still queue on the path: through a 30 ms delay
        and a full bottleneck, back-to-back trials (a configuration's repetitions in a row) found the iperf3
        server still in the last one's test ("the server is busy running a test"; 23 of 216 trials of a
        sequential static-congestion run, none interleaved). Past SERVER_FREE_TIMEOUT the group's servers are
        started afresh."""
        ports: dict[str, set[int]] = {}
        for spec in self.server_specs([group]):
            if spec.transport == "tcp":
                ports.setdefault(spec.node.name, set()).add(spec.port)
        deadline = time.monotonic() + SERVER_FREE_TIMEOUT
        for host, held_on in ports.items():
            while self._held_connections(host, held_on):
                if time.monotonic() > deadline:
                    self.start_servers([group])
                    return
                time.sleep(0.02)

    def _held_connections(self, host: str, ports: set[int]) -> list[str]:
        try:
            out = self.lab.endpoints[host].run(["ss", "-Htan"], timeout=10).stdout
        except subprocess.TimeoutExpired:
            return []
        return held_connections(out, ports)

    def _wait_released(self, host: str, specs: list[ServerSpec]) -> None:
        """Until the ports of servers just stopped on `host` are free. Where the local process is the node's
        command channel (an ssh client, an engine's exec), the server itself ends a moment later on its node
        (its wrapper's SIGTERM, SIGKILL 2 s on): a new one started before would find its port taken."""
        wanted = {(s.transport, s.port) for s in specs}
        deadline = time.monotonic() + SERVER_READY_TIMEOUT
        while wanted & self._listening(host) and time.monotonic() < deadline:
            time.sleep(0.05)

    def _wait_listening(self, host: str, specs: list[ServerSpec]) -> None:
        node = self.lab.endpoints[host]
        wanted = {(s.transport, s.port) for s in specs}
        # A guest answers over SSH, slowly under TCG on a busy machine: it gets longer.
        ready_in = SERVER_READY_TIMEOUT if isinstance(node, NamespaceNode) else GUEST_READY_TIMEOUT
        deadline = time.monotonic() + ready_in
        while True:
            ready = self._listening(host)
            if wanted <= ready:
                return
            dead = [s for s in specs if self._servers[f"{host}:{s.label}"].poll() is not None]
            if dead or time.monotonic() > deadline:
                spec = (dead or [s for s in specs if (s.transport, s.port) not in ready])[0]
                err = self._server_files(f"{host}:{spec.label}")[1].read_text(errors="replace")[-300:]
                missing = sorted(f"{t}/{p}" for t, p in wanted - ready)
                raise LabError(f"servers on {host} did not start listening on {', '.join(missing)} "
                               f"({spec.argv[0]}{' exited' if dead else ''}): {err}")
            time.sleep(0.01)

    # ------------------------------------------------------- configuration

    def prepare(self, config: Configuration) -> list[dict[str, Any]]:
        """Make the lab what this configuration declares, whatever ran before it, and check it: its links (the
        bottleneck and every sender's: conditions, backend, emulator) and its environment's offloads, computed
        from the configuration alone and changed where the installed state differs; then what the kernel and
        the emulators hold is read back against the declaration, and the path is probed
        (:meth:`check_path`) before the first trial on each path (configurations that differ only in their
        workloads cross the same one) and whenever something changed. A lab that does not pass is rebuilt on
        the path from scratch and checked once more; still wrong, it raises PathNotAsDeclared (the trial fails with the reason). Returns the kernel's view of the qdiscs."""
        changed = self._realise(config)
        if changed:
            self._path_checked.clear()
        # Read back every time (netlink and the emulators' control sockets: milliseconds); probe when it changed.
        problems = self._state_problems(config)
        path = self._path_identity(config)
        if not problems and path not in self._path_checked:
            problems = self.check_path(config)
        if problems:
            self._path_checked.clear()
            self.links.reset_path()
            self._group_offload_unknown(config)
            self._realise(config)
            problems = self._state_problems(config) or self.check_path(config)
            if problems:
                raise PathNotAsDeclared(problems)
        self._path_checked.add(path)
        return self.lab_state

    def _path_identity(self, config: Configuration) -> tuple[Any, ...]:
        """What check_path probes for `config`: its variant's namespaces, the IP version, each sender's path to
        its receiver and what its declared conditions promise. Two configurations with the same identity on a
        lab that did not change between them cross the same path."""
        mtu = self.group(config).variant.mtu
        pairs = tuple((sender, receiver) for receiver, senders in self.flows(config) for sender in senders)
        promised = tuple(pathcheck.expectation(self.links.paths(r, [s])[s], mtu) for s, r in pairs)
        return variant_of(config), config.scenario.lab.ip_version, pairs, promised

    def _realise(self, config: Configuration) -> bool:
        """The configuration's offloads and links, changing what differs; whether anything changed."""
        lab = config.scenario.lab
        group = self.group(config)
        rx = group.receiver
        on = lab.offload == "on"
        changed = False
        # Offloads start as each device's defaults, which is what "on" means: touch them only to change.
        if group.offload is None and on:
            group.offload = True
        if group.offload != on:
            self._set_offload(group, on)
            group.offload = on
            changed = True
        # The bottleneck (tbf/htb alone, netem, or the userspace emulator spliced into the link) and every other
        # link on the path, after the offloads: the emulator's receive steering depends on them.
        state = self.links.apply(config, self.flows(config))
        changed |= self.links.changed
        if self.links.rewired and group.variant in self._offload:
            # An emulator spliced in or taken out put new devices on the link, with their own defaults: the
            # configuration's offloads again.
            self._set_offload(group, on)
        if self.links.repinned:  # an emulator came onto this path or left it: its endpoints' cores changed
            self.links.repinned = False
            self.start_servers([group])
        self._qdiscs[rx] = state["qdiscs"]
        self.lab_state = self._qdiscs[rx]
        return changed

    def _set_offload(self, group: Group, on: bool) -> None:
        """Set the variant's offloads and hold what the devices report against what they reported the first time
        they were set so: a device that does not follow (a new one on a re-wired link) is a problem."""
        readback = group.env.set_offload(on)
        self._offload[group.variant] = readback
        first = self._offload_seen.setdefault((group.variant, on), readback)
        before = {(d.get("netns"), d.get("dev")): d for d in first}
        self._offload_problems[group.variant] = [
            f"offloads {'on' if on else 'off'}: {d.get('netns')}/{d.get('dev')} reports {d}, as first set {b}"
            for d in readback if (b := before.get((d.get("netns"), d.get("dev")))) is not None and b != d]

    def _state_problems(self, config: Configuration) -> list[str]:
        """What the lab holds for this configuration, read back, that differs from its declaration."""
        return self._offload_problems.get(variant_of(config), []) + self.links.check()

    def _group_offload_unknown(self, config: Configuration) -> None:
        """Set the offloads again at the next _realise, whatever they were said to be."""
        group = self.group(config)
        group.offload = None if config.scenario.lab.offload == "off" else False

    def check_path(self, config: Configuration) -> list[str]:
        """Probe each sender's path to the receiver with ping (reachability, loss and delay; rate where it can
        be timed) and judge what came back against the declared conditions (vnetbench.runner.pathcheck)."""
        group = self.group(config)
        ipv = config.scenario.lab.ip_version
        pairs = [(sender, receiver) for receiver, senders in self.flows(config) for sender in senders]
        env = group.variant.env
        mtu = group.variant.mtu
        outdir = self.workdir / "path-check"
        outdir.mkdir(exist_ok=True)
        problems: list[str] = []
        self._resolve_neighbours(pairs, ipv, outdir)
        started = {}
        for i, (name, receiver) in enumerate(pairs):
            exp = pathcheck.expectation(self.links.paths(receiver, [name])[name], mtu)
            count, interval = pathcheck.probe_plan(exp, len(pairs))
            wait = max(1.0, 3 * (exp.base_rtt_s + exp.jitter_s))
            # No -w: with a deadline, -c counts replies, and ping would send until it has them.
            argv = ["ping", f"-{ipv}", "-D", "-n", "-c", str(count), "-i", f"{interval:g}", "-W", f"{wait:g}",
                    "-s", str(pathcheck.PROBE_SIZE), self.lab.endpoints[receiver].echo_address(ipv)]
            started[(name, receiver)] = (exp, count, self._start_probe(name, argv, outdir / f"probe-{i}"))
        for (name, receiver), (exp, count, (proc, out)) in started.items():
            result = self._finish_probe(name, proc, out)
            if isinstance(result, str):
                problems.append(f"path {name} -> {receiver}: {result}")
                continue
            problems += [f"path {name} -> {receiver}: {p}"
                         for p in pathcheck.judge_probe(exp, result.transmitted, result.rtt_ms, env)]
        for i, (name, receiver) in enumerate(pairs):  # one at a time: a train must queue on its own
            exp = started[(name, receiver)][0]
            plan = pathcheck.burst_plan(exp, mtu, ipv, env)
            if plan is None or problems:
                continue
            requests, payload = plan
            wait = max(1.0, 3 * (exp.base_rtt_s + exp.jitter_s) + 2 * requests * (payload + 62) * 8 / exp.rate_bps)
            # -i: should the preload stop half-way (ENOBUFS), the rest follows within a second, not one a second
            argv = ["ping", f"-{ipv}", "-D", "-n", "-c", str(requests), "-l", str(requests), "-i", "0.002",
                    "-W", f"{wait:g}", "-s", str(payload), self.lab.endpoints[receiver].echo_address(ipv)]
            result = self._finish_probe(name, *self._start_probe(name, argv, outdir / f"burst-{i}"))
            if isinstance(result, str):
                if "preload" not in result:  # ping refuses a preload above 3 to a user without privileges
                    problems.append(f"path {name} -> {receiver}: {result}")
                continue
            _, found = pathcheck.judge_burst(exp, payload, ipv, result)
            problems += [f"path {name} -> {receiver}: {p}" for p in found]
        return problems

    def _resolve_neighbours(self, pairs: list[tuple[str, str]], ipv: int, outdir: Path) -> None:
        """Each sender's echo requests until one is answered (at most NEIGHBOURS_WAIT_S), all senders at once,
        before the probe. A link re-wired (an emulator spliced in or taken out) drops its carrier and the
        kernel forgets the neighbours behind it; until ARP or NDP has found them again the echo replies wait in
        the neighbour queue, and one lost solicitation on a lossy link (20 % declared) held them a second and
        let them go at once: the probe saw a shortest round trip of 7 to 44 ms where none was declared. Not
        judged: a black hole still fails the probe after it."""
        waits = []
        for i, (name, receiver) in enumerate(pairs):
            argv = ["ping", f"-{ipv}", "-n", "-c", "1", "-i", "0.1", "-w", str(NEIGHBOURS_WAIT_S),
                    self.lab.endpoints[receiver].echo_address(ipv)]
            waits.append((name, *self._start_probe(name, argv, outdir / f"neighbours-{i}")))
        for name, proc, out in waits:
            self._finish_probe(name, proc, out)  # what it got is not judged

    def _least_delivery(self, config: Configuration) -> pathcheck.Expectation:
        """The expectation of the configuration's sender path that delivers the fewest round trips."""
        mtu = self.group(config).variant.mtu
        return min((pathcheck.expectation(links, mtu) for receiver, senders in self.flows(config)
                    for links in self.links.paths(receiver, senders).values()), key=lambda e: e.delivery)

    def _start_probe(self, name: str, argv: list[str], out: Path) -> tuple[subprocess.Popen, Path]:
        return self.lab.endpoints[name].popen(argv, out.with_suffix(".out"), out.with_suffix(".err"), pin=False,
                                          within=self.workdir), out

    def _finish_probe(self, name: str, proc: subprocess.Popen, out: Path) -> "ping.PingResult | str":
        """The probe's replies, or what went wrong running it."""
        try:
            proc.wait(timeout=PATH_CHECK_TIMEOUT)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            proc.wait()
            return f"ping did not end within {PATH_CHECK_TIMEOUT:g} s"
        text = out.with_suffix(".out").read_text(errors="replace")
        try:
            return ping.parse(text)
        except ToolFailed:
            err = out.with_suffix(".err").read_text(errors="replace").strip()
            return f"ping on {name} failed (exit {proc.returncode}): {(err or text).strip()[-300:] or 'no output'}"

    def link_state(self, config: Configuration) -> dict[str, Any]:
        """What to record with a configuration about its links: backend and settings as applied."""
        return self.links.state() if self.links else {}

    def environment_state(self, config: Configuration) -> dict[str, Any]:
        """What to record with a configuration about its environment: facts, bring-up time, offloads."""
        group = self.group(config)
        if group.variant not in self._facts:  # they do not change during the run (offloads aside)
            facts = dict(group.env.facts())
            facts.update({
                "variant": self.variant_name(group),
                "bringup_s": round(self.lab.bringup_s.get(group.variant, float("nan")), 4),
                # stored under "hosts", as runs before the rename stored it
                "hosts": {n: _facts(self.lab.endpoints[n]) for g in self.lab.groups.values()
                          if g.variant == group.variant for n in [g.receiver, *g.senders]},
            })
            self._facts[group.variant] = facts
        facts = dict(self._facts[group.variant])
        used = {h for receiver, senders in self.flows(config) for h in (receiver, *senders)}
        facts["hosts"] = {n: f for n, f in facts["hosts"].items() if n in used}
        facts["offload"] = self._offload.get(group.variant, "device defaults")
        return {"environment": facts}

    # --------------------------------------------------------------- trial

    def run_trial(self, config: Configuration, trial_tag: str) -> TrialOutcome:
        """One trial: the scenario's phases in order (a workload that runs on its own, with those that run
        during it), with the trial's recorders around them (runner/recorders.py: the links, the bottleneck's
        qdisc, the environment's counters, the CPUs). No tool is named here: each workload's module starts its clients
        and parses what they printed (vnetbench.workloads)."""
        tmp = self.workdir / trial_tag
        tmp.mkdir(parents=True, exist_ok=True)
        group = self.group(config)
        hosts = self.workload_endpoints(config, config.scenario.phases()[0][0])
        recorders = self.recorders(group)
        phases = config.scenario.phases()
        workloads = config.scenario.workload
        span = sum(sum(registry.of(workloads[lead]).timing(workloads[lead], config)) for lead, _ in phases)

        # The trial before's connections end first: its servers are free, and no connection that closes later
        # writes its metrics into the cache flushed next.
        self._wait_servers_free(group)
        reason = self._forget_tcp_metrics([self.lab.endpoints[h] for h in dict.fromkeys(
            h for receiver, senders in self.flows(config) for h in (receiver, *senders))])
        status = "ok" if reason is None else "failed"
        for recorder in recorders:
            recorder.start(span)
        started = time.time()
        ctx = TrialContext(config=config, endpoints=hosts, ip_version=config.scenario.lab.ip_version, tmp=tmp,
                           t0=started, extra_rtt_s=self.links.extra_rtt(config))
        runs: list[tuple[str, Started]] = []
        for lead, companions in phases if status == "ok" else []:
            status, reason = self._run_phase(ctx, lead, companions, runs)
            if status != "ok":
                break
        if status != "ok":
            self.lab.registry.stop_processes(grace=0.5)
        ended = time.time()
        for recorder in recorders:
            recorder.stop()

        spread_ms = self.start_spread(runs)  # before the outputs are read: it takes its stamps out of them
        outputs = {name: s.read_outputs() for name, s in runs}
        raw = self._raw_record(ctx, runs, outputs)
        raw["cores"] = self.cores(group, config)
        measurement = Measurement()
        if status == "ok":
            try:
                self._measure(ctx, runs, outputs, raw, measurement)
            except ToolFailed as e:
                status, reason = "failed", _with_what_failed_said(str(e), runs)
        window = _measured_window(ctx, runs)
        probe_pct = instruments_cpu(ctx, runs, window, ended, raw)
        if status == "ok" and probe_pct is not None:
            measurement.add("cpu.probe_pct", probe_pct)
        for recorder in recorders:  # after the workloads: service demand divides by what they moved
            recorder.collect(measurement if status == "ok" else None, raw, window)
        if status == "ok":
            if spread_ms is not None:
                measurement.add("start.spread_ms", spread_ms)
            empty = pathcheck.nothing_received([(x.metric, x.value) for x in measurement.samples],
                                               self._least_delivery(config), sum(r.dropped() for r in recorders))
            if empty:
                status, reason = "failed", _with_what_failed_said(empty, runs)
        if status == "ok":
            _share_fairness(config, measurement)
        if measurement.undefined:
            raw["undefined_metrics"] = sorted(set(measurement.undefined))
        shutil.rmtree(tmp, ignore_errors=True)
        if status != "ok":
            # A client that died mid-test can leave its server waiting; start clean.
            self.start_servers([group])
        return TrialOutcome(status, reason, started, ended, measurement, raw)

    def recorders(self, group: Group) -> list[Recorder]:
        """What watches a trial of `group` besides its workloads, in the order they are read: the links first
        (their drops are the bottleneck's where they count them), the lab's bottleneck port, the environment's
        own counters, this machine's CPUs."""
        out: list[Recorder] = [LinkRecorder(self.links)]
        port = self.lab.ports.get(group.receiver)
        if port is not None:
            out.append(QdiscRecorder(port))
        if group.env is not None:
            out.append(EnvironmentRecorder(group.env))
        # Every endpoint, guest and emulator of the lab runs on this machine; the emulators' and the guests'
        # processes are told apart.
        env = group.env
        out.append(CpuRecorder("this machine", parts=lambda: {"emulator": self.links.emulator_pids(),
                                                              **(env.cpu_parts() if env is not None else {})},
                               part_of=env.cpu_part_of if env is not None else None,
                               polled=self.lab.wake.polled_ns if self.lab.wake is not None else None))
        guests = env.guests() if env is not None else []
        if guests:
            out.append(GuestsCpuRecorder(guests, self.workdir))
        return out

    def _raw_record(self, ctx: TrialContext, runs: list[tuple[str, Started]],
                    outputs: dict[str, Any]) -> dict[str, Any]:
        """What the trial's tools printed, kept with it: each workload's own raw record, the command lines, and
        the last 4000 characters each process wrote on standard error."""
        workloads = ctx.config.scenario.workload
        raw: dict[str, Any] = {"workloads": {}, "stderr": {}, "command": {}}
        for name, s in runs:
            raw["workloads"][name] = registry.of(workloads[name]).raw(s, outputs[name])
            for label, proc in s.procs.items():
                raw["command"][f"{name}/{label}"] = " ".join(map(str, proc.args))
        for f in ctx.tmp.glob("*.err"):
            text = without_cpu_time(f.read_text(errors="replace")).strip()
            if text:
                raw["stderr"][ctx.labels.get(f.stem, f.stem)] = text[-4000:]
        return raw

    def _measure(self, ctx: TrialContext, runs: list[tuple[str, Started]], outputs: dict[str, Any],
                 raw: dict[str, Any], measurement: Measurement) -> None:
        """Each workload's metrics into `measurement`, parsed from what it printed; leaders before their
        companions, which read what the leader found (iperf3's data ports for ss). Raises ToolFailed when a
        tool's output or exit says it did not measure (what was parsed before stays, stored with the failed
        trial)."""
        workloads = ctx.config.scenario.workload
        by_name = dict(runs)
        for lead, companions in ctx.config.scenario.phases():
            for name in (lead, *companions):
                if name not in by_name:
                    continue
                s, options = by_name[name], workloads[name]
                lead_of = options.during
                own = self._own(ctx if lead_of is None else ctx.during(by_name[lead_of], workloads[lead_of]), name)
                driver = registry.of(options)
                found = driver.measure(s, options, own, outputs[name])
                measurement.extend(_named_after(found, name) if ctx.config.scenario.qualifies(name) else found)
                problem = driver.exit_problem(s)
                if problem:
                    raise ToolFailed(problem)
                used = s.info.get("congestion_control_used")
                if used:
                    raw["congestion_control_used"] = used

    def _forget_tcp_metrics(self, nodes: list[Any]) -> str | None:
        """Start the trial without what TCP remembers of its peers from earlier trials. The kernel keeps, per
        destination, the RTT, its variance, ssthresh and cwnd of closed connections (tcp_metrics) and starts new
        connections from them: a trial after one with a long delay or heavy loss would begin from that trial's
        numbers. Connections within the trial still learn from each other, as they do on any host. Returns why
        it could not be done (the trial fails), or None."""
        for node, done in zip(nodes, run_on_each(nodes, ["ip", "tcp_metrics", "flush", "all"], timeout=30)):
            if isinstance(done, subprocess.TimeoutExpired):
                return f"`ip tcp_metrics flush all` on {node.name} did not end within 30 s"
            if isinstance(done, BaseException):
                raise done
            if done.returncode != 0:
                return (f"`ip tcp_metrics flush all` on {node.name} failed (exit {done.returncode}): "
                        f"{(done.stderr or done.stdout).strip()[-300:]}")
        return None

    def _own(self, ctx: TrialContext, workload: str) -> TrialContext:
        """The trial's context for `workload`: between its own endpoints."""
        return replace(ctx, endpoints=self.workload_endpoints(ctx.config, workload))

    @contextmanager
    def clients_start_together(self, ctx: TrialContext) -> Iterator[list[float]]:
        """Around the start of a phase's leader: yields [seconds after now its clients begin]. In the lab they
        begin as they are started (a process each, microseconds apart); real hosts start theirs at one
        instant (HostsBench)."""
        yield [0.0]

    def start_spread(self, runs: list[tuple[str, Started]]) -> float | None:
        """Milliseconds between the first and the last client start of the trial's first workload, where
        they were measured (real hosts); None in the lab."""
        return None

    def after_trial(self, outcome: TrialOutcome) -> None:
        """Called once a trial is stored: nothing to do in the lab (real hosts wait for one that dropped out)."""

    def _run_phase(self, ctx: TrialContext, lead: str, companions: list[str],
                   runs: list[tuple[str, Started]]) -> tuple[str, str | None]:
        """Start `lead`, then each companion once the lead's warm-up is over, and wait for them all
        (watching the links: an emulator that dies ends the trial). Returns (status, reason)."""
        scenario = ctx.config.scenario
        phase_t0 = time.time() - ctx.t0  # trial-clock second this phase starts at
        with self.clients_start_together(ctx) as lead_s:
            leader = registry.of(scenario.workload[lead]).start(lead, scenario.workload[lead], self._own(ctx, lead))
        _shift(leader, phase_t0 + lead_s[0])
        runs.append((lead, leader))
        during = ctx.during(leader, scenario.workload[lead])
        # Companions measure the loaded path: they start once the leader is past its warm-up, except those
        # that follow the leader's whole life (ss: the cwnd from slow start on). Their times come from the
        # leader's, on the trial's clock already.
        for at_once in (True, False):
            chosen = [n for n in companions if registry.of(scenario.workload[n]).from_leader_start == at_once]
            if chosen and not at_once:
                time.sleep(max(0.0, ctx.t0 + leader.measured_from - time.time()))
            for name in chosen:
                runs.append((name, registry.of(scenario.workload[name]).start(name, scenario.workload[name],
                                                                              self._own(during, name))))
        waited = [(lead, leader)] + [(n, s) for n, s in runs if n in companions and not s.stopped_by_runner]
        try:
            for name, s in waited:
                for label, proc in s.procs.items():
                    try:
                        self.links.wait(proc, ctx.t0 + s.ends_by)
                    except subprocess.TimeoutExpired:
                        return "timeout", (f"{name} ({scenario.workload[name].tool} on {label}) still running after "
                                           f"{s.ends_by - phase_t0:g}s (per-trial timeout); killed")
            if self.links.failure():
                return "failed", self.links.failure()
        except LinkFailed as e:
            return "failed", f"{e}; the trial's tools were stopped"
        finally:
            for name, s in runs:
                if name in companions and s.stopped_by_runner:
                    _stop(s)
        return "ok", None


def held_connections(ss_tan: str, ports: set[int]) -> list[str]:
    """The TCP connections in `ss -Htan`'s output that a server on one of `ports` still holds (HELD_STATES),
    each as "state local peer"."""
    held = []
    for line in ss_tan.splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[0] in HELD_STATES and fields[3].rpartition(":")[2].isdigit() \
                and int(fields[3].rpartition(":")[2]) in ports:
            held.append(" ".join((fields[0], fields[3], fields[4])))
    return held


def _with_what_failed_said(reason: str, runs: list[tuple[str, Started]]) -> str:
    """The reason a trial failed, with the last line each process that exited badly wrote on standard error
    when the reason does not quote it already: a tool that never started (its namespace gone, a host that
    dropped) has nothing to parse, and only its node's command channel says why."""
    for name, s in runs:
        for label, proc in s.procs.items():
            if proc.returncode in (0, None):
                continue
            lines = [line for line in s.error_text(label, 1000).splitlines() if line.strip()]
            if lines and lines[-1].strip() not in reason:
                reason += f"; {name} on {label} exited {proc.returncode}: {lines[-1].strip()}"
    return reason


def _named_after(found: Measurement, workload: str) -> Measurement:
    """A workload's measurement with its metrics and series named after it (``throughput.rx_mbps@long``,
    ``throughput_mbps/src@long``): another workload of the trial runs the same tool."""
    def series(name: str) -> str:
        kind, slash, rest = name.partition("/")
        return f"{kind}/{rest}{QUALIFIER}{workload}"  # the kind stays: the report groups series by it

    out = Measurement()
    out.samples = [replace(x, metric=qualified(x.metric, workload)) for x in found.samples]
    out.series = [replace(x, name=series(x.name)) for x in found.series]
    out.undefined = [qualified(name, workload) for name in found.undefined]
    return out


def _share_fairness(config: Configuration, measurement: Measurement) -> None:
    """flows.maxmin_fairness of a trial whose streams run between different hosts: how evenly they got their
    max-min fair shares (the configuration's theory of each throughput.rx_mbps@WORKLOAD)."""
    shares = {name: v for name, v in config.expected.items()
              if name != "throughput.rx_mbps" and base_name(name) == "throughput.rx_mbps"}
    measured = {name: v for name in shares if (v := measurement.value(name)) is not None}
    found = share_fairness(measured, shares)
    if found is not None:
        measurement.add("flows.maxmin_fairness", found)


def _measured_window(ctx: TrialContext, runs: list[tuple[str, Started]]) -> Window | None:
    """When the trial's first workload measured (its warm-up excluded), in epoch seconds; None when it did not
    start."""
    if not runs:
        return None
    first = runs[0][1]
    return ctx.t0 + first.measured_from, ctx.t0 + first.measured_from + first.measured_s


def instruments_cpu(ctx: TrialContext, runs: list[tuple[str, Started]], window: Window | None, ended: float,
                    raw: dict[str, Any]) -> float | None:
    """What the trial's instruments (a workload whose tool watches the path, running during another) used in
    CPU over `window`, in cores x 100 (None: the trial ran none, or one's time is not known). Each process's
    CPU seconds (its node's ``cpu_seconds``: rusage on reaping here, the exec wrapper's ``times`` in a
    container or guest) are spread evenly over its life and the part inside the window counted. Every
    process's own share of a core over its life goes with the trial's raw record ("process_cpu_pct"), and the
    instruments' share by the endpoint they ran on ("instruments_cpu_pct"): the recorders take each endpoint's
    out of the machine, guest or container that ran it."""
    workloads = ctx.config.scenario.workload
    leaders = {lead for lead, _ in ctx.config.scenario.phases()}
    per_process: dict[str, float] = {}
    by_endpoint: dict[str, float] = {}
    unknown, any_instrument = False, False
    for name, s in runs:
        instrument = name not in leaders and registry.of(workloads[name]).instrument
        any_instrument |= instrument
        for label, proc in s.procs.items():
            cpu = ctx.cpu_seconds(proc)
            start, end = getattr(proc, "started_at", None), getattr(proc, "ended_at", None) or ended
            if cpu is None or start is None:
                unknown |= instrument
                continue
            life = max(end - start, 1e-3)
            per_process[f"{name}/{label}"] = round(100 * cpu / life, 1)
            if instrument and window is not None and window[1] > window[0]:
                endpoint = ctx.host_of(proc).name
                share = 100 * cpu_inside(cpu, start, end, window) / (window[1] - window[0])
                by_endpoint[endpoint] = by_endpoint.get(endpoint, 0.0) + share
    if per_process:
        raw["process_cpu_pct"] = per_process
    if not any_instrument or unknown or window is None or window[1] <= window[0]:
        return None
    raw["instruments_cpu_pct"] = {endpoint: round(pct, 2) for endpoint, pct in by_endpoint.items()}
    return sum(by_endpoint.values())


def _shift(s: Started, seconds: float) -> None:
    """Put a leader's times (relative to its own start) on the trial's clock: it started `seconds` after
    the trial did (the phases before it)."""
    s.measured_from += seconds
    s.ends_by += seconds


def _stop(s: Started) -> None:
    """Stop a workload that runs until told (a sampler): SIGTERM to its process group (it writes what it
    sampled), SIGKILL when it has not ended 2 s later. A command whose node ends it when its input closes (a
    container's, a guest's: nodes.exec_wrapper) is stopped that way instead: the wrapper there signals the
    tool alike and lives to say its CPU time."""
    deadline = time.monotonic() + 2.0
    for proc in s.procs.values():
        if proc.stdin is not None and poll_metered(proc) is None:
            proc.stdin.close()
    for proc in s.procs.values():
        if proc.stdin is not None:
            try:
                wait_metered(proc, timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
    stop_groups(s.procs.values(), grace=2.0)


def variant_of(config: Configuration) -> Variant:
    return Variant.from_lab(config.scenario.lab)


def _facts(host: Any) -> dict[str, Any]:
    facts = getattr(host, "facts", None)
    return facts() if callable(facts) else {}

