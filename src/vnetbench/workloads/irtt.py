"""irtt: UDP round trips at a fixed interval, with one-way delays, IPDV and loss per direction.

The first sender sends a small UDP packet every `interval` to an irtt server on
the receiver, which stamps and returns it; irtt's JSON (``-o -``) has every
round trip: its RTT, its send (up) and receive (down) delays, its IPDV and
whether it was lost on the way up or down. Everything here comes from those
per-packet records:

- RTT percentiles, mean, sd (RFC 2681), and the loss ratio (RFC 7680), also
  per direction and per second of the trial (a series);
- IPDV: the mean absolute difference of consecutive packets' delays (RFC 3393),
  of the round trip and of each one-way direction;
- ``irtt.jitter_rfc3550_ms``: RFC 3550's smoothed interarrival jitter of the
  upstream direction (J += (|D| - J) / 16), the figure a VoIP receiver reports:
  seed 004's streaming case is ``interval = "20ms"``, ``length = 172`` (G.711).

One-way delays need the two ends' clocks to agree: they do between namespaces
of one machine (one clock); a guest's clock is set from the host's at boot.

::

    [workload.voip]
    tool = "irtt"
    interval = "20ms"
    length = 172
    duration = "10s"
"""

from __future__ import annotations

import json
from typing import Any, Literal

import numpy as np
from pydantic import Field, field_validator

from vnetbench.metrics import LOWER, Metric
from vnetbench.quantities import Duration, Seconds
from vnetbench.tools import IRTT
from vnetbench.workloads.base import (Measurement, ServerSpec, Started, ToolFailed, TrialContext, TrialEndpoints,
                                      Workload, WorkloadOptions)
from vnetbench.workloads.registry import register

PORT = 5330  # inside the range the container model publishes
MIN_LENGTH, MAX_LENGTH = 60, 1472  # irtt's header with timestamps; one Ethernet frame of UDP over IPv4
OVERHEAD_S = 10.0  # beyond the duration: irtt's open handshake and its wait for the last replies


class Options(WorkloadOptions):
    """UDP round trips with irtt, first sender -> receiver."""

    tool: Literal["irtt"] = "irtt"
    interval: Duration = Field(default=0.01, description="one packet every interval (irtt -i)")
    length: int = Field(default=172, description="UDP payload bytes (irtt -l): 172 = a G.711 voice packet")
    duration: Seconds = Field(default=10.0, description="on its own: how long it sends; during another "
                                                         "workload it lasts that one's measured time")

    @field_validator("interval")
    @classmethod
    def _interval(cls, v: float) -> float:
        if not 1e-4 <= v <= 60:
            raise ValueError(f"{v * 1e3:g}ms: irtt sends every 0.1 ms to 60 s")
        return v

    @field_validator("length")
    @classmethod
    def _length(cls, v: int) -> int:
        if not MIN_LENGTH <= v <= MAX_LENGTH:
            raise ValueError(f"{v} B: an irtt packet with both ends' timestamps carries {MIN_LENGTH} to "
                             f"{MAX_LENGTH} bytes")
        return v



METRICS = (
    Metric("irtt.rtt_min_ms", "ms", LOWER, "Minimum UDP round-trip time (irtt, RFC 2681)"),
    Metric("irtt.rtt_mean_ms", "ms", LOWER, "Mean UDP round-trip time (irtt)"),
    Metric("irtt.rtt_stdev_ms", "ms", LOWER, "Standard deviation of UDP round-trip times (irtt)", noise=0.10),
    Metric("irtt.rtt_p50_ms", "ms", LOWER, "Median UDP round-trip time (irtt)"),
    Metric("irtt.rtt_p90_ms", "ms", LOWER, "90th percentile UDP round-trip time (irtt)"),
    Metric("irtt.rtt_p99_ms", "ms", LOWER, "99th percentile UDP round-trip time (irtt)", noise=0.10),
    Metric("irtt.rtt_max_ms", "ms", LOWER, "Maximum UDP round-trip time (irtt)", noise=0.10),
    Metric("irtt.send_delay_p50_ms", "ms", LOWER, "Median one-way delay sender -> receiver (irtt; clocks of one "
                                                  "machine, or a guest's synchronised at boot)"),
    Metric("irtt.receive_delay_p50_ms", "ms", LOWER, "Median one-way delay receiver -> sender (irtt)"),
    Metric("irtt.ipdv_ms", "ms", LOWER, "Mean absolute IPDV of consecutive round trips (RFC 3393, irtt)"),
    Metric("irtt.send_ipdv_ms", "ms", LOWER, "Mean absolute IPDV of the one-way delay sender -> receiver"),
    Metric("irtt.jitter_rfc3550_ms", "ms", LOWER, "RFC 3550 smoothed interarrival jitter, sender -> receiver "
                                                  "(what a voice receiver reports)"),
    Metric("irtt.loss_ratio", "ratio", LOWER, "UDP packets without a reply / sent (RFC 7680, irtt)", nothing=1.0),
    Metric("irtt.duplicate_packets", "packets", LOWER, "Replies received twice or more (irtt): duplication on "
                                                       "the path"),
    Metric("irtt.late_packets", "packets", LOWER, "Replies received after the reply to a later packet (irtt): "
                                                  "reordering on the path"),
    Metric("irtt.upstream_loss_ratio", "ratio", LOWER, "UDP packets lost sender -> receiver / sent (irtt)"),
    Metric("irtt.downstream_loss_ratio", "ratio", LOWER, "UDP replies lost receiver -> sender / replies sent "
                                                         "(irtt)"),
)


def server_command(address: str, ip_version: int) -> list[str]:
    bind = f"[{address}]:{PORT}" if ip_version == 6 else f"{address}:{PORT}"
    return ["irtt", "server", "-b", bind]


def client_command(options: Options, address: str, ip_version: int, seconds: float) -> list[str]:
    target = f"[{address}]:{PORT}" if ip_version == 6 else f"{address}:{PORT}"
    return ["irtt", "client", f"-{ip_version}", "-i", f"{options.interval * 1e3:g}ms", "-d", f"{seconds:g}s",
            "-l", str(options.length), "-Q", "-o", "-", target]


class Result:
    """irtt's round trips as arrays: ms, NaN where the packet or its reply was lost."""

    def __init__(self, doc: dict[str, Any]):
        trips = doc.get("round_trips") or []
        self.sent = len(trips)
        lost = [str(r.get("lost", "false")) for r in trips]
        self.lost_up = sum(x == "true_up" for x in lost)
        self.lost_down = sum(x == "true_down" for x in lost)
        self.lost = sum(x != "false" for x in lost)
        stats = doc.get("stats") or {}
        # Replies that came twice, and replies that came after one of a later packet (reordered on the way):
        # irtt's own counts, from its stats (absent in documents of older irtt versions).
        self.duplicates = stats.get("duplicates")
        self.late = stats.get("late_packets")

        def column(key: str) -> np.ndarray:
            return np.array([(r.get("delay") or {}).get(key, np.nan) / 1e6 if r.get("lost", "false") == "false"
                             else np.nan for r in trips], dtype=float)

        self.rtt_ms, self.send_ms, self.receive_ms = column("rtt"), column("send"), column("receive")
        wall = [((r.get("timestamps") or {}).get("client") or {}).get("send", {}).get("wall") for r in trips]
        first = next((w for w in wall if w), None)
        self.t = np.array([(w - first) / 1e9 if w and first else np.nan for w in wall], dtype=float)
        self.interval_s = (doc.get("config") or {}).get("params", {}).get("interval", 0) / 1e9


def parse(text: str) -> Result:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        snippet = " / ".join(x.strip() for x in text.strip().splitlines()[-2:])[-300:] or "(empty output)"
        raise ToolFailed(f"irtt printed no JSON: {snippet}") from None
    result = Result(doc)
    if result.sent == 0:
        raise ToolFailed("irtt sent no packet")
    return result


def mean_abs_ipdv(delays_ms: np.ndarray) -> float:
    """RFC 3393 IPDV between consecutive packets that both arrived, as a mean of absolute values."""
    d = np.diff(delays_ms)
    d = d[np.isfinite(d)]
    return float(np.mean(np.abs(d))) if d.size else float("nan")


def rfc3550_jitter(transit_ms: np.ndarray) -> float:
    """RFC 3550 section 6.4.1: J += (|D(i-1, i)| - J) / 16 over consecutive arrived packets."""
    j = 0.0
    previous = None
    for x in transit_ms:
        if not np.isfinite(x):
            continue
        if previous is not None:
            j += (abs(x - previous) - j) / 16.0
        previous = x
    return j


def measure_result(r: Result, t_offset: float = 0.0) -> Measurement:
    m = Measurement()
    rtt = r.rtt_ms[np.isfinite(r.rtt_ms)]
    m.add("irtt.loss_ratio", r.lost / r.sent)
    m.add("irtt.upstream_loss_ratio", r.lost_up / r.sent)
    replies = r.sent - r.lost_up
    m.add("irtt.downstream_loss_ratio", r.lost_down / replies if replies else float("nan"))
    if r.duplicates is not None:
        m.add("irtt.duplicate_packets", float(r.duplicates))
    if r.late is not None:
        m.add("irtt.late_packets", float(r.late))
    if rtt.size == 0:
        raise ToolFailed(f"irtt got no reply to any of {r.sent} packets")
    p50, p90, p99 = np.percentile(rtt, [50, 90, 99])
    m.add("irtt.rtt_min_ms", float(rtt.min()))
    m.add("irtt.rtt_mean_ms", float(rtt.mean()))
    m.add("irtt.rtt_stdev_ms", float(rtt.std()))
    m.add("irtt.rtt_p50_ms", float(p50))
    m.add("irtt.rtt_p90_ms", float(p90))
    m.add("irtt.rtt_p99_ms", float(p99))
    m.add("irtt.rtt_max_ms", float(rtt.max()))
    m.add("irtt.send_delay_p50_ms", float(np.nanmedian(r.send_ms)))
    m.add("irtt.receive_delay_p50_ms", float(np.nanmedian(r.receive_ms)))
    for name, delays in (("irtt.ipdv_ms", r.rtt_ms), ("irtt.send_ipdv_ms", r.send_ms)):
        value = mean_abs_ipdv(delays)
        if np.isfinite(value):
            m.add(name, value)
    m.add("irtt.jitter_rfc3550_ms", rfc3550_jitter(r.send_ms))
    t = r.t + t_offset
    ok = np.isfinite(r.rtt_ms) & np.isfinite(t)
    m.add_series("irtt_rtt_ms", "ms", t[ok], r.rtt_ms[ok])
    m.add_series("irtt_send_delay_ms", "ms", t[ok], r.send_ms[ok])
    m.add_series("irtt_receive_delay_ms", "ms", t[ok], r.receive_ms[ok])
    # loss per second of the trial: the streaming case's "loss per interval"
    if np.isfinite(r.t).any():
        second = np.floor(np.nan_to_num(r.t, nan=-1.0)).astype(int)
        lost = ~np.isfinite(r.rtt_ms)
        seconds = np.arange(0, second.max() + 1)
        per = np.array([lost[second == s].mean() if np.any(second == s) else np.nan for s in seconds])
        m.add_series("irtt_loss_ratio_per_s", "ratio", seconds + 1.0 + t_offset, per)
    return m


@register
class Irtt(Workload):
    tool = "irtt"
    instrument = True
    Options = Options
    requires = (IRTT,)
    metrics = METRICS

    def timing(self, options: Options, config: Any) -> tuple[float, float]:
        return 0.0, float(options.duration)

    def servers(self, hosts: TrialEndpoints, ip_version: int, options: list[Options], workdir: str) -> list[ServerSpec]:
        receiver = hosts.receiver
        return [ServerSpec(receiver, server_command(receiver.address(ip_version), ip_version), PORT, "udp", "irtt")]

    def start(self, name: str, options: Options, ctx: TrialContext) -> Started:
        begins, seconds = ctx.window(options.duration, whole=False)
        started = Started(name, measured_from=begins, measured_s=seconds, ends_by=begins + seconds + OVERHEAD_S)
        sender = ctx.endpoints.senders[0]
        argv = client_command(options, ctx.endpoints.receiver.service_address(ctx.ip_version), ctx.ip_version, seconds)
        started.procs[sender.name], started.outputs[sender.name] = ctx.popen(sender, name, argv)
        return started

    def measure(self, started: Started, options: Options, ctx: TrialContext,
                outputs: dict[str, str]) -> Measurement:
        label, text = next(iter(outputs.items()))
        with started.quoting("irtt", label):
            result = parse(text)
        return measure_result(result, t_offset=started.measured_from)

    def raw(self, started: Started, outputs: dict[str, str]) -> dict[str, str]:
        """irtt's summary statistics and configuration (the per-packet records are in the series)."""
        kept = {}
        for label, text in outputs.items():
            try:
                doc = json.loads(text)
                doc.pop("round_trips", None)
                kept[label] = json.dumps(doc)
            except json.JSONDecodeError:
                kept[label] = text[-4000:]
        return kept
