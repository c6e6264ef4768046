"""What a workload is: one tool, its options, its servers and clients, and what it measures.

A workload module (``workloads/<tool>.py``) holds everything about one tool, in
this order, so a reader sees it in one place:

1. ``Options``: a pydantic model of its ``[workload.NAME]`` table (``tool`` is
   the discriminator), validated with the rest of the scenario;
2. ``METRICS``: the metrics it measures, with unit and direction;
3. a :class:`Workload` subclass registered under its tool name
   (:func:`vnetbench.workloads.registry.register`): the binaries it needs (and
   their Debian packages), the servers it keeps on the receiver, how it starts
   its clients for a trial and how it parses what they printed into a
   :class:`Measurement`.

The runner knows none of the tools: for each trial it starts the scenario's
workloads through this interface (:mod:`vnetbench.runner.bench`). A workload
either runs *on its own* (it leads a phase of the trial) or ``during`` another
(it starts once the leader's warm-up is over and lasts its measured time, as
ping probes the queue an iperf3 stream builds).
"""

from __future__ import annotations

import math
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from vnetbench.tools import Tool  # every tool is declared in vnetbench.tools
from vnetbench.metrics import Metric, metric
from vnetbench.scenario.names import require_name
from vnetbench.store.db import SampleRecord, SeriesRecord


@dataclass
class Measurement:
    """A workload's parsed result for one trial."""

    samples: list[SampleRecord] = field(default_factory=list)
    series: list[SeriesRecord] = field(default_factory=list)
    # Metrics this trial has no value of (NaN: a loss ratio of no packets, the fairness of flows that all carried
    # nothing): not samples, which are numbers, but named in the trial's record.
    undefined: list[str] = field(default_factory=list)

    def add(self, name: str, value: float) -> None:
        m = metric(name)
        value = float(value)
        if not math.isfinite(value):
            self.undefined.append(name)
            return
        self.samples.append(SampleRecord(name, value, m.unit, m.direction))

    def has(self, name: str) -> bool:
        """Whether the trial has `name`, as a number or as undefined."""
        return name in self.undefined or any(s.metric == name for s in self.samples)

    def value(self, name: str) -> float | None:
        """The trial's (first) value of `name`, or None."""
        return next((s.value for s in self.samples if s.metric == name), None)

    def add_series(self, name: str, unit: str, t: Any, v: Any) -> None:
        self.series.append(SeriesRecord(name, unit, np.asarray(t, dtype=float), np.asarray(v, dtype=float)))

    def extend(self, other: "Measurement") -> None:
        self.samples.extend(other.samples)
        self.series.extend(other.series)
        self.undefined.extend(other.undefined)


class ToolFailed(Exception):
    """The tool ran but produced no usable result; the message quotes it."""


# ------------------------------------------------------------------ the workload interface


class WorkloadOptions(BaseModel):
    """What every ``[workload.NAME]`` table has: its ``tool``; for a workload that accompanies
    another, ``during = "<other workload's name>"``; ``enabled = false`` for one that a scenario offers
    but does not run unless asked. Each tool's model adds its own options."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)
    tool: str = Field(description="the tool that runs (docs/reference/workloads.md: one section per tool)")
    during: str | None = Field(default=None, description="the workload this one accompanies: it starts once that "
                               "one is past its warm-up and lasts its measured time")
    # an optional workload of a built-in: --set workload.NAME.enabled=true
    enabled: bool = Field(default=True, description="false: offered but not run unless asked "
                          "(--set workload.NAME.enabled=true)")
    # On a declared topology, several workloads of one trial may run between different hosts (a parking lot's
    # long flow and its cross flows): each names its own, else it runs between the topology's.
    clients: list[str] | None = Field(default=None, max_length=64, description="with a [topology]: the hosts "
                                      "this workload's clients run on; default: topology.clients")
    server: str | None = Field(default=None, description="with a [topology]: the host its server runs on; "
                               "default: topology.server")

    @field_validator("clients")
    @classmethod
    def _client_names(cls, v: list[str] | None) -> list[str] | None:
        for name in v or []:
            require_name(name, "client")
        return v

    @field_validator("server")
    @classmethod
    def _server_name(cls, v: str | None) -> str | None:
        return None if v is None else require_name(v, "server")

    @property
    def own_endpoints(self) -> bool:
        """Whether it names its own clients or server (else it runs between the trial's)."""
        return self.clients is not None or self.server is not None


@dataclass(frozen=True)
class ServerSpec:
    """A long-lived server a workload keeps on an endpoint for the whole run."""

    node: Any  # the node it runs on (a RunsCommands)
    argv: list[str]
    port: int
    transport: str = "tcp"  # tcp: ready when listening; udp: ready when bound
    label: str = ""  # file and message name, e.g. "iperf3-5201"


@dataclass
class TrialEndpoints:
    """The endpoints of one trial: its configuration's environment variant, as many senders as it uses."""

    receiver: Any
    senders: list[Any]
    # Per sender, the number a server keeps for it (a port of its own: BASE_PORT + slot), where the run has
    # several client sets (a declared topology's workloads between different hosts); None: its position.
    slots: list[int] | None = None

    def slot(self, i: int) -> int:
        return self.slots[i] if self.slots is not None else i


@dataclass
class Started:
    """What a workload started for one trial: its processes and when its measured part is.

    Times are seconds on the trial's clock (0 = the trial's start). ``info`` is the
    workload's own (e.g. iperf3's flow starts), for its ``measure`` and its companions.
    """

    name: str
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)  # label (usually an endpoint's name) -> process
    outputs: dict[str, Path] = field(default_factory=dict)  # label -> stdout file
    measured_from: float = 0.0  # trial-clock second its measured part begins (after any warm-up)
    measured_s: float = 0.0  # how long the measured part lasts
    ends_by: float = 0.0  # trial-clock second by which its processes must have ended (the per-trial timeout)
    stopped_by_runner: bool = False  # it runs until told (a sampler): stopped when its leader ends
    info: dict[str, Any] = field(default_factory=dict)

    def read_outputs(self) -> dict[str, str]:
        return {label: path.read_text(errors="replace") if path.exists() else "" for label, path in
                self.outputs.items()}

    def error_text(self, label: str, limit: int = 300) -> str:
        """The end of what `label`'s process printed on standard error (to quote in a failure)."""
        from vnetbench.lab.nodes import without_cpu_time

        try:
            return without_cpu_time(self.outputs[label].with_suffix(".err").read_text(errors="replace")).strip()[-limit:]
        except (KeyError, OSError):
            return ""

    @contextmanager
    def quoting(self, tool: str, label: str, said: Callable[[str], str] | None = None) -> Iterator[None]:
        """A ToolFailed raised inside also quotes what `label`'s process said on standard error (tools
        that exit 0 after "Connection refused" say why only there); `said` picks the lines worth quoting."""
        try:
            yield
        except ToolFailed as e:
            text = self.error_text(label, 2000)
            text = said(text) if said else text[-300:]
            raise ToolFailed(f"{e}{f'; {tool} said: {text}' if text else ''}") from None


@dataclass
class TrialContext:
    """What a workload's ``start`` and ``measure`` get to know about the trial."""

    config: Any  # vnetbench.scenario.plan.Configuration
    endpoints: TrialEndpoints
    ip_version: int
    tmp: Path  # a directory of this trial, removed after it
    t0: float  # epoch seconds of the trial's clock zero
    extra_rtt_s: float = 0.0  # what the links' delay and jitter add to a round trip
    leader: Started | None = None  # for a workload `during` another: what the leader started
    leader_options: WorkloadOptions | None = None
    labels: dict[str, str] = field(default_factory=dict)  # output file stem ("0") -> label of its process
    # every process started, with the host it runs on and its stderr file: what each used in CPU (cpu_seconds)
    launched: list[tuple[subprocess.Popen, Any, Path]] = field(default_factory=list)

    def window(self, own_seconds: float, whole: bool = True) -> tuple[float, float]:
        """(trial-clock second it begins, seconds it lasts) for a workload that runs `own_seconds` on its
        own, or during a leader for the leader's measured time, ending half a second early so it sees only
        loaded time (`whole`: the tool takes whole seconds)."""
        if self.leader is None:
            return 0.0, float(int(own_seconds)) if whole else own_seconds
        seconds = self.leader.measured_s - 0.5
        return self.leader.measured_from, float(max(1, int(seconds))) if whole else max(1.0, seconds)

    def during(self, leader: Started, options: WorkloadOptions) -> "TrialContext":
        """This trial's context for a workload that accompanies `leader` (started with `options`): the same
        trial, clock and output files, with what the leader started to read."""
        return replace(self, leader=leader, leader_options=options)

    def popen(self, host: Any, label: str, argv: Sequence[str], pin: bool = True) -> tuple[subprocess.Popen, Path]:
        """Start `argv` on `host`; its output goes to new files in this trial's directory. They are named by
        the process' index in the trial (``0.out``, ``0.err``, ...), not by `label`: labels are workload and
        host names, which a scenario or an inventory chose. ``labels`` maps each file's stem to its label.
        The files must resolve inside the run's work directory, the trial directory's parent."""
        stem = str(len(self.labels))
        self.labels[stem] = label
        out = self.tmp / f"{stem}.out"
        proc = host.popen(argv, out, out.with_suffix(".err"), pin=pin, within=self.tmp.parent, timed=True)
        self.launched.append((proc, host, out.with_suffix(".err")))
        return proc, out

    def host_of(self, proc: subprocess.Popen) -> Any:
        """The host a process this trial started runs on."""
        return next(host for p, host, _ in self.launched if p is proc)

    def cpu_seconds(self, proc: subprocess.Popen) -> float | None:
        """The CPU seconds a process this trial started used (None: not known), once it has ended."""
        return next((host.cpu_seconds(p, err) for p, host, err in self.launched if p is proc), None)


class Workload:
    """One tool's driver. Subclasses set the class attributes and implement ``start`` and ``measure``."""

    tool: ClassVar[str]
    Options: ClassVar[type[WorkloadOptions]]
    requires: ClassVar[tuple[Tool, ...]] = ()  # binaries on the endpoints, with their Debian packages
    metrics: ClassVar[tuple[Metric, ...]] = ()
    can_lead: ClassVar[bool] = True  # may run on its own
    can_accompany: ClassVar[bool] = True  # may run `during` another workload
    from_leader_start: ClassVar[bool] = False  # during another: start with it, not after its warm-up
    # Its server serves one client at a time (iperf3): two of its workloads running at once need different
    # (client, server) pairs, each on a port of its own (TrialEndpoints.slots).
    one_client_at_a_time: ClassVar[bool] = False
    guest_tools: ClassVar[tuple[str, ...]] = ()  # commands a VM guest must carry (default: requires')
    # It watches the path rather than loads it (a latency probe, a sampler): beside a leader, the CPU its own
    # processes use is the instruments' (cpu.probe_pct), and the trial's CPU cost is counted without it.
    instrument: ClassVar[bool] = False

    def problems(self, options: WorkloadOptions, lab: Any) -> list[str]:
        """What makes these options impossible in this lab (checked for every configuration before
        anything is built): each a sentence saying what to change."""
        return []

    def timing(self, options: WorkloadOptions, config: Any) -> tuple[float, float]:
        """(warm-up seconds, measured seconds) when it runs on its own."""
        raise NotImplementedError

    def memory_bytes(self, options: WorkloadOptions) -> int:
        """Memory the tool allocates on its node while it runs, beyond its own binary: checked against a
        guest's memory and a container's limit before anything is built (0: too little to matter)."""
        return 0

    def servers(self, hosts: TrialEndpoints, ip_version: int, options: list[WorkloadOptions],
                workdir: str) -> list[ServerSpec]:
        """Servers kept on the endpoints for the whole run (restarted after a failed trial), for every
        distinct `options` of this tool in the run's configurations; `workdir` is a directory of the run's
        (removed at teardown) that a server may create and use, on whatever node it runs."""
        return []

    def start(self, name: str, options: WorkloadOptions, ctx: TrialContext) -> Started:
        raise NotImplementedError

    def measure(self, started: Started, options: WorkloadOptions, ctx: TrialContext,
                outputs: dict[str, str]) -> Measurement:
        """Parse what the clients printed; raise ToolFailed (quoting the tool) when there is no result."""
        raise NotImplementedError

    def raw(self, started: Started, outputs: dict[str, str]) -> dict[str, str]:
        """What of the output is kept with the trial (default: all of it)."""
        return outputs

    def exit_problem(self, started: Started) -> str | None:
        """Why the trial failed if a client exited badly although its output parsed (default: any
        non-zero exit of a process it did not ask the runner to stop)."""
        if started.stopped_by_runner:
            return None
        bad = {label: p.returncode for label, p in started.procs.items() if p.returncode not in (0, None)}
        if not bad:
            return None
        return "; ".join(f"{self.tool} on {label} exited {rc}" for label, rc in bad.items())
