"""One lab for a whole run, and how a trial runs on it.

The lab's structure (hosts, links) is built once for the run with as many
senders as any configuration needs; what changes between configurations (the
bottleneck's rate and buffer) is re-applied with tc before a trial when it
differs from what is installed. Building per trial would add seconds of
overhead and no fidelity.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vnetbench.errors import LabError
from vnetbench.impair import tc
from vnetbench.lab.nodes import Host
from vnetbench.lab.teardown import Registry
from vnetbench.lab.topology import Lab, build_dumbbell, shape_bottleneck
from vnetbench.scenario.plan import Configuration
from vnetbench.workloads import iperf3, ping
from vnetbench.workloads.base import Measurement, ToolFailed

SERVER_READY_TIMEOUT = 5.0


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
    lab: Lab | None = None
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="vnetbench-")))
    _shaping: tuple | None = None
    _servers: dict[int, subprocess.Popen] = field(default_factory=dict)
    lab_state: list[dict[str, Any]] = field(default_factory=list)

    # ------------------------------------------------------------ lifecycle

    def setup(self) -> None:
        registry = Registry()
        registry.add(f"work directory {self.workdir}", lambda: shutil.rmtree(self.workdir, ignore_errors=True))
        self.lab = build_dumbbell(self.run_prefix, self.senders, mtu=self.mtu, pin_cpus=self.pin_cpus,
                                  registry=registry)
        self.start_servers()

    def teardown(self) -> list[str]:
        return self.lab.teardown() if self.lab else []

    @property
    def receiver(self) -> Host:
        return self.lab.hosts["r"]

    def start_servers(self) -> None:
        """One iperf3 server per sender on the receiver, then wait until all listen."""
        for proc in self._servers.values():
            if proc.poll() is None:
                proc.kill()  # a hung or stopped server would ignore SIGTERM
                proc.wait(timeout=5)
        self._servers.clear()
        for i in range(self.senders):
            port = iperf3.BASE_PORT + i
            self._servers[port] = self.receiver.popen(
                iperf3.server_command(port), self.workdir / f"server-{port}.json", self.workdir / f"server-{port}.err")
        self._wait_listening(set(self._servers))

    def _wait_listening(self, ports: set[int]) -> None:
        deadline = time.monotonic() + SERVER_READY_TIMEOUT
        while True:
            out = self.receiver.run(["ss", "-Hltn"], timeout=5).stdout
            listening = {int(line.split()[3].rsplit(":", 1)[1]) for line in out.splitlines() if line.strip()}
            if ports <= listening:
                return
            dead = [p for p, proc in self._servers.items() if proc.poll() is not None]
            if dead or time.monotonic() > deadline:
                err = (self.workdir / f"server-{(dead or sorted(ports - listening))[0]}.err").read_text()[-300:]
                raise LabError(f"iperf3 servers on ports {sorted(ports - listening)} did not start listening: {err}")
            time.sleep(0.01)

    # ------------------------------------------------------- configuration

    def prepare(self, config: Configuration) -> list[dict[str, Any]]:
        """Make the bottleneck match this configuration; returns the kernel's view of it."""
        lab = config.scenario.lab
        wanted = (lab.bottleneck, lab.buffer.in_bytes(lab.bottleneck), lab.qdisc, lab.shape)
        if wanted != self._shaping:
            shaping = tc.Shaping(rate_bps=lab.bottleneck, buffer_bytes=wanted[1], qdisc=lab.qdisc, mtu=lab.mtu)
            self.lab_state = shape_bottleneck(self.lab, shaping, lab.shape)
            self._shaping = wanted
        return self.lab_state

    # --------------------------------------------------------------- trial

    def run_trial(self, config: Configuration, trial_tag: str) -> TrialOutcome:
        stream = config.stream
        lab_spec = config.scenario.lab
        ipv = lab_spec.ip_version
        tmp = self.workdir / trial_tag
        tmp.mkdir(parents=True, exist_ok=True)
        senders = [self.lab.hosts[f"s{i}"] for i in range(1, config.active_senders + 1)]
        port_iface = self.lab.ports["r"]
        before = tc.counters(port_iface)
        # iperf3 runs omit + duration seconds; "auto" leaves room for connection set-up and teardown.
        timeout = stream.omit + stream.duration + 15.0 if stream.timeout == "auto" else stream.timeout

        started = time.time()
        clients: dict[str, subprocess.Popen] = {}
        for i, host in enumerate(senders):
            spec = iperf3.ClientSpec(
                server=self.receiver.address(ipv), port=iperf3.BASE_PORT + i, proto=stream.proto,
                duration=stream.duration, omit=stream.omit,
                rate_bps=config.offered_bps / stream.parallel if config.offered_bps else None,
                congestion_control=stream.congestion_control if stream.proto == "tcp" else None,
                length=None if stream.length == "auto" else stream.length, parallel=stream.parallel,
                reverse=stream.reverse, ip_version=ipv)
            clients[host.name] = host.popen(iperf3.client_command(spec), tmp / f"{host.name}.json",
                                            tmp / f"{host.name}.err")
        probes: dict[str, subprocess.Popen] = {}
        probe_specs = config.scenario.probes
        if probe_specs:
            # Probe the loaded path once the flows are past their warm-up (omit).
            time.sleep(max(0.0, started + stream.omit - time.time()))
            for name, probe in probe_specs:
                # Whole seconds (ping -w), ending before the flows do: the probe sees only loaded time.
                deadline = max(1, int(stream.duration - 0.5))
                # Room for a full queue plus half again, so the probe keeps its rate when the RTT grows.
                max_rtt = 1.5 * config.expected["queue.full_delay_ms"] / 1e3 + 0.005
                argv = ping.command(self.receiver.address(ipv), probe.interval, probe.size, deadline, ipv,
                                    preload=ping.preload_for(probe.interval, max_rtt))
                probes[name] = senders[0].popen(argv, tmp / f"{name}.txt", tmp / f"{name}.err")

        status, reason = "ok", None
        end_by = started + timeout
        for name, proc in list(clients.items()) + list(probes.items()):
            try:
                proc.wait(timeout=max(0.1, end_by - time.time()))
            except subprocess.TimeoutExpired:
                status, reason = "timeout", f"{name} still running after {timeout:g}s (per-trial timeout); killed"
        if status == "timeout":
            self.lab.registry.stop_processes(grace=0.5)
        ended = time.time()
        after = tc.counters(port_iface)

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
        shutil.rmtree(tmp, ignore_errors=True)

        measurement = Measurement()
        if status == "ok":
            try:
                flows = {name: iperf3.parse_client(raw["iperf3"][name]) for name in clients}
                measurement.extend(iperf3.measure(flows, (config.offered_bps or 0) * len(senders) or None,
                                                  t_offset=stream.omit))
                measurement.add("bottleneck.drops", after["drops"] - before["drops"])
                for name in probes:
                    measurement.extend(ping.measure(ping.parse(raw["probes"][name]), t0=started))
            except ToolFailed as e:
                status, reason = "failed", str(e)
            bad = [n for n, p in clients.items() if p.returncode not in (0, None)]
            if status == "ok" and bad:
                status = "failed"
                reason = "; ".join(f"{n}: iperf3 exited {clients[n].returncode}: {raw['stderr'].get(n, '')[-200:]}"
                                   for n in bad)
        if status != "ok":
            # A client that died mid-test can leave its server waiting; start clean.
            self.start_servers()
        return TrialOutcome(status, reason, started, ended, measurement, raw)
