"""What watches a trial besides its workloads.

A trial is its workloads' phases with recorders around them: each recorder is started right before the first
phase, stopped right after the last (every tool has ended or been stopped), and then asked for what it saw:
what goes with the trial's raw record, and the metrics it measured. A recorder reads counters the trial's
traffic moves; it starts nothing the workloads would see.

- :class:`LinkRecorder`: the link backends (the emulator restarts with the trial's seed and schedule; what
  each link's model and queue counted);
- :class:`QdiscRecorder`: the lab's bottleneck port qdisc counters, where the links' backend counts no drops;
- :class:`EnvironmentRecorder`: an environment's own counters (an overlay's VXLAN devices);
- :class:`CpuRecorder`: what the CPUs of the machine the endpoints run on did (/proc/stat), and what a byte or a
  transaction cost in CPU time (netperf's service demand);
- :class:`MachinesCpuRecorder`: the same on the machines a run reaches through its nodes (SSH hosts), sampled
  there, with the receiver's and the senders' sides apart where they are different machines.

A bench gives the trial its recorders (``DumbbellBench.recorders``); a new kind of counter is one class here.
"""

from __future__ import annotations

import math
import os
import re
import threading
import time
from pathlib import Path
from typing import Any, Callable

from vnetbench.machine import threads_cpu_ns
from vnetbench.impair import tc
from vnetbench.lab.teardown import stop_groups, wait_metered
from vnetbench.impair.links import LinkManager, bottleneck_drops, link_metrics
from vnetbench.runner import foreign, pathcheck
from vnetbench.workloads.base import Measurement


Window = tuple[float, float]  # epoch seconds: the trial's first workload's measured part (warm-up excluded)


class Recorder:
    """start(span_s) before the trial's first phase, stop() after its last, then collect(measurement, raw,
    window): the metrics it measured go into `measurement` (given only when the trial is ok, after the
    workloads' own metrics), its raw record into `raw` (kept always: a failed trial's counters say why it
    failed). `window` is when the trial's first workload measured (None when it measured nothing): what a
    recorder samples over time is judged over that span, as the workload's own numbers are."""

    def start(self, span_s: float) -> None:
        """Right before the first phase; `span_s` is how long the phases take together."""

    def stop(self) -> None:
        """Right after the last phase."""

    def collect(self, measurement: Measurement | None, raw: dict[str, Any], window: Window | None) -> None:
        """What was seen between start and stop."""

    def dropped(self) -> float:
        """Packets the declared conditions' own models and queues dropped in the trial: what can explain a
        trial that received nothing (runner/pathcheck.nothing_received)."""
        return 0.0


class LinkRecorder(Recorder):
    """The links: emulators restart with the trial's seed and schedule (a schedule's time 0 is the trial's
    start); what each link's backend counted, per direction, and the bottleneck's drops and the emulator's
    own measurements of it."""

    def __init__(self, links: LinkManager):
        self.links = links
        self.counters: dict[str, Any] = {}

    def start(self, span_s: float) -> None:
        self.links.start_trial(span_s)

    def stop(self) -> None:
        self.counters = self.links.end_trial()

    def collect(self, measurement: Measurement | None, raw: dict[str, Any], window: Window | None) -> None:
        raw["links"] = {name: c.per_direction for name, c in self.counters.items()}
        if measurement is None:
            return
        drops = bottleneck_drops(self.counters)
        if drops is not None:
            measurement.add("bottleneck.drops", drops)
        for metric, value in link_metrics(self.counters):
            measurement.add(metric, value)

    def dropped(self) -> float:
        return pathcheck.link_drops(self.counters)


class QdiscRecorder(Recorder):
    """The root qdisc of the lab's bottleneck port (the switch side of the receiver's link): its packets, drops
    and overlimits before and after. Its drops are the trial's ``bottleneck.drops`` when the links' backend
    counted none of its own (collect the links first)."""

    def __init__(self, iface: Any):
        self.iface = iface
        self.before: dict[str, int] = {}
        self.after: dict[str, int] = {}

    def start(self, span_s: float) -> None:
        self.before = tc.counters(self.iface)

    def stop(self) -> None:
        self.after = tc.counters(self.iface)

    def collect(self, measurement: Measurement | None, raw: dict[str, Any], window: Window | None) -> None:
        raw["bottleneck_counters"] = {"before": self.before, "after": self.after}
        if measurement is not None and not measurement.has("bottleneck.drops"):
            measurement.add("bottleneck.drops", self.after["drops"] - self.before["drops"])


class EnvironmentRecorder(Recorder):
    """An environment's own counters before and after (``counters()``; None where it keeps none)."""

    def __init__(self, env: Any):
        self.env = env
        self.before: Any = None
        self.after: Any = None

    def start(self, span_s: float) -> None:
        self.before = self.env.counters()

    def stop(self) -> None:
        self.after = self.env.counters()

    def collect(self, measurement: Measurement | None, raw: dict[str, Any], window: Window | None) -> None:
        if self.before is not None:
            raw["environment_counters"] = {"before": self.before, "after": self.after}


# /proc/stat's per-CPU counters, in clock ticks (USER_HZ); guest time is counted inside user as well.
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq")  # idle, iowait and steal are not this machine's work
CPU_SAMPLE_S = 0.05  # 20 reads a second: the window's edges within 50 ms; a read costs ~30 us
CPU_MIN_WINDOW_S = 0.5  # shorter, and a 10 ms tick is more than 2 % of a core: not judged
KB = 1024  # netperf's service demand is microseconds of CPU per KB (1024 bytes)
# Where the trial's rate of transactions is, for cpu.us_per_transaction: the first a trial measured.
TRANSACTION_RATES = ("rr.transactions_per_s", "http.requests_per_s", "ab.requests_per_s")


def parse_proc_stat(text: str) -> dict[str, tuple[int, ...]]:
    """Per CPU ("cpu0", "cpu1", ...) its STAT_FIELDS counters from /proc/stat (missing ones, on old kernels, 0)."""
    out = {}
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if name.startswith("cpu") and name != "cpu":
            values = [int(v) for v in rest.split()[:len(STAT_FIELDS)]]
            out[name] = tuple(values + [0] * (len(STAT_FIELDS) - len(values)))
    return out


def polling_as_idle(counters: dict[str, tuple[int, ...]],
                    polled_ns: dict[str, int]) -> dict[str, tuple[float, ...]]:
    """/proc/stat's counters with the time idle cores spent polling (`polled_ns`, per CPU, since the pollers
    started: vnetbench.lab.idle) moved from `nice`, where the niced pollers are counted, to `idle`. Only the
    differences between samples are ever read, so a count since any start will do."""
    out: dict[str, tuple[float, ...]] = dict(counters)
    nice, idle = STAT_FIELDS.index("nice"), STAT_FIELDS.index("idle")
    for cpu, ns in polled_ns.items():
        if cpu in out:
            values = list(out[cpu])
            ticks = ns * CLOCK_TICKS / 1e9
            values[nice] -= ticks
            values[idle] += ticks
            out[cpu] = tuple(values)
    return out


def read_local_stat() -> str:
    return Path("/proc/stat").read_text()


def thread_times(pid: int, proc: Path = Path("/proc")) -> dict[str, int]:
    """Per kind of thread of process `pid`, the CPU time its live threads have had so far, in nanoseconds (each
    thread's /proc/<pid>/task/<tid>/schedstat, the scheduler's own count, finer than stat's 10 ms ticks). A
    thread's kind is its name with its standalone numbers folded (QEMU's "CPU 0/TCG" and "CPU 1/TCG" are "CPU #/TCG",
    its vhost workers "vhost-#"). Empty when the process is gone."""
    out: dict[str, int] = {}
    for name, ns in threads_cpu_ns(pid, proc):
        kind = re.sub(r"\b\d+\b", "#", name)  # "CPU 0/TCG", "vhost-1234"; not "qemu-system-x86"
        out[kind] = out.get(kind, 0) + ns
    return out


def parts_times(parts: dict[str, list[Any]], proc: Path = Path("/proc")) -> dict[str, tuple[int, ...]]:
    """For :func:`counters_at`: "part/kind" -> (nanoseconds,) over each part's sources: a process (its pid:
    its threads by kind) or a cgroup's CPU account (lab/cgroups.CpuAccount: its label is the kind)."""
    out: dict[str, tuple[int, ...]] = {}

    def add(key: str, ns: int) -> None:
        out[key] = (out.get(key, (0,))[0] + ns,)

    for part, sources in parts.items():
        for source in sources:
            if isinstance(source, int):
                for kind, ns in thread_times(source, proc).items():
                    add(f"{part}/{kind}", ns)
            elif (ns := source.ns()) is not None:
                add(f"{part}/{source.label}", ns)
    return out


def parts_pct(samples: list[tuple[float, dict[str, tuple[int, ...]]]],
              window: Window) -> dict[str, dict[str, float]] | None:
    """Per part, per kind of thread, its CPU over `window` in cores x 100 (None: too short). A kind missing from
    a sample had no live thread then: 0 so far (a thread that starts within the window counts from its
    start; one that ends takes its time with it, and its kind counts no less than 0)."""
    span = judged_span(samples, window)
    if span is None:
        return None
    a, b = span
    keys = {k for _, s in samples for k in s}
    filled = [(t, {k: s.get(k, (0,)) for k in keys}) for t, s in samples]
    before, after = counters_at(filled, a), counters_at(filled, b)
    out: dict[str, dict[str, float]] = {}
    for key in sorted(keys):
        part, _, kind = key.partition("/")
        out.setdefault(part, {})[kind] = round(max(0.0, after[key][0] - before[key][0]) / 1e9 / (b - a) * 100, 2)
    return out


class CpuRecorder(Recorder):
    """The CPUs of the machine the endpoints run on, sampled from /proc/stat every CPU_SAMPLE_S while the trial
    runs, judged over the window its first workload measured (counters interpolated at its edges):

    - ``cpu.util_pct``: busy CPU (user, nice, system, irq, softirq) in cores x 100 (200 = two cores busy), less
      what the trial's instruments' own processes used (``cpu.probe_pct``, measured by the bench, collected
      before this recorder);
    - ``cpu.softirq_pct``, ``cpu.steal_pct``: the share of it in softirq, and the time the hypervisor took;
    - ``cpu.us_per_kb`` (streams) and ``cpu.us_per_transaction`` (RR, HTTP): netperf's service demand, the busy
      CPU time over what the workload moved in the same window.

    The whole machine is measured, as netperf measures it: the endpoints, the link emulator's core, softirq
    work and whatever else runs there. How much of it was not the run's is ``cpu.foreign_pct`` (runner/foreign.py,
    over the whole trial: other users' processes, in cores x 100). Per CPU, the shares go with the trial's raw
    record ("cpu"), with the busiest foreign processes.

    Where the machine's time went is told by `parts`: what of the lab's machine carries what, by part
    ({"emulator": [pids], "qemu": [pids], "container": [cgroup CPU accounts]}), asked at the trial's start.
    Each part is sampled with /proc/stat and judged over the same window: ``cpu.<part>_pct``
    (``cpu.emulator_pct``, ``cpu.qemu_pct``, ``cpu.container_pct``), in cores x 100, less the instruments that
    ran in it (`part_of` says which part holds an endpoint's processes), and per kind in the raw record
    ("parts_pct": a guest's vCPU threads apart from its I/O threads, each container by endpoint; instruments
    included).

    `polled`: per CPU, the time the lab's pollers have spun there so far (vnetbench.lab.idle, on a kernel
    without a cpuidle driver): counted as the idle time it is, not as the `nice` time /proc/stat shows."""

    def __init__(self, where: str, read: Callable[[], str] = read_local_stat, interval: float = CPU_SAMPLE_S,
                 processes: Callable[[], dict[int, foreign.ProcTimes]] | None = foreign.scan,
                 parts: Callable[[], dict[str, list[Any]]] | None = None,
                 part_of: Callable[[str], str | None] | None = None,
                 polled: Callable[[], dict[str, int]] | None = None):
        self.where = where
        self.polled = polled
        self.read = read
        self.interval = interval
        self.processes = processes
        self.parts = parts
        self.part_of = part_of  # an endpoint -> the part its processes run in (an instrument's CPU is taken out)
        self._parts: dict[str, list[Any]] = {}
        self.part_samples: list[tuple[float, dict[str, tuple[int, ...]]]] = []
        self._procs_at_start: tuple[float, dict[int, foreign.ProcTimes]] | None = None
        self._foreign: foreign.ForeignLoad | None = None
        self.samples: list[tuple[float, dict[str, tuple[int, ...]]]] = []
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        now = time.time()
        counters = parse_proc_stat(self.read())
        if self.polled is not None:
            counters = polling_as_idle(counters, self.polled())
        self.samples.append((now, counters))
        if self._parts:
            self.part_samples.append((now, parts_times(self._parts)))

    def _sampling(self) -> None:
        while not self._done.wait(self.interval):
            self._sample()

    def start(self, span_s: float) -> None:
        self.samples, self.part_samples = [], []
        # Asked now, after the links' recorder has (re)started the trial's emulators.
        self._parts = {part: sources for part, sources in (self.parts() if self.parts else {}).items() if sources}
        self._foreign = None
        self._procs_at_start = (time.time(), self.processes()) if self.processes is not None else None
        self._sample()
        self._done.clear()
        self._thread = threading.Thread(target=self._sampling, name="cpu sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
        if self._procs_at_start is not None and self.processes is not None:
            t0, before = self._procs_at_start
            self._foreign = foreign.foreign_load(before, self.processes(), time.time() - t0)

    def at(self, t: float) -> dict[str, list[float]]:
        """The counters at epoch `t`, interpolated between the samples around it."""
        return counters_at(self.samples, t)

    def shares(self, window: Window) -> dict[str, dict[str, float]] | None:
        """Per CPU, the percent of its time in each STAT_FIELDS state over `window` (None: too short)."""
        return shares_over(self.samples, window)

    def collect(self, measurement: Measurement | None, raw: dict[str, Any], window: Window | None) -> None:
        if window is None or len(self.samples) < 2:
            return
        per_cpu = self.shares(window)
        if per_cpu is None:
            return
        raw["cpu"] = {"where": self.where, "window_s": round(window[1] - window[0], 3), "samples": len(self.samples),
                      "per_cpu_pct": per_cpu}
        if self._foreign is not None:
            raw["cpu"]["foreign"] = {"pct": round(self._foreign.pct, 2),
                                     "top": [{"command": c, "pid": pid, "pct": pct} for c, pid, pct in self._foreign.top]}
        machine = busy_pct(per_cpu)
        raw["cpu"]["busy_pct"] = round(machine, 2)  # the instruments' own included
        parts = parts_pct(self.part_samples, window) if self._parts else None
        if parts:
            raw["cpu"]["parts_pct"] = parts
        if measurement is None:
            return
        if self._foreign is not None:
            measurement.add("cpu.foreign_pct", self._foreign.pct)
        # Every instrument ran on this machine: its processes, or the guest or container that ran them.
        add_cpu_metrics(measurement, max(0.0, machine - (measurement.value("cpu.probe_pct") or 0.0)), per_cpu)
        instruments: dict[str, float] = {}
        for endpoint, pct in raw.get("instruments_cpu_pct", {}).items():
            if (part := self.part_of(endpoint) if self.part_of else None) is not None:
                instruments[part] = instruments.get(part, 0.0) + pct
        for part, kinds in (parts or {}).items():
            measurement.add(f"cpu.{part}_pct", max(0.0, sum(kinds.values()) - instruments.get(part, 0.0)))


def counters_at(samples: list[tuple[float, dict[str, tuple[int, ...]]]], t: float) -> dict[str, list[float]]:
    """/proc/stat's counters at epoch `t`, interpolated between the (epoch, counters) samples around it."""
    times = [s[0] for s in samples]
    i = max(1, min(len(times) - 1, next((k for k, x in enumerate(times) if x >= t), len(times) - 1)))
    (t0, c0), (t1, c1) = samples[i - 1], samples[i]
    f = 0.0 if t1 <= t0 else min(1.0, max(0.0, (t - t0) / (t1 - t0)))
    return {cpu: [a + f * (b - a) for a, b in zip(c0[cpu], c1[cpu])] for cpu in c0 if cpu in c1}


def judged_span(samples: list[tuple[float, Any]], window: Window) -> Window | None:
    """The part of `window` the samples cover, None when it is shorter than CPU_MIN_WINDOW_S (or fewer than two
    samples): what a sampled counter is judged over."""
    if len(samples) < 2:
        return None
    a, b = max(window[0], samples[0][0]), min(window[1], samples[-1][0])
    return (a, b) if b - a >= CPU_MIN_WINDOW_S else None


def shares_over(samples: list[tuple[float, dict[str, tuple[int, ...]]]],
                window: Window) -> dict[str, dict[str, float]] | None:
    """Per CPU, the percent of its time in each STAT_FIELDS state over `window` (None: too short, or fewer
    than two samples)."""
    span = judged_span(samples, window)
    if span is None:
        return None
    before, after = counters_at(samples, span[0]), counters_at(samples, span[1])
    out = {}
    for cpu in before:
        # never below 0: /proc/stat's ticks and the pollers' scheduler time (polling_as_idle) are two clocks
        delta = [max(0.0, y - x) for x, y in zip(before[cpu], after[cpu])]
        total = sum(delta)
        if total > 0:
            out[cpu] = {f: round(100 * d / total, 2) for f, d in zip(STAT_FIELDS, delta)}
    return out or None


def cpu_inside(cpu_s: float, start: float, end: float, window: Window) -> float:
    """Of a process's `cpu_s` CPU seconds over its life [start, end], the part inside `window`, its time spread
    evenly over its life (all a process's rusage or `times` says)."""
    return cpu_s * max(0.0, min(end, window[1]) - max(start, window[0])) / max(end - start, 1e-3)


def busy_pct(per_cpu: dict[str, dict[str, float]]) -> float:
    """Busy CPU (BUSY_FIELDS) over every CPU of `per_cpu`, in cores x 100."""
    return sum(shares[f] for shares in per_cpu.values() for f in BUSY_FIELDS)


def add_cpu_metrics(measurement: Measurement, busy: float, per_cpu: dict[str, dict[str, float]]) -> None:
    """cpu.util_pct, softirq, steal and the service demand from the busy CPU of the machine(s) (`busy`,
    cores x 100, vnetbench's own sampler and the trial's instruments already taken out: a ping below a 10 ms
    interval spins a core while it waits for nothing, which is not the traffic's cost) and their per-CPU
    shares."""
    measurement.add("cpu.util_pct", busy)
    measurement.add("cpu.softirq_pct", sum(shares["softirq"] for shares in per_cpu.values()))
    measurement.add("cpu.steal_pct", sum(shares["steal"] for shares in per_cpu.values()))
    busy_us_per_s = busy / 100 * 1e6
    rx_mbps = measurement.value("throughput.rx_mbps")
    if rx_mbps is not None:
        kb_per_s = rx_mbps * 1e6 / 8 / KB
        measurement.add("cpu.us_per_kb", busy_us_per_s / kb_per_s if kb_per_s > 0 else math.nan)
    rate = next((v for name in TRANSACTION_RATES if (v := measurement.value(name)) is not None), None)
    if rate is not None:
        measurement.add("cpu.us_per_transaction", busy_us_per_s / rate if rate > 0 else math.nan)


# A machine reached through a node (an SSH host): its /proc/stat sampled there by one shell loop for the whole
# trial, each sample stamped with the host's clock; two forks (date, cat) a sample. The loop's own CPU time (the
# exec wrapper's -t) is taken out of its machine's busy time.
REMOTE_SAMPLE_S = 0.2
REMOTE_STAT_LOOP = f'while :; do echo "vnb-t $(date +%s.%N)"; cat /proc/stat; sleep {REMOTE_SAMPLE_S}; done'
STAMP = "vnb-t "


def parse_stamped_stats(text: str, offset_s: float = 0.0) -> list[tuple[float, dict[str, tuple[int, ...]]]]:
    """The remote loop's samples as (controller epoch, counters): the host's stamp less its clock's offset
    (the host's clock minus the controller's). A sample the loop's end cut short (no "softirq" line, which
    /proc/stat ends with) is left out."""
    out = []
    for block in text.split(STAMP)[1:]:
        stamp, _, body = block.partition("\n")
        try:
            at = float(stamp) - offset_s
        except ValueError:
            continue
        counters = parse_proc_stat(body)
        if counters and "\nsoftirq " in f"\n{body}":
            out.append((at, counters))
    return out


# A sampler that forks only at its start (a TCG guest's forks cost milliseconds of its one emulated core: a loop
# forking `sleep` five times a second used 8-13 % of it, measured): a FIFO to wait on (held open for reading and
# writing, nothing ever written: `read -t` on it is a sleep without a process). Each sample is stamped with the
# machine's uptime, read by the shell itself; /proc/stat's interrupt and context-switch lines, long and unused,
# are left out. Busybox's shell is enough (the tools image's, a guest's).
UPTIME_SAMPLE_S = 0.2
UPTIME_STAT_LOOP = ('while :; do read -r up _ < /proc/uptime; echo "vnb-t $up"; '
                    'while read -r l; do case $l in intr*|ctxt*|btime*|processes*|procs_*) ;; *) echo "$l" ;; '
                    f'esac; done < /proc/stat; read -t {UPTIME_SAMPLE_S} -u 3 _; done')
WAIT_FIFO = 'f=/tmp/vnb-cpu-$$; mkfifo "$f" && exec 3<>"$f" && rm "$f" || exit 1; '
# A guest's: its uptime put on its own clock by one `date` at the start, between two uptime reads (GNU date by
# its path: busybox's shell runs its own applet for a bare `date`, whose seconds are whole).
GUEST_STAT_LOOP = (WAIT_FIFO + 'read -r u0 _ < /proc/uptime; d=$($(which date) +%s.%N); read -r u1 _ < /proc/uptime; '
                   'echo "vnb-boot $d $u0 $u1"; ' + UPTIME_STAT_LOOP)
# A cluster node's, from inside one of its pods (a pod's /proc/stat and /proc/uptime are its node's): the stamps
# are put on the controller's clock by the pod's measured uptime offset (PodNode.offset_s), the tools image's
# busybox date having whole seconds only.
NODE_STAT_LOOP = WAIT_FIFO + UPTIME_STAT_LOOP
# How long a trial waits for its samplers to take their first sample (an SSH session into a busy TCG guest takes a
# second or more, an exec through a cluster's API a few tenths): a sampler that starts after the measured window
# began cannot judge it.
SAMPLER_START_S = 10.0


def parse_uptime_stamped_stats(text: str, offset_s: float = 0.0) -> list[tuple[float, dict[str, tuple[int, ...]]]]:
    """A guest loop's samples (GUEST_STAT_LOOP) as (controller epoch, counters): each uptime stamp plus the
    guest's boot time on its own clock (the start's date less the mean of the uptimes read around it), less
    the guest clock's offset. Nothing without the start's line."""
    head, _, rest = text.partition("\n")
    fields = head.split()
    if len(fields) != 4 or fields[0] != "vnb-boot":
        return []
    try:
        boot = float(fields[1]) - (float(fields[2]) + float(fields[3])) / 2
    except ValueError:
        return []
    return parse_stamped_stats(rest, offset_s - boot)


class MachinesCpuRecorder(Recorder):
    """The CPUs of the machines a run reaches through its nodes (run --hosts): on each machine, one sampler
    loop (REMOTE_STAT_LOOP) through one of its nodes, judged over the trial's window as :class:`CpuRecorder`
    judges this machine's, less the sampler's own CPU and the trial's instruments that ran on the machine's
    hosts. Hosts with one boot id are one machine, counted once (two inventory hosts may be
    containers of one machine). Metrics: those of CpuRecorder over the machines together, and where the
    receiver's machine is not a sender's, ``cpu.rx_util_pct`` and ``cpu.tx_util_pct`` (netperf's remote and
    local sides). Raw: per machine its hosts, per-CPU shares, busy and the sampler's own share."""

    loop = REMOTE_STAT_LOOP  # the sampler each machine runs
    raw_key = "cpu"  # where the trial's raw record keeps what it saw
    where = "the hosts' machines"

    def __init__(self, receiver: Any, senders: list[Any], machine_of: dict[str, str], workdir: Path,
                 sides: bool = True):
        self.receiver, self.senders, self.workdir = receiver, senders, workdir
        self.machine_of = machine_of  # host name -> its machine (boot id)
        self.sides = sides  # whether the receiver is the only server (else no receiver/sender split)
        self.hosts: dict[str, list[str]] = {}  # machine -> the hosts on it, receiver first
        self.sampled_by: dict[str, Any] = {}  # machine -> the node its sampler runs on
        for node in [receiver, *senders]:
            machine = machine_of.get(node.name, node.name)
            if node.name not in self.hosts.setdefault(machine, []):
                self.hosts[machine].append(node.name)
            self.sampled_by.setdefault(machine, node)
        self._procs: dict[str, tuple[Any, Path, Path]] = {}
        self.samples: dict[str, list[tuple[float, dict[str, tuple[int, ...]]]]] = {}

    def parse(self, text: str, node: Any) -> list[tuple[float, dict[str, tuple[int, ...]]]]:
        return parse_stamped_stats(text, getattr(node, "offset_s", 0.0))

    def start(self, span_s: float) -> None:
        self._procs, self.samples = {}, {}
        for machine, node in self.sampled_by.items():
            base = self.workdir / f"cpu-{node.name}-{time.time_ns()}"
            out, err = base.with_suffix(".out"), base.with_suffix(".err")
            proc = node.popen(["sh", "-c", self.loop], out, err, pin=False, timed=True)
            self._procs[machine] = (proc, out, err)
        deadline = time.monotonic() + SAMPLER_START_S
        for proc, out, _ in self._procs.values():  # each loop's first sample taken before the trial starts
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    if STAMP in out.read_text(errors="replace"):
                        break
                except OSError:
                    pass
                time.sleep(0.02)

    def stop(self) -> None:
        procs = [proc for proc, _, _ in self._procs.values()]
        for proc in procs:  # the wrapper ends the loop when its input closes, and says the loop's CPU time
            if proc.stdin is not None and proc.poll() is None:
                proc.stdin.close()
        deadline = time.monotonic() + 5.0
        for proc in procs:
            try:
                wait_metered(proc, timeout=max(0.1, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 - stopped below
                pass
        stop_groups(procs, grace=1.0)
        for machine, (proc, out, _) in self._procs.items():
            node = self.sampled_by[machine]
            try:
                text = out.read_text(errors="replace")
            except OSError:
                text = ""
            self.samples[machine] = self.parse(text, node)

    def _own_pct(self, machine: str, window: Window) -> float:
        """The sampler loop's own CPU over `window`, in cores x 100 (its time spread evenly over its life)."""
        proc, _, err = self._procs[machine]
        cpu = self.sampled_by[machine].cpu_seconds(proc, err)
        start, end = getattr(proc, "started_at", None), getattr(proc, "ended_at", None) or time.time()
        if cpu is None or start is None or window[1] <= window[0]:
            return 0.0
        return 100 * cpu_inside(cpu, start, end, window) / (window[1] - window[0])

    def collect(self, measurement: Measurement | None, raw: dict[str, Any], window: Window | None) -> None:
        if window is None or not self.samples:
            return
        machines: dict[str, Any] = {}
        combined: dict[str, dict[str, float]] = {}
        busy: dict[str, float] = {}
        for machine, samples in self.samples.items():
            per_cpu = shares_over(samples, window)
            label = "+".join(self.hosts[machine])
            if per_cpu is None:
                machines[label] = {"samples": len(samples), "error": "too few samples over the window"}
                continue
            own = self._own_pct(machine, window)
            # the trial's instruments that ran on the machine's hosts (runner/bench.instruments_cpu)
            instruments = sum(raw.get("instruments_cpu_pct", {}).get(host, 0.0) for host in self.hosts[machine])
            busy[machine] = max(0.0, busy_pct(per_cpu) - own - instruments)
            machines[label] = {"hosts": self.hosts[machine], "samples": len(samples), "per_cpu_pct": per_cpu,
                               "busy_pct": round(busy[machine], 2), "sampler_pct": round(own, 2),
                               "instruments_pct": round(instruments, 2)}
            combined.update({f"{label}/{cpu}": shares for cpu, shares in per_cpu.items()})
        raw[self.raw_key] = {"where": self.where, "window_s": round(window[1] - window[0], 3),
                             "machines": machines}
        if measurement is None or len(busy) < len(self.samples):
            return  # a machine not judged: no total that leaves it out
        self.add_metrics(measurement, busy, combined)

    def add_metrics(self, measurement: Measurement, busy: dict[str, float],
                    combined: dict[str, dict[str, float]]) -> None:
        add_cpu_metrics(measurement, sum(busy.values()), combined)
        rx = self.machine_of.get(self.receiver.name, self.receiver.name)
        tx = {self.machine_of.get(n.name, n.name) for n in self.senders}
        if self.sides and rx not in tx and rx in busy and tx <= busy.keys():
            measurement.add("cpu.rx_util_pct", busy[rx])
            measurement.add("cpu.tx_util_pct", sum(busy[m] for m in tx))


class GuestsCpuRecorder(MachinesCpuRecorder):
    """The CPUs of the lab's guests seen from inside, each sampled by a loop of its own (GUEST_STAT_LOOP),
    judged over the trial's window less the loop's own CPU and the instruments that ran there. Metrics, over the guests together in cores x 100 of
    their vCPUs: ``cpu.guest_util_pct`` (busy), ``cpu.guest_softirq_pct``, ``cpu.guest_steal_pct`` (the time
    the host took from the vCPUs, as the guest's kernel counts it: KVM's steal time; 0 under TCG). The host's
    side of the same guests is ``cpu.qemu_pct`` (CpuRecorder's parts). Raw: "guest_cpu", per guest."""

    loop = GUEST_STAT_LOOP
    raw_key = "guest_cpu"
    where = "the guests, from inside"

    def __init__(self, guests: list[Any], workdir: Path):
        super().__init__(guests[0], guests[1:], {}, workdir)

    def parse(self, text: str, node: Any) -> list[tuple[float, dict[str, tuple[int, ...]]]]:
        return parse_uptime_stamped_stats(text, getattr(node, "offset_s", 0.0))

    def add_metrics(self, measurement: Measurement, busy: dict[str, float],
                    combined: dict[str, dict[str, float]]) -> None:
        measurement.add("cpu.guest_util_pct", sum(busy.values()))
        measurement.add("cpu.guest_softirq_pct", sum(shares["softirq"] for shares in combined.values()))
        measurement.add("cpu.guest_steal_pct", sum(shares["steal"] for shares in combined.values()))


class NodesCpuRecorder(MachinesCpuRecorder):
    """The CPUs of the nodes a cluster run's pods are on, each sampled by NODE_STAT_LOOP in one of its pods and
    judged as the hosts' machines are: ``cpu.util_pct`` over the nodes together, and ``cpu.rx_util_pct`` and
    ``cpu.tx_util_pct`` where the receiver's node is not a sender's. Nodes of one boot id are one machine,
    counted once (a test cluster's nodes on one kernel). The uptime stamps are put on the controller's clock
    by each pod's measured uptime offset (``offset_s``: its node's uptime less the controller's clock)."""

    loop = NODE_STAT_LOOP
    where = "the pods' nodes"
