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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vnetbench.errors import EnvironmentUnavailable, LabError
from vnetbench.impair import tc
from vnetbench.impair.model import base_rtt
from vnetbench.impair.links import LinkFailed, LinkManager, bottleneck_drops, link_metrics, staggered
from vnetbench.lab.environments import Variant
from vnetbench.lab.nodes import Host
from vnetbench.lab.teardown import Registry
from vnetbench.lab.topology import Group, Lab, build_dumbbell
from vnetbench.scenario.plan import Configuration
from vnetbench.workloads import iperf3, ping, tcpinfo
from vnetbench.workloads.base import Measurement, ToolFailed

SERVER_READY_TIMEOUT = 5.0
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
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="vnetbench-")))
    _shaping: dict[str, tuple] = field(default_factory=dict)  # receiver -> installed (rate, buffer, qdisc, shape)
    _qdiscs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # receiver -> kernel's view
    _offload: dict[Variant, list[dict[str, Any]]] = field(default_factory=dict)  # variant -> read-back
    _servers: dict[str, subprocess.Popen] = field(default_factory=dict)  # "host:port" -> iperf3 server
    _facts: dict[Variant, dict[str, Any]] = field(default_factory=dict)
    lab_state: list[dict[str, Any]] = field(default_factory=list)
    configs: list[Configuration] = field(default_factory=list)  # the run's: link backends are chosen over all
    links: LinkManager | None = None  # link conditions (impair/): tbf/htb, netem or the userspace emulator
    keep_dir: Path | None = None  # where evidence of a variant that did not come up (console logs) is kept
    _unavailable: dict[Variant, tuple[str, dict[str, Any]]] = field(default_factory=dict)  # -> reason, raw

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
                                  registry=registry, variants=self.variants)
        for group in self.lab.groups.values():
            if group.unavailable is not None:
                self._unavailable[group.variant] = self._keep_evidence(group.unavailable)
        self.links = LinkManager(self.lab, registry, self.workdir, self.run_prefix, mtu=self.mtu)
        if self.configs:
            self.links.plan(self.configs)  # may move hosts off the emulators' cores: before servers start
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
                shutil.copyfile(path, target)
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
    def receiver(self) -> Host:
        """The receiver of the only (or first) variant."""
        return self.lab.hosts[next(iter(self.lab.groups.values())).receiver]

    def group(self, config: Configuration) -> Group:
        return self.lab.group(variant_of(config))

    def start_servers(self, groups: list[Group] | None = None) -> None:
        """One iperf3 server per sender on each receiver, then wait until all listen."""
        groups = groups if groups is not None else list(self.lab.groups.values())
        groups = [g for g in groups if g.unavailable is None]
        for g in groups:
            receiver = self.lab.hosts[g.receiver]
            keys = [f"{g.receiver}:{iperf3.BASE_PORT + i}" for i in range(len(g.senders))]
            for key in keys:
                proc = self._servers.pop(key, None)
                if proc is not None and proc.poll() is None:
                    proc.kill()  # a hung or stopped server would ignore SIGTERM
                    proc.wait(timeout=5)
            for i, key in enumerate(keys):
                port = iperf3.BASE_PORT + i
                self._servers[key] = receiver.popen(
                    iperf3.server_command(port), self.workdir / f"server-{g.receiver}-{port}.json",
                    self.workdir / f"server-{g.receiver}-{port}.err")
        for g in groups:
            self._wait_listening(g.receiver, {iperf3.BASE_PORT + i for i in range(len(g.senders))})

    def _wait_listening(self, host: str, ports: set[int]) -> None:
        receiver = self.lab.hosts[host]
        # A guest answers over SSH, slowly under TCG on a busy machine: it gets longer.
        deadline = time.monotonic() + (SERVER_READY_TIMEOUT if isinstance(receiver, Host) else GUEST_READY_TIMEOUT)
        while True:
            try:
                out = receiver.run(["ss", "-Hltn"], timeout=10).stdout
            except subprocess.TimeoutExpired:
                out = ""
            listening = {int(line.split()[3].rsplit(":", 1)[1]) for line in out.splitlines() if line.strip()}
            if ports <= listening:
                return
            dead = [p for p in ports if self._servers[f"{host}:{p}"].poll() is not None]
            if dead or time.monotonic() > deadline:
                port = (dead or sorted(ports - listening))[0]
                err = (self.workdir / f"server-{host}-{port}.err").read_text()[-300:]
                raise LabError(f"iperf3 servers on {host} ports {sorted(ports - listening)} did not start "
                               f"listening: {err}")
            time.sleep(0.01)

    # ------------------------------------------------------- configuration

    def prepare(self, config: Configuration) -> list[dict[str, Any]]:
        """Make the bottleneck and the offloads of this configuration's environment match it;
        returns the kernel's view of the bottleneck."""
        lab = config.scenario.lab
        group = self.group(config)
        rx = group.receiver
        on = lab.offload == "on"
        # Offloads start as each device's defaults, which is what "on" means: touch them only to change.
        if group.offload is None and on:
            group.offload = True
        if group.offload != on:
            self._offload[group.variant] = group.env.set_offload(on)
            group.offload = on
        # The bottleneck (tbf/htb alone, netem, or the userspace emulator spliced into the link) and any
        # other link's conditions, after the offloads: the emulator's link needs TSO/GSO/GRO off.
        state = self.links.apply(config, rx, group.senders[:config.active_senders])
        if self.links.repinned:
            self.links.repinned = False
            self.start_servers()
        self._qdiscs[rx] = state["qdiscs"]
        self.lab_state = self._qdiscs[rx]
        return self.lab_state

    def link_state(self, config: Configuration) -> dict[str, Any]:
        """What to record with a configuration about its links: backend and settings as applied."""
        return self.links.state() if self.links else {}

    def environment_state(self, config: Configuration) -> dict[str, Any]:
        """What to record with a configuration about its environment: facts, bring-up time, offloads."""
        group = self.group(config)
        if group.variant not in self._facts:  # they do not change during the run (offloads aside)
            facts = dict(group.env.facts())
            facts.update({
                "variant": str(group.variant),
                "bringup_s": round(self.lab.bringup_s.get(group.variant, float("nan")), 4),
                "hosts": {n: _facts(self.lab.hosts[n]) for n in [group.receiver, *group.senders]},
            })
            self._facts[group.variant] = facts
        facts = dict(self._facts[group.variant])
        used = {group.receiver, *group.senders[:config.active_senders]}
        facts["hosts"] = {n: f for n, f in facts["hosts"].items() if n in used}
        facts["offload"] = self._offload.get(group.variant, "device defaults")
        return {"environment": facts}

    # --------------------------------------------------------------- trial

    def run_trial(self, config: Configuration, trial_tag: str) -> TrialOutcome:
        stream = config.stream
        lab_spec = config.scenario.lab
        ipv = lab_spec.ip_version
        tmp = self.workdir / trial_tag
        tmp.mkdir(parents=True, exist_ok=True)
        group = self.group(config)
        receiver = self.lab.hosts[group.receiver]
        senders = [self.lab.hosts[n] for n in group.senders[:config.active_senders]]
        port_iface = self.lab.ports[group.receiver]
        before = tc.counters(port_iface)
        env_counters = getattr(group.env, "counters", None)
        env_before = env_counters() if env_counters else None
        # iperf3 runs omit + duration seconds; "auto" leaves room for connection set-up and teardown.
        timeout = stream.omit + stream.span + 15.0 if stream.timeout == "auto" else stream.timeout

        self.links.start_trial(stream.omit + stream.span)  # an emulator restarts: seed and schedule from now
        started = time.time()
        clients: dict[str, subprocess.Popen] = {}
        starts: dict[str, float] = {}
        for i, host in enumerate(senders):
            starts[host.name], duration = stream.timing(i)  # staggered flows: [workload.stream] flows
            spec = iperf3.ClientSpec(
                server=receiver.service_address(ipv), port=iperf3.BASE_PORT + i, proto=stream.proto,
                duration=duration, omit=stream.omit, window=stream.window,
                rate_bps=config.offered_bps / stream.parallel if config.offered_bps else None,
                congestion_control=stream.congestion_control if stream.proto == "tcp" else None,
                length=None if stream.length == "auto" else stream.length, parallel=stream.parallel,
                reverse=stream.reverse, ip_version=ipv)
            clients[host.name] = host.popen(staggered(iperf3.client_command(spec), starts[host.name]),
                                            tmp / f"{host.name}.json", tmp / f"{host.name}.err")
        # ss -ti samplers on the hosts that send the data (the receiver with --reverse)
        samplers = tcpinfo.start(config.scenario.samplers, [receiver] if stream.reverse else senders, tmp,
                                 stream.proto)
        probes: dict[str, subprocess.Popen] = {}
        probe_specs = config.scenario.probes
        if probe_specs:
            # Probe the loaded path once the flows are past their warm-up (omit).
            time.sleep(max(0.0, started + stream.omit - time.time()))
            for name, probe in probe_specs:
                # Whole seconds (ping -w), ending before the flows do: the probe sees only loaded time.
                deadline = max(1, int(stream.span - 0.5))
                # Room for a full queue plus half again, so the probe keeps its rate when the RTT grows.
                max_rtt = 1.5 * config.expected.get("queue.full_delay_ms", 0.0) / 1e3 + 0.005 \
                    + self.links.extra_rtt(config)
                argv = ping.command(receiver.service_address(ipv), probe.interval, probe.size, deadline, ipv,
                                    preload=ping.preload_for(probe.interval, max_rtt))
                probes[name] = senders[0].popen(argv, tmp / f"{name}.txt", tmp / f"{name}.err")

        status, reason = "ok", None
        end_by = started + timeout
        for name, proc in list(clients.items()) + list(probes.items()):
            try:
                self.links.wait(proc, end_by)  # also watches the links: an emulator that dies ends the trial
            except subprocess.TimeoutExpired:
                status, reason = "timeout", f"{name} still running after {timeout:g}s (per-trial timeout); killed"
            except LinkFailed as e:
                status, reason = "failed", f"{e}; the trial's tools were stopped"
                break
        if status == "ok" and self.links.failure():
            status, reason = "failed", self.links.failure()
        samplers.stop()
        if status != "ok":
            self.lab.registry.stop_processes(grace=0.5)
        ended = time.time()
        after = tc.counters(port_iface)
        link_counters = self.links.end_trial()

        raw: dict[str, Any] = {"iperf3": {}, "probes": {}, "stderr": {}, "command": {}}
        for name, proc in clients.items():
            raw["iperf3"][name] = (tmp / f"{name}.json").read_text(errors="replace")
            raw["command"][name] = " ".join(map(str, proc.args))
        for name, proc in probes.items():
            raw["probes"][name] = (tmp / f"{name}.txt").read_text(errors="replace")
            raw["command"][name] = " ".join(map(str, proc.args))
        for f in tmp.glob("*.err"):
            text = f.read_text(errors="replace").strip()
            if text:
                raw["stderr"][f.stem] = text[-4000:]
        raw["bottleneck_counters"] = {"before": before, "after": after}
        raw["links"] = {name: c.per_direction for name, c in link_counters.items()}
        ss_outputs = {w: samplers.outputs(w) for w in samplers.workloads()}
        raw["ss"] = {f"{w}/{h}": tcpinfo.raw_excerpt(t) for w, per in ss_outputs.items() for h, t in per.items()}
        if env_counters:
            raw["environment_counters"] = {"before": env_before, "after": env_counters()}
        shutil.rmtree(tmp, ignore_errors=True)

        measurement = Measurement()
        if status == "ok":
            try:
                flows = {name: iperf3.parse_client(raw["iperf3"][name]) for name in clients}
                # What the sender's kernel really ran, as iperf3 reports it: the requested algorithm is a
                # parameter, this is the record (a sysctl or a missing module can make them differ).
                used = {name: f.congestion_control for name, f in flows.items() if f.congestion_control}
                if used:
                    raw["congestion_control_used"] = used
                asked = stream.congestion_control if stream.proto == "tcp" else None
                wrong = {n: cc for n, cc in used.items() if asked not in (None, cc)}
                if wrong:
                    raise ToolFailed(f"congestion control {asked!r} was asked but the "
                                     f"senders ran {wrong}")
                measurement.extend(iperf3.measure(flows, (config.offered_bps or 0) * len(senders) or None,
                                                  t_offset=stream.omit))
                iperf3.shift_series(measurement, starts)
                drops = bottleneck_drops(link_counters)
                measurement.add("bottleneck.drops", drops if drops is not None else after["drops"] - before["drops"])
                for metric, value in link_metrics(link_counters):
                    measurement.add(metric, value)
                ports = set().union(*(tcpinfo.iperf3_data_ports(raw["iperf3"][n]) for n in clients))
                for w, outputs in ss_outputs.items():
                    measurement.extend(tcpinfo.measure(outputs, t0=started, data_ports=ports,
                                                       window=(stream.omit, stream.omit + stream.span)))
                for name in probes:
                    measurement.extend(ping.measure(ping.parse(raw["probes"][name]), t0=started))
                # Staggered flows ([workload.stream] flows): what queue the others leave once one has ended.
                ends = [starts[h.name] + stream.omit + stream.timing(i)[1] for i, h in enumerate(senders)]
                if probes and min(ends) < max(ends):
                    ping.standing_queue(measurement, after_s=min(ends) + ping.STANDING_QUEUE_SETTLE_S,
                                        base_rtt_ms=base_rtt(lab_spec) * 1e3)
            except ToolFailed as e:
                status, reason = "failed", str(e)
            bad = [n for n, p in clients.items() if p.returncode not in (0, None)]
            if status == "ok" and bad:
                status = "failed"
                reason = "; ".join(f"{n}: iperf3 exited {clients[n].returncode}: {raw['stderr'].get(n, '')[-200:]}"
                                   for n in bad)
        if status != "ok":
            # A client that died mid-test can leave its server waiting; start clean.
            self.start_servers([group])
        return TrialOutcome(status, reason, started, ended, measurement, raw)


def variant_of(config: Configuration) -> Variant:
    return Variant.from_lab(config.scenario.lab)


def _facts(host: Any) -> dict[str, Any]:
    facts = getattr(host, "facts", None)
    return facts() if callable(facts) else {}

