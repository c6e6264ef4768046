"""TCP state sampling with ``ss -ti``: congestion window, smoothed RTT,
delivery rate and retransmissions of every flow, every 10-100 ms, as series.

Today's replacement for the tcpprobe module seed 001 used (chapter 4, window
scaling test). One long-lived shell loop per sending host runs next to the
flows, inside the host's namespace::

    T <epoch seconds with µs>            (bash's $EPOCHREALTIME: no fork)
    <ss -tinHO state established '( port range of iperf3 )'>   one line per socket
    ... every `interval`, drift-free (the sleep is what is left of the interval)

Only iperf3's *data* connections become series: they are matched by port with
the ``start.connected`` list of the client's JSON (the control connection
shares the server port but carries a few hundred bytes). Series are named
``ss.<quantity>/<host>:<port>`` with the data connection's client-side port.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable, Literal

import numpy as np
from pydantic import Field, field_validator

from vnetbench.metrics import HIGHER, LOSS_EVENT_COUNT_NOISE, LOWER, Metric
from vnetbench.quantities import Duration
from vnetbench.tools import SS
from vnetbench.workloads.base import Measurement, Started, ToolFailed, TrialContext, Workload, WorkloadOptions
from vnetbench.workloads.registry import register

MIN_INTERVAL = 0.010
MAX_INTERVAL = 0.100
PORT_LO, PORT_HI = 5201, 5299  # iperf3.BASE_PORT and up: one server port per sender
CONTROL_BYTES = 100_000  # without iperf3's port list: a connection that moved less is a control connection

_KV = re.compile(r"(?<![\w:(,])([a-z_]+):(\S+)")
_WORDVAL = re.compile(r"\b(send|pacing_rate|delivery_rate)\s+([0-9.]+)([kMG]?)bps")
_SCALE = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9}


def sampler_script(interval: float, lo: int = PORT_LO, hi: int = PORT_HI) -> str:
    """The bash loop (run with ``bash -c``) that prints timestamped ``ss`` snapshots."""
    if not MIN_INTERVAL - 1e-9 <= interval <= MAX_INTERVAL + 1e-9:
        raise ValueError(f"ss sampling interval {interval * 1e3:g} ms is outside 10..100 ms")
    iv = int(round(interval * 1e6))
    flt = f"( dport >= :{lo} and dport <= :{hi} ) or ( sport >= :{lo} and sport <= :{hi} )"
    return (
        f"f='{flt}'; iv={iv}; next=${{EPOCHREALTIME/./}}\n"
        "while :; do\n"
        "  printf 'T %s\\n' \"$EPOCHREALTIME\"\n"
        "  ss -tinHO state established \"$f\"\n"
        "  next=$((next + iv)); now=${EPOCHREALTIME/./}; d=$((next - now))\n"
        "  if [ \"$d\" -gt 0 ]; then sleep \"$(printf '0.%06d' \"$d\")\"; else next=$now; fi\n"
        "done\n"
    )


def sampler_command(interval: float) -> list[str]:
    return ["bash", "-c", sampler_script(interval)]


@dataclass
class Sample:
    t: float  # epoch seconds
    local: str
    peer: str
    info: dict[str, float | str]


@dataclass
class FlowSeries:
    local: str
    peer: str
    t: list[float] = field(default_factory=list)
    cwnd: list[float] = field(default_factory=list)  # segments
    srtt_ms: list[float] = field(default_factory=list)
    rttvar_ms: list[float] = field(default_factory=list)
    delivery_mbps: list[float] = field(default_factory=list)
    retrans: list[float] = field(default_factory=list)  # cumulative retransmitted segments
    bytes_retrans: list[float] = field(default_factory=list)
    bytes_acked: list[float] = field(default_factory=list)
    cc: str = ""
    mss: float = float("nan")

    @property
    def local_port(self) -> int:
        return _port(self.local)

    @property
    def peer_port(self) -> int:
        return _port(self.peer)


def _port(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def parse_info(text: str) -> dict[str, float | str]:
    """The info part of one ss socket line: numbers by key (rtt split in srtt/rttvar)."""
    out: dict[str, float | str] = {}
    tokens = text.split()
    if tokens and tokens[0].isalpha() and ":" not in tokens[0]:
        out["cc"] = tokens[0]
    for key, value in _KV.findall(text):
        if key == "rtt" and "/" in value:
            srtt, rttvar = value.split("/", 1)
            out["srtt_ms"], out["rttvar_ms"] = float(srtt), float(rttvar)
        elif key == "retrans" and "/" in value:
            cur, total = value.split("/", 1)
            out["retrans_now"], out["retrans"] = float(cur), float(total)
        else:
            try:
                out[key] = float(value)
            except ValueError:
                continue
    for key, num, scale in _WORDVAL.findall(text):
        out[f"{key}_bps"] = float(num) * _SCALE[scale]
    return out


def parse(text: str, t: float | None = None) -> list[Sample]:
    """Timestamped ``ss -tinH`` snapshots (the sampler's output) -> samples.

    Each ``T <epoch>`` line stamps the sockets after it. A socket is one line
    (``-O``, what the sampler asks for) or a header line followed by an
    indented info line (plain ``ss -ti``). Without any ``T`` line, `t` stamps
    everything (one snapshot).
    """
    samples: list[Sample] = []
    pending: tuple[str, str] | None = None  # a header whose info line is still to come
    for line in text.splitlines():
        if line.startswith("T "):
            try:
                t = float(line[2:].strip().replace(",", "."))
            except ValueError:
                t = None
            pending = None
            continue
        if t is None or not line.strip():
            continue
        if line[0] in " \t":
            if pending is not None:
                samples.append(Sample(t, pending[0], pending[1], parse_info(line)))
                pending = None
            continue
        fields = line.split(None, 4)
        # With a state filter the State column is absent: Recv-Q Send-Q Local Peer [info];
        # without one it comes first (ESTAB ...).
        if fields and not fields[0].isdigit():
            fields = line.split(None, 5)[1:]
        if len(fields) < 4 or ":" not in fields[2] or ":" not in fields[3]:
            continue
        if len(fields) > 4 and fields[4].strip():
            samples.append(Sample(t, fields[2], fields[3], parse_info(fields[4])))
            pending = None
        else:
            pending = (fields[2], fields[3])
    return samples


def flows(samples: Iterable[Sample]) -> dict[tuple[str, str], FlowSeries]:
    out: dict[tuple[str, str], FlowSeries] = {}
    for s in samples:
        f = out.get((s.local, s.peer))
        if f is None:
            f = out[(s.local, s.peer)] = FlowSeries(s.local, s.peer)
        i = s.info
        f.t.append(s.t)
        f.cwnd.append(float(i.get("cwnd", np.nan)))
        f.srtt_ms.append(float(i.get("srtt_ms", np.nan)))
        f.rttvar_ms.append(float(i.get("rttvar_ms", np.nan)))
        f.delivery_mbps.append(float(i.get("delivery_rate_bps", np.nan)) / 1e6)
        f.retrans.append(float(i.get("retrans", 0.0)))
        f.bytes_retrans.append(float(i.get("bytes_retrans", 0.0)))
        f.bytes_acked.append(float(i.get("bytes_acked", 0.0)))
        if isinstance(i.get("cc"), str):
            f.cc = str(i["cc"])
        if "mss" in i:
            f.mss = float(i["mss"])
    return out


def data_flows(all_flows: dict[tuple[str, str], FlowSeries], data_ports: set[int] | None) -> list[FlowSeries]:
    """The iperf3 data connections: those whose client port iperf3 listed (either end,
    so it works on the receiver with --reverse), else those that moved real data."""
    if data_ports:
        return [f for f in all_flows.values() if f.local_port in data_ports or f.peer_port in data_ports]
    return [f for f in all_flows.values() if max(f.bytes_acked, default=0.0) >= CONTROL_BYTES]


def client_port(f: FlowSeries) -> int:
    """The data connection's client-side (ephemeral) port, whichever end we sampled."""
    return f.peer_port if PORT_LO <= f.local_port <= PORT_HI else f.local_port


def measure(outputs: dict[str, str], t0: float, data_ports: set[int] | None = None,
            window: tuple[float, float] | None = None) -> Measurement:
    """Series per data flow (trial clock: seconds since `t0`) and per-trial metrics.

    `outputs`: host name -> its sampler output. `window` (seconds on the trial
    clock) bounds the samples the per-trial metrics use (e.g. after iperf3's
    omit period); the series keep every sample.
    """
    m = Measurement()
    chosen: list[tuple[str, FlowSeries]] = []
    for host, text in outputs.items():
        for f in data_flows(flows(parse(text)), data_ports):
            chosen.append((host, f))
    if not chosen:
        n = sum(len(parse(t)) for t in outputs.values())
        raise ToolFailed(f"ss sampled no iperf3 data connection ({n} socket samples in "
                         f"{', '.join(outputs) or 'no host'}): {next(iter(outputs.values()), '')[-200:]!r}")
    srtt_w, cwnd_medians, retrans = [], [], 0.0
    for host, f in sorted(chosen, key=lambda x: (x[0], client_port(x[1]))):
        name = f"{host}:{client_port(f)}"
        t = np.asarray(f.t) - t0
        m.add_series(f"ss.cwnd_segments/{name}", "segments", t, f.cwnd)
        m.add_series(f"ss.srtt_ms/{name}", "ms", t, f.srtt_ms)
        m.add_series(f"ss.delivery_rate_mbps/{name}", "Mbit/s", t, f.delivery_mbps)
        m.add_series(f"ss.retrans/{name}", "segments", t, f.retrans)
        keep = np.ones(len(t), dtype=bool) if window is None else (t >= window[0]) & (t <= window[1])
        s = np.asarray(f.srtt_ms)[keep]
        srtt_w.append(s[np.isfinite(s)])
        c = np.asarray(f.cwnd)[keep]
        c = c[np.isfinite(c)]
        if len(c):
            cwnd_medians.append(float(np.median(c)))
        retrans += max(f.retrans, default=0.0)
    srtt = np.concatenate(srtt_w) if srtt_w else np.array([])
    if len(srtt):
        m.add("ss.srtt_p50_ms", float(np.percentile(srtt, 50)))
        m.add("ss.srtt_p99_ms", float(np.percentile(srtt, 99)))
    if cwnd_medians:
        m.add("ss.cwnd_median_segments", float(np.mean(cwnd_medians)))
    m.add("ss.retrans_segments", retrans)
    m.add("ss.samples_per_s", _rate_of_samples(chosen))
    return m


def _rate_of_samples(chosen: list[tuple[str, FlowSeries]]) -> float:
    rates = []
    for _, f in chosen:
        if len(f.t) >= 2 and f.t[-1] > f.t[0]:
            rates.append((len(f.t) - 1) / (f.t[-1] - f.t[0]))
    return float(np.mean(rates)) if rates else 0.0


# ------------------------------------------------------------ the workload


class Options(WorkloadOptions):
    """TCP state of the stream's flows (cwnd, smoothed RTT, delivery rate,
    retransmissions), sampled with ``ss -ti`` on the sending hosts every
    `interval` while another workload runs."""

    tool: Literal["ss"] = "ss"
    interval: Duration = Field(default=0.02, description="how often ss samples (10 ms to 100 ms; each sample is "
                               "one ss call)")
    during: str = Field(default="stream", description="the workload whose TCP flows it samples")

    @field_validator("interval")
    @classmethod
    def _interval(cls, v: float) -> float:
        if not MIN_INTERVAL - 1e-9 <= v <= MAX_INTERVAL + 1e-9:
            raise ValueError(f"{v * 1e3:g}ms: ss samples every 10ms to 100ms (each sample is one ss call)")
        return v


METRICS = (
    Metric("ss.srtt_p50_ms", "ms", LOWER, "Median smoothed RTT of the TCP senders, sampled with ss -ti"),
    Metric("ss.srtt_p99_ms", "ms", LOWER, "99th percentile smoothed RTT of the TCP senders, sampled with ss -ti",
           noise=0.10),
    Metric("ss.cwnd_median_segments", "segments", HIGHER, "Median congestion window (segments), mean over flows, "
                                                          "sampled with ss -ti"),
    Metric("ss.retrans_segments", "segments", LOWER, "Retransmitted segments (ss -ti retrans total), over flows",
           noise=LOSS_EVENT_COUNT_NOISE),
    Metric("ss.samples_per_s", "1/s", HIGHER, "ss -ti samples per second actually taken (sampler cadence)",
           noise=0.5),
)


@register
class Ss(Workload):
    """One sampler loop per host that sends the leader's data (its ``data_senders``), not pinned (it
    must not steal the flows' core), stopped when the leader ends. A leader without TCP flows (UDP)
    has no TCP state to sample: nothing is started."""

    tool = "ss"
    instrument = True
    Options = Options
    requires = (SS,)
    metrics = METRICS
    can_lead = False
    from_leader_start = True  # the flows' whole life, slow start included (seed 001's figure 4.8)

    def start(self, name: str, options: Options, ctx: TrialContext) -> Started:
        leader = ctx.leader
        started = Started(name, measured_from=leader.measured_from, measured_s=leader.measured_s,
                          ends_by=leader.ends_by, stopped_by_runner=True)
        if leader.info.get("proto", "tcp") != "tcp":
            return started
        for host in leader.info.get("data_senders", ctx.endpoints.senders):
            label = f"{name}-{host.name}"
            started.procs[host.name], started.outputs[host.name] = ctx.popen(
                host, label, sampler_command(options.interval), pin=False)
        return started

    def measure(self, started: Started, options: Options, ctx: TrialContext,
                outputs: dict[str, str]) -> Measurement:
        if not started.procs:
            return Measurement()
        leader = ctx.leader
        window = (leader.measured_from, leader.measured_from + leader.measured_s)
        return measure(outputs, t0=ctx.t0, data_ports=leader.info.get("data_ports"), window=window)

    def raw(self, started: Started, outputs: dict[str, str]) -> dict[str, str]:
        return {label: raw_excerpt(text) for label, text in outputs.items()}


def raw_excerpt(text: str, limit: int = 20000) -> str:
    """What of a sampler's output is kept with the trial: the start (it can be megabytes)."""
    return text if len(text) <= limit else text[:limit] + f"\n... ({len(text) - limit} more characters not kept)\n"
