"""iperf3: bulk TCP or UDP flows, one per active sender, all to the receiver.

Clients run with ``--get-server-output`` against servers started with ``-J``,
so each client's JSON also carries the receiver's per-second intervals. The
client measures the sending side, the server the receiver: received
throughput and loss come from the receiver, never from the sender's guess.

::

    [workload.stream]
    tool = "iperf3"
    proto = "udp"                              # or tcp
    duration = "20s"
    omit = "2s"                                # warm-up, not measured
    offered = "ratio * bottleneck / senders"   # per sender: a rate, 'unlimited', or arithmetic
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from vnetbench import units
from vnetbench.impair.links import staggered
from vnetbench.metrics import HIGHER, LOSS_EVENT_COUNT_NOISE, LOWER, Metric
from vnetbench.quantities import Duration, Size
from vnetbench.tools import IPERF3
from vnetbench.workloads.base import (Measurement, ServerSpec, Started, ToolFailed, TrialContext, TrialEndpoints,
                                      Workload, WorkloadOptions)
from vnetbench.workloads.registry import register

BASE_PORT = 5201  # one server per sender: 5201, 5202, ... (ss and the container NAT know the range)

# ------------------------------------------------------------------ options


# iperf3 3.12's own limits (it refuses more: "test duration too long (maximum = 86400 seconds)", "bogus value
# for --omit", "socket buffer size too large (maximum = 536870912 bytes)"), and it reads --time and --omit as
# whole seconds: 1.7 s runs 1 s, 0.5 s omits nothing. Checked here, so that a scenario fails when it is loaded,
# not as a wrong measurement.
MAX_DURATION_S = 86_400
MAX_OFFERED_LENGTH = 200  # an `offered` expression; longer ones are a mistake (and deep ones exhaust the parser)
MAX_OMIT_S = 600
MAX_WINDOW_BYTES = 536_870_912


def iperf3_seconds(v: float, what: str, least: int) -> float:
    if v != int(v) or not least <= v <= MAX_DURATION_S:
        raise ValueError(f"{v:g}s: iperf3 runs {what} in whole seconds, {least}s to {MAX_DURATION_S}s (a day); "
                         f"give e.g. {max(least, min(MAX_DURATION_S, round(v)))}s")
    return v


class FlowTiming(BaseModel):
    """When one sender's flow runs, relative to the trial's start."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    start: Duration = Field(default=0.0, description="when the flow starts, from the trial's start")
    duration: Duration | None = Field(default=None, description="how long it runs; default: the stream's "
                                      "duration")

    @field_validator("start")
    @classmethod
    def _start(cls, v: float) -> float:
        if v > MAX_DURATION_S:
            raise ValueError(f"{v:g}s: a flow starts within a day of the trial's start")
        return v

    @field_validator("duration")
    @classmethod
    def _whole(cls, v: float | None) -> float | None:
        return None if v is None else iperf3_seconds(v, "a flow", 1)


class Options(WorkloadOptions):
    """Bulk flows with iperf3, one per active sender, all to the receiver."""

    tool: Literal["iperf3"] = "iperf3"
    proto: Literal["udp", "tcp"] = Field(default="tcp", description="transport")
    duration: Duration = Field(default=10.0, description="each flow's measured time (whole seconds, 1 s to a day)")
    omit: Duration = Field(default=1.0, description="seconds at the start iperf3 leaves out (--omit; whole, up to "
                           "600 s)")
    ratio: float | None = Field(default=None, description="over-subscription ratio, used by `offered`")
    offered: str = Field(default="unlimited", description="per-sender target rate: a rate, 'unlimited', or an expression")
    congestion_control: str = Field(default="cubic", description="TCP congestion control (iperf3 --congestion)")
    length: Size | Literal["auto"] = Field(default="auto", description="bytes per write or datagram (iperf3 "
                                           "--length; UDP: 16 to 65507); auto: iperf3's own")
    parallel: int = Field(default=1, ge=1, le=128, description="flows per sender (iperf3 --parallel); the offered "
                          "rate is shared between them")
    reverse: bool = Field(default=False, description="the receiver sends (iperf3 --reverse)")
    timeout: Duration | Literal["auto"] = Field(default="auto", description="when a trial is given up; auto: "
                                                "omit + duration + 15 s")
    window: Size | None = Field(default=None, description="socket buffer / window (iperf3 --window): caps TCP at "
                                                          "window / RTT, the thesis' bandwidth-delay-product limit")
    flows: list[FlowTiming] = Field(default_factory=list, description="per sender, in order: when its flow starts "
                                    "and how long it runs, e.g. [{start=\"0s\", duration=\"30s\"}, "
                                    "{start=\"5s\", duration=\"15s\"}] (seed 001's window scaling test)")

    @property
    def span(self) -> float:
        """Seconds from the first flow's start to the last flow's end (omit not counted)."""
        return max([self.duration] + [f.start + (f.duration or self.duration) for f in self.flows])

    def timing(self, sender_index: int) -> tuple[float, float]:
        """(start delay, duration) of the i-th sender's flow."""
        if sender_index < len(self.flows):
            f = self.flows[sender_index]
            return f.start, f.duration or self.duration
        return 0.0, self.duration

    @property
    def trial_timeout(self) -> float:
        """iperf3 runs omit + duration seconds; "auto" leaves room for connection set-up and teardown."""
        return self.omit + self.span + 15.0 if self.timeout == "auto" else self.timeout

    @field_validator("ratio")
    @classmethod
    def _ratio(cls, v: float | None) -> float | None:
        if v is not None and v <= 0:
            raise ValueError(f"{v}: an over-subscription ratio must be above 0")
        return v

    @field_validator("duration")
    @classmethod
    def _duration(cls, v: float) -> float:
        return iperf3_seconds(v, "its flows", 1)

    @field_validator("omit")
    @classmethod
    def _omit(cls, v: float) -> float:
        if v != int(v) or v > MAX_OMIT_S:
            raise ValueError(f"{v:g}s: iperf3 omits whole seconds, 0s to {MAX_OMIT_S}s; give e.g. "
                             f"{min(MAX_OMIT_S, round(v))}s")
        return v

    @field_validator("window")
    @classmethod
    def _window(cls, v: float | None) -> float | None:
        if v is not None and not 1024 <= v <= MAX_WINDOW_BYTES:
            raise ValueError(f"{v:g} B: iperf3 takes a window (socket buffer) of 1 KiB to 512 MiB")
        return v

    @field_validator("offered", mode="before", json_schema_input_type=str | float)
    @classmethod
    def _offered(cls, v: Any) -> Any:
        # a bare number is a rate in bit/s (as everywhere else), written the way the expression reads it
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            try:
                finite = math.isfinite(v)
            except OverflowError:  # an integer of hundreds of digits is beyond a float too
                finite = False
            if not finite:
                raise ValueError(f"{units.brief(v)} is not a finite rate: give a rate (e.g. '50Mbit') or 'unlimited'")
            return repr(v)
        if isinstance(v, str) and len(v) > MAX_OFFERED_LENGTH:
            raise ValueError(f"an expression of {len(v)} characters: write offered in at most "
                             f"{MAX_OFFERED_LENGTH} (e.g. 'ratio * bottleneck / senders')")
        return v

    @field_validator("congestion_control")
    @classmethod
    def _cc(cls, v: str) -> str:
        if not v.isidentifier():
            raise ValueError(f"{units.brief(v)} is not a congestion control name (e.g. cubic, reno, bbr)")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "Options":
        if self.omit >= self.duration:
            raise ValueError(f"omit ({self.omit:g}s) must be shorter than duration ({self.duration:g}s)")
        if self.timeout != "auto" and self.timeout <= self.span + self.omit:
            raise ValueError(f"timeout ({self.timeout:g}s) must be longer than omit + duration "
                             f"({self.omit + self.span:g}s), or every trial would time out")
        for i, f in enumerate(self.flows):
            if (f.duration or self.duration) <= self.omit:
                raise ValueError(f"flows[{i}] lasts {f.duration or self.duration:g}s, not longer than omit "
                                 f"({self.omit:g}s): "
                                 "it would measure nothing")
        if self.length != "auto" and self.proto == "udp" and not 16 <= self.length <= 65507:
            raise ValueError(f"length {self.length:g} B: a UDP datagram carries 16 to 65507 bytes")
        return self


# ------------------------------------------------------------------ metrics

METRICS = (
    Metric("throughput.offered_mbps", "Mbit/s", HIGHER, "Offered load: the sum of the senders' target rates"),
    Metric("throughput.tx_mbps", "Mbit/s", HIGHER, "Sent throughput, summed over flows (sender side, iperf3)"),
    Metric("throughput.rx_mbps", "Mbit/s", HIGHER, "Received throughput (goodput), summed over flows (receiver side, iperf3)",
           nothing=0.0),
    Metric("flows.jain_fairness", "ratio", HIGHER, "Jain's fairness index of the flows' received throughput (1 = equal shares)"),
    Metric("udp.loss_ratio", "ratio", LOWER, "UDP packet loss ratio, lost / sent, over all flows (RFC 7680)", nothing=1.0),
    Metric("udp.lost_packets", "packets", LOWER, "UDP packets lost, over all flows"),
    Metric("udp.sent_packets", "packets", HIGHER, "UDP packets sent, over all flows"),
    Metric("udp.out_of_order_packets", "packets", LOWER, "UDP packets that arrived after a later one, over all "
                                                         "flows (iperf3's receiver): reordering on the path"),
    Metric("udp.jitter_rfc3550_ms", "ms", LOWER, "iperf3's jitter: RFC 3550 smoothed interarrival jitter (not IPDV), mean over flows"),
    Metric("tcp.retransmits", "segments", LOWER, "TCP retransmitted segments, over all flows (sender side)",
           noise=LOSS_EVENT_COUNT_NOISE),
    Metric("tcp.mean_srtt_ms", "ms", LOWER, "Mean smoothed RTT reported by the TCP sender, over intervals and flows"),
)


@dataclass(frozen=True)
class ClientSpec:
    server: str
    port: int
    proto: str  # udp | tcp
    duration: float
    omit: float
    rate_bps: float | None  # per stream target; None = unlimited (UDP: iperf3 needs a number, we give 0)
    congestion_control: str | None
    length: float | None
    parallel: int = 1
    reverse: bool = False
    ip_version: int = 4
    window: float | None = None  # socket buffer size (iperf3 --window): caps TCP at window / RTT


def server_command(port: int) -> list[str]:
    return ["iperf3", "--server", "--port", str(port), "--json"]


def client_command(spec: ClientSpec) -> list[str]:
    argv = ["iperf3", "--client", spec.server, "--port", str(spec.port), "--json", "--get-server-output",
            "--time", str(int(spec.duration)), "--omit", str(int(spec.omit)), "-" + str(spec.ip_version)]
    if spec.omit == 0:
        argv[argv.index("--omit"):argv.index("--omit") + 2] = []
    if spec.proto == "udp":
        argv.append("--udp")
        # iperf3's UDP default is 1 Mbit/s; "unlimited" is 0 (as fast as possible).
        argv += ["--bitrate", str(int(spec.rate_bps)) if spec.rate_bps else "0"]
    else:
        if spec.rate_bps:
            argv += ["--bitrate", str(int(spec.rate_bps))]
        if spec.congestion_control:
            argv += ["--congestion", spec.congestion_control]
    if spec.length:
        argv += ["--length", str(int(spec.length))]
    if spec.parallel > 1:
        argv += ["--parallel", str(spec.parallel)]
    if spec.reverse:
        argv.append("--reverse")
    if spec.window:
        argv += ["--window", str(int(spec.window))]
    return argv


@dataclass
class FlowResult:
    """One iperf3 client's numbers, in bits/s, packets and seconds."""

    proto: str
    sent_bps: float
    received_bps: float
    sent_bytes: float
    received_bytes: float
    sent_packets: int | None  # UDP: packets the receiver expected (sequence range after omit)
    received_packets: int | None  # UDP: packets that arrived
    lost_packets: int | None  # UDP: expected - arrived (RFC 7680 loss = lost / sent)
    jitter_ms: float | None  # UDP: RFC 3550 smoothed jitter, from the receiver
    retransmits: int | None  # TCP
    congestion_control: str | None
    rx_t: np.ndarray  # per-interval end times of the receiver, seconds
    rx_mbps: np.ndarray
    tx_t: np.ndarray
    tx_mbps: np.ndarray
    cwnd_bytes: np.ndarray | None
    srtt_ms: np.ndarray | None
    out_of_order: int | None = None  # UDP: packets that arrived after a later one, counted by the receiver


def _interval_sums(intervals: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    # Omitted (warm-up) intervals are dropped, and so is the receiver's short
    # tail interval (the few ms after the sender stopped): it is not a second.
    rows = [iv["sum"] for iv in intervals
            if not iv["sum"].get("omitted", False) and iv["sum"]["end"] - iv["sum"]["start"] >= 0.5]
    return (np.array([r["end"] for r in rows], dtype=float),
            np.array([r["bits_per_second"] / 1e6 for r in rows], dtype=float))


def parse_client(text: str) -> FlowResult:
    """Parse one client's ``-J --get-server-output`` document."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        # On bad arguments iperf3 prints one error line then its usage text: quote the start.
        snippet = " / ".join(text.strip().splitlines()[:2])[:300] or "(empty output)"
        raise ToolFailed(f"iperf3 printed no JSON: {snippet}") from None
    if doc.get("error"):
        raise ToolFailed(f"iperf3: {doc['error']}")
    end = doc.get("end") or {}
    test = (doc.get("start") or {}).get("test_start") or {}
    proto = str(test.get("protocol", "")).lower()
    sent = end.get("sum_sent") or end.get("sum")
    received = end.get("sum_received") or end.get("sum")
    if not sent or not received:
        raise ToolFailed("iperf3 JSON has no end.sum_sent/sum_received: the test did not finish")
    reverse = bool(test.get("reverse"))
    server = doc.get("server_output_json") or {}
    # Without --reverse the client sends; with it, the server does.
    sender_intervals = server.get("intervals", []) if reverse else doc.get("intervals", [])
    receiver_intervals = doc.get("intervals", []) if reverse else server.get("intervals", [])
    tx_t, tx_mbps = _interval_sums(sender_intervals)
    rx_t, rx_mbps = _interval_sums(receiver_intervals)

    sent_packets = received_packets = lost = out_of_order = None
    jitter = retransmits = None
    cwnd = srtt = None
    if proto == "udp":
        # Loss is counted where packets arrive. The receiver's own end.sum
        # (server_output_json) is consistent: "packets" is the sequence range it
        # expected after the omit period, "lost_packets" the gaps in it. The copy
        # of these counters in the client's sum_received is not (with --omit,
        # iperf3 3.12 mixes omitted and counted periods there), so it is used
        # only when the server's document is absent.
        rx_end = ((server.get("end") or {}).get("sum")) or received
        sent_packets = int(rx_end.get("packets", 0))
        lost = max(0, int(rx_end.get("lost_packets", 0)))
        received_packets = sent_packets - lost
        jitter = float(rx_end.get("jitter_ms", received.get("jitter_ms", 0.0)))
        # per stream only; the receiver's own document, as for loss (iperf3 counts a late packet out of order
        # and takes it off the lost ones)
        streams = ((server.get("end") or {}).get("streams")) or end.get("streams") or []
        counts = [st["udp"]["out_of_order"] for st in streams if "out_of_order" in (st.get("udp") or {})]
        out_of_order = int(sum(counts)) if counts else None
    else:
        retransmits = int(sent.get("retransmits", 0))
        streams = [iv["streams"] for iv in sender_intervals
                   if not iv["sum"].get("omitted", False) and iv["sum"]["end"] - iv["sum"]["start"] >= 0.5]
        if streams and "snd_cwnd" in streams[0][0]:
            cwnd = np.array([np.mean([s["snd_cwnd"] for s in ss]) for ss in streams], dtype=float)
            srtt = np.array([np.mean([s["rtt"] for s in ss]) / 1000.0 for ss in streams], dtype=float)
    cc = end.get("sender_tcp_congestion")
    return FlowResult(
        proto=proto,
        sent_bps=float(sent["bits_per_second"]),
        received_bps=float(received["bits_per_second"]),
        sent_bytes=float(sent["bytes"]),
        received_bytes=float(received["bytes"]),
        sent_packets=sent_packets,
        received_packets=received_packets,
        lost_packets=lost,
        jitter_ms=jitter,
        out_of_order=out_of_order,
        retransmits=retransmits,
        congestion_control=cc,
        rx_t=rx_t, rx_mbps=rx_mbps, tx_t=tx_t, tx_mbps=tx_mbps,
        cwnd_bytes=cwnd, srtt_ms=srtt,
    )


def jain_fairness(values: list[float]) -> float:
    """Jain's index (sum x)^2 / (n sum x^2): 1 when all flows get the same share."""
    x = np.asarray(values, dtype=float)
    if len(x) == 0 or not np.any(x):
        return float("nan")
    return float(x.sum() ** 2 / (len(x) * np.square(x).sum()))


def measure(flows: dict[str, FlowResult], offered_bps: float | None, t_offset: float = 0.0) -> Measurement:
    """Trial metrics over all flows (keyed by sending host), plus per-flow series.

    iperf3 restarts its interval clock after the omit period: `t_offset` (the
    omit time) puts the series on the trial's clock, like the ping series.
    """
    m = Measurement()
    values = list(flows.values())
    if offered_bps is not None:
        m.add("throughput.offered_mbps", offered_bps / 1e6)
    m.add("throughput.tx_mbps", sum(f.sent_bps for f in values) / 1e6)
    m.add("throughput.rx_mbps", sum(f.received_bps for f in values) / 1e6)
    if len(values) > 1:
        m.add("flows.jain_fairness", jain_fairness([f.received_bps for f in values]))
    udp = [f for f in values if f.proto == "udp"]
    if udp:
        sent = sum(f.sent_packets or 0 for f in udp)
        lost = sum(f.lost_packets or 0 for f in udp)
        m.add("udp.sent_packets", sent)
        m.add("udp.lost_packets", lost)
        m.add("udp.loss_ratio", lost / sent if sent else float("nan"))
        m.add("udp.jitter_rfc3550_ms", float(np.mean([f.jitter_ms or 0.0 for f in udp])))
        if all(f.out_of_order is not None for f in udp):
            m.add("udp.out_of_order_packets", sum(f.out_of_order or 0 for f in udp))
    tcp = [f for f in values if f.proto == "tcp"]
    if tcp:
        m.add("tcp.retransmits", sum(f.retransmits or 0 for f in tcp))
        srtts = [f.srtt_ms for f in tcp if f.srtt_ms is not None and len(f.srtt_ms)]
        if srtts:
            m.add("tcp.mean_srtt_ms", float(np.mean(np.concatenate(srtts))))
    for host, f in flows.items():
        m.add_series(f"throughput_mbps/{host}", "Mbit/s", f.rx_t + t_offset, f.rx_mbps)
        if f.cwnd_bytes is not None:
            m.add_series(f"cwnd_bytes/{host}", "bytes", f.tx_t + t_offset, f.cwnd_bytes)
            m.add_series(f"srtt_ms/{host}", "ms", f.tx_t + t_offset, f.srtt_ms)
    return m


def shift_series(m: Measurement, offsets: dict[str, float]) -> None:
    """Move each sending host's series by its flow's start delay (staggered flows keep
    their own iperf3 clock), onto the trial's clock."""
    for s in m.series:
        host = s.name.rsplit("/", 1)[-1]
        if offsets.get(host):
            s.t = s.t + offsets[host]


# ------------------------------------------------------------------ the driver


@register
class Iperf3(Workload):
    tool = "iperf3"
    Options = Options
    requires = (IPERF3,)
    metrics = METRICS
    # During another workload (a parking lot's cross flows during its long flow) it starts with it, so that the
    # flows compete from their first second.
    from_leader_start = True
    one_client_at_a_time = True  # an iperf3 server runs one test at a time: a port per client

    def timing(self, options: Options, config: Any) -> tuple[float, float]:
        return options.omit, options.span

    def servers(self, hosts: TrialEndpoints, ip_version: int, options: list[Options], workdir: str) -> list[ServerSpec]:
        ports = [BASE_PORT + hosts.slot(i) for i in range(len(hosts.senders))]
        return [ServerSpec(hosts.receiver, server_command(port), port, "tcp", f"iperf3-{port}") for port in ports]

    def start(self, name: str, options: Options, ctx: TrialContext) -> Started:
        config = ctx.config
        # During a leader it starts now, on the trial's clock (a leader's times the runner shifts itself).
        now = time.time() - ctx.t0 if ctx.leader is not None else 0.0
        started = Started(name, measured_from=now + options.omit, measured_s=options.span,
                          ends_by=now + options.trial_timeout)
        server = ctx.endpoints.receiver.service_address(ctx.ip_version)
        offered = config.offered_by.get(name, config.offered_bps)
        starts: dict[str, float] = {}
        ends: list[float] = []
        for i, host in enumerate(ctx.endpoints.senders):
            start, duration = options.timing(i)  # staggered flows: [workload.stream] flows
            starts[host.name] = start
            ends.append(start + options.omit + duration)
            spec = ClientSpec(
                server=server, port=BASE_PORT + ctx.endpoints.slot(i), proto=options.proto, duration=duration,
                omit=options.omit, window=options.window, rate_bps=offered / options.parallel if offered else None,
                congestion_control=options.congestion_control if options.proto == "tcp" else None,
                length=None if options.length == "auto" else options.length, parallel=options.parallel,
                reverse=options.reverse, ip_version=ctx.ip_version)
            proc, out = ctx.popen(host, host.name, staggered(client_command(spec), start))
            started.procs[host.name], started.outputs[host.name] = proc, out
        # What companions need: who sends the data (ss samples there), when each flow ends (the standing
        # queue after the first of staggered flows), on which TCP state (TCP or not).
        started.info.update(starts=starts, flow_ends=ends, proto=options.proto,
                            data_senders=[ctx.endpoints.receiver] if options.reverse else list(ctx.endpoints.senders))
        return started

    def measure(self, started: Started, options: Options, ctx: TrialContext,
                outputs: dict[str, str]) -> Measurement:
        flows = {label: parse_client(text) for label, text in outputs.items()}
        # What the sender's kernel really ran, as iperf3 reports it: the requested algorithm is a
        # parameter, this is the record (a sysctl or a missing module can make them differ).
        used = {label: f.congestion_control for label, f in flows.items() if f.congestion_control}
        if used:
            started.info["congestion_control_used"] = used
        asked = options.congestion_control if options.proto == "tcp" else None
        wrong = {n: cc for n, cc in used.items() if asked not in (None, cc)}
        if wrong:
            raise ToolFailed(f"congestion control {asked!r} was asked but the senders ran {wrong}")
        offered = ctx.config.offered_by.get(started.name, ctx.config.offered_bps)
        m = measure(flows, offered * len(flows) if offered else None, t_offset=options.omit)
        shift_series(m, started.info["starts"])
        started.info["data_ports"] = set().union(*(data_ports(text) for text in outputs.values()))
        return m

    def exit_problem(self, started: Started) -> str | None:
        bad = [label for label, p in started.procs.items() if p.returncode not in (0, None)]
        if not bad:
            return None
        return "; ".join(f"{label}: iperf3 exited {started.procs[label].returncode}: "
                         f"{started.error_text(label, 200)}" for label in bad)


def data_ports(client_json: str) -> set[int]:
    """Client-side ports of iperf3's data streams (its JSON ``start.connected``): the control
    connection shares the server port but is not one of them."""
    try:
        doc = json.loads(client_json)
    except (json.JSONDecodeError, TypeError):
        return set()
    return {int(c["local_port"]) for c in (doc.get("start") or {}).get("connected", []) if "local_port" in c}
