"""ping (iputils): command line and parsing of per-packet replies.

We keep every reply's RTT (``-D`` timestamps) instead of ping's closing
min/avg/max/mdev line: percentiles and IPDV need the packets, and the series
shows how the queue filled during the trial.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import Field, field_validator

from vnetbench.metrics import LOWER, Metric
from vnetbench.quantities import Duration, Seconds
from vnetbench.tools import PING
from vnetbench.workloads.base import Measurement, Started, ToolFailed, TrialContext, Workload, WorkloadOptions
from vnetbench.workloads.registry import register

_REPLY = re.compile(r"^\[(?P<ts>[0-9.]+)\] \d+ bytes from .*?icmp_seq=(?P<seq>\d+) .*?time=(?P<rtt>[0-9.]+) ms")
_SUMMARY = re.compile(r"(?P<tx>\d+) packets transmitted, (?P<rx>\d+) received(?:.*, time (?P<elapsed>\d+)ms)?")


def preload_for(interval: float, max_rtt_s: float) -> int:
    """How many requests may be outstanding so ping keeps its interval at this RTT.

    iputils ping stops sending while a few requests are unanswered: with 1 ms
    interval and a 40 ms queue it sends every ~10 ms instead of every 1 ms
    (measured: 211 requests in 2 s). ``-l N`` lifts that limit to N; those N go
    out back to back at the start (see :func:`own_queue_left_out`), so N is kept to
    what the RTT needs.
    """
    return max(1, min(1000, math.ceil(max_rtt_s / interval)))


def frame_bits(size: int, ip_version: int) -> int:
    """An echo request on the wire: payload, ICMP header, IP header, Ethernet header."""
    return (size + 8 + (20 if ip_version == 4 else 40) + 14) * 8


def command(target: str, interval: float, size: int, deadline: int, ip_version: int = 4,
            preload: int = 1) -> list[str]:
    # -w: stop after `deadline` whole seconds (iputils takes no fractions) whatever
    # happens: a lost reply must not extend the trial.
    argv = ["ping", f"-{ip_version}", "-D", "-n", "-i", f"{interval:g}", "-s", str(size), "-w", str(int(deadline))]
    if preload > 1:
        argv += ["-l", str(preload)]
    return argv + [target]


@dataclass
class PingResult:
    transmitted: int
    received: int
    timestamps: np.ndarray  # seconds since the epoch, per reply
    seq: np.ndarray
    rtt_ms: np.ndarray
    elapsed_ms: float | None = None  # ping's "time": from its first request to its last, in whole ms


def parse(text: str) -> PingResult:
    ts, seq, rtt = [], [], []
    transmitted = received = None
    elapsed: float | None = None
    for line in text.splitlines():
        m = _REPLY.match(line)
        if m:
            ts.append(float(m["ts"]))
            seq.append(int(m["seq"]))
            rtt.append(float(m["rtt"]))
            continue
        s = _SUMMARY.search(line)
        if s:
            transmitted, received = int(s["tx"]), int(s["rx"])
            elapsed = float(s["elapsed"]) if s["elapsed"] is not None else None
    if transmitted is None:
        raise ToolFailed(f"ping printed no statistics: {text.strip()[-300:] or '(empty output)'}")
    return PingResult(transmitted, received, np.array(ts), np.array(seq), np.array(rtt), elapsed)


def ipdv_ms(seq: np.ndarray, rtt: np.ndarray) -> float:
    """Mean |RTT difference| between consecutive packets that both got a reply (RFC 3393 pairs)."""
    order = np.argsort(seq, kind="stable")
    s, r = seq[order], rtt[order]
    consecutive = np.diff(s) == 1
    if not np.any(consecutive):
        return float("nan")
    return float(np.mean(np.abs(np.diff(r))[consecutive]))


def rtt_resolution_ms(rtt_ms: np.ndarray) -> np.ndarray:
    """How finely ping prints an RTT: "time=123 ms", "14.8", "2.40", "0.052" (iputils: 3 significant digits,
    at most 3 decimals)."""
    return np.where(rtt_ms >= 99.95, 1.0, np.where(rtt_ms >= 9.995, 0.1, np.where(rtt_ms >= 0.9995, 0.01, 0.001)))


def waited_behind_own(result: PingResult, frame_s: float) -> np.ndarray:
    """Which replies' requests waited behind the probe's own earlier requests at the path's slowest link, which
    sends a request in `frame_s`: the link is replayed with only the probe's requests on it, in the order ping
    sent them (icmp_seq), each at its send time (reply time less RTT, good to the RTT's printed resolution).
    ping sends back to back whenever its token bucket is full: its first `preload` requests (the bucket starts
    full), and again after a late wake-up, up to `preload` at once."""
    order = np.argsort(result.seq, kind="stable")
    send_s = result.timestamps - result.rtt_ms / 1e3
    slack_s = rtt_resolution_ms(result.rtt_ms) / 1e3
    waited = np.zeros(len(order), dtype=bool)
    free = -np.inf  # when the link has sent the probe's requests so far
    previous_slack = 0.0
    for i in order:
        waited[i] = send_s[i] < free - max(slack_s[i], previous_slack, 0.01 * frame_s)
        free = max(free, send_s[i]) + frame_s
        previous_slack = slack_s[i]
    return waited


def own_queue_left_out(result: PingResult, preload: int, frame_s: float) -> PingResult:
    """The replies whose RTT is the path's, not the probe's own queue: the first `preload` requests (sent back
    to back) are left out of every metric, loss included (a small buffer drops some of them: self-inflicted);
    after them, a request that waited behind the probe's own earlier ones (:func:`waited_behind_own`) is left
    out of the RTT statistics. Measured, 5 ms apart through 5 Mbit/s and 10 ms: ping sent 1 % of its requests
    right after another, which moved the mean RTT from 12.50 to 13.27 ms (the median not at all).

    `frame_s` is 0 when the probe is itself a load (it sends faster than the path carries): then every request
    waits behind the ones before it, and that queue is what is measured."""
    burst = preload if preload > 1 else 0
    after = result.seq > burst
    if not after.any():
        raise ToolFailed(f"ping got no reply after its first {burst} requests (sent back to back: their RTTs are the "
                         "probe's own queue): nothing is left to measure; give the probe a longer duration (or "
                         "its leader one), or a longer interval")
    waited = waited_behind_own(result, frame_s) if frame_s > 0 else np.zeros(len(result.seq), dtype=bool)
    keep = after & ~waited
    return PingResult(max(0, result.transmitted - burst), int(after.sum()), result.timestamps[keep],
                      result.seq[keep], result.rtt_ms[keep], result.elapsed_ms)


def measure(result: PingResult, t0: float) -> Measurement:
    """RTT metrics of one trial; `t0` (epoch seconds) is the trial's start for the series."""
    m = Measurement()
    m.add("rtt.loss_ratio", 1 - result.received / result.transmitted if result.transmitted else float("nan"))
    r = result.rtt_ms
    if len(r) == 0:
        return m
    m.add("rtt.min_ms", float(r.min()))
    m.add("rtt.avg_ms", float(r.mean()))
    m.add("rtt.max_ms", float(r.max()))
    m.add("rtt.stdev_ms", float(r.std()))  # population sd, as ping's mdev
    p50, p90, p99, p999 = np.percentile(r, [50, 90, 99, 99.9])
    m.add("rtt.p50_ms", float(p50))
    m.add("rtt.p90_ms", float(p90))
    m.add("rtt.p99_ms", float(p99))
    m.add("rtt.p999_ms", float(p999))
    ipdv = ipdv_ms(result.seq, r)
    if np.isfinite(ipdv):
        m.add("rtt.ipdv_ms", ipdv)
    m.add_series("rtt_ms", "ms", result.timestamps - t0, r)
    return m


#: Seconds after a flow ends before the remaining flow's queue is judged: TCP needs a few RTTs to take up
#: the freed capacity, and the queue its share built drains in at most buffer/rate (<= 0.1 s here).
STANDING_QUEUE_SETTLE_S = 1.0
#: Fewer RTT samples than this in the window give no estimate (a 5th percentile of a handful is noise).
STANDING_QUEUE_MIN_SAMPLES = 20


def standing_queue(m: Measurement, after_s: float, base_rtt_ms: float) -> None:
    """Seed 001's window scaling test: once the second flow ends, the first alone keeps the bottleneck's
    buffer occupied ("the delay caused by outgoing interface buffer is still high", section 4.5, figure 4.8).

    Adds ``queue.standing_ms``: the 5th percentile of the ping RTTs from ``after_s`` (trial clock) on, less
    the links' configured base RTT: the queueing delay the remaining flow never lets drain. How much depends
    on the congestion control and its recent back-offs; in the built-in dynamic-congestion scenario (250 kB
    at 100/20 Mbit/s) CUBIC left 3-8 ms and BBR 4.6 ms."""
    rtt = next((x for x in m.series if x.name == "rtt_ms"), None)
    if rtt is None:
        return
    window = rtt.v[rtt.t >= after_s]
    if len(window) >= STANDING_QUEUE_MIN_SAMPLES:
        m.add("queue.standing_ms", max(0.0, float(np.percentile(window, 5)) - base_rtt_ms))



# ------------------------------------------------------------------ the workload


class Options(WorkloadOptions):
    """ICMP echo from the first sender to the receiver, every reply's RTT kept: during another workload
    (the queue it builds: ``during = "stream"``) or on its own for ``duration``."""

    tool: Literal["ping"] = "ping"
    interval: Duration = Field(default=0.001, description="time between echo requests, as ping -i (at least "
                               "100 us)")
    size: int = Field(default=1450, ge=16, le=65000, description="ICMP payload bytes, as ping -s")
    duration: Seconds = Field(default=10.0, description="on its own: how long it pings (whole seconds); "
                                                         "during another workload it lasts that one's measured time")

    @field_validator("interval")
    @classmethod
    def _interval(cls, v: float) -> float:
        if v < 0.0001:
            raise ValueError(f"{v * 1e6:g}us: ping cannot send faster than every 100us")
        return v



METRICS = (
    Metric("rtt.min_ms", "ms", LOWER, "Minimum round-trip time (RFC 2681), ping"),
    Metric("rtt.avg_ms", "ms", LOWER, "Mean round-trip time (RFC 2681), ping"),
    Metric("rtt.max_ms", "ms", LOWER, "Maximum round-trip time, ping", noise=0.10),
    Metric("rtt.stdev_ms", "ms", LOWER, "Standard deviation of round-trip times, ping", noise=0.10),
    Metric("rtt.p50_ms", "ms", LOWER, "Median round-trip time, ping"),
    Metric("rtt.p90_ms", "ms", LOWER, "90th percentile round-trip time, ping"),
    Metric("rtt.p99_ms", "ms", LOWER, "99th percentile round-trip time, ping", noise=0.10),
    Metric("rtt.p999_ms", "ms", LOWER, "99.9th percentile round-trip time, ping", noise=0.10),
    Metric("rtt.ipdv_ms", "ms", LOWER, "Mean absolute IPDV between consecutive ping replies (RFC 3393)"),
    Metric("rtt.own_queue_requests", "requests", LOWER, "After the preload's burst (always left out): replies left "
                                                         "out of the RTT statistics because their requests waited "
                                                         "behind the probe's own earlier ones on the path's slowest "
                                                         "link (ping sends back to back after a late wake-up)"),
    Metric("rtt.loss_ratio", "ratio", LOWER, "Ping packets without a reply / sent (RFC 7680)", nothing=1.0),
    Metric("queue.standing_ms", "ms", LOWER, "Queueing delay left standing after the earliest-ending of staggered "
                                            "flows stopped: 5th percentile of ping RTT from 1 s after, less the "
                                            "links' configured base RTT (seed 001's window scaling test)",
           noise=0.10),
)


@register
class Ping(Workload):
    tool = "ping"
    instrument = True
    Options = Options
    requires = (PING,)
    metrics = METRICS

    def timing(self, options: Options, config: Any) -> tuple[float, float]:
        return 0.0, float(int(options.duration))

    def start(self, name: str, options: Options, ctx: TrialContext) -> Started:
        from vnetbench.impair.model import slowest_rate

        begins, deadline = ctx.window(options.duration)  # whole seconds: ping -w
        rate = slowest_rate(ctx.config.scenario.lab)
        frame = frame_bits(options.size, ctx.ip_version)
        if ctx.leader is not None or (rate and frame / options.interval >= rate):
            # Beside a load, or a load itself: room for a full queue plus half again, so the probe keeps its
            # rate when the RTT grows.
            queue_s = 1.5 * ctx.config.expected.get("queue.full_delay_ms", 0.0) / 1e3
        else:
            queue_s = 2 * frame / rate if rate else 0.0  # alone and slower than the path: a frame each way
        preload = preload_for(options.interval, queue_s + 0.005 + ctx.extra_rtt_s)
        argv = command(ctx.endpoints.receiver.echo_address(ctx.ip_version), options.interval, options.size,
                       int(deadline), ctx.ip_version, preload=preload)
        started = Started(name, measured_from=begins, measured_s=deadline, ends_by=begins + deadline + 10.0)
        started.info["preload"] = preload
        # a request's time on the path's slowest link, unless the probe is a load itself (see own_queue_left_out)
        started.info["frame_s"] = frame / rate if rate and frame / options.interval < rate else 0.0
        sender = ctx.endpoints.senders[0]
        started.procs[sender.name], started.outputs[sender.name] = ctx.popen(sender, name, argv)
        return started

    def measure(self, started: Started, options: Options, ctx: TrialContext,
                outputs: dict[str, str]) -> Measurement:
        from vnetbench.impair.model import base_rtt

        # The preload's burst and what waited behind the probe's own requests are left out: their RTTs are the
        # probe's own queue.
        result = own_queue_left_out(parse(next(iter(outputs.values()))), started.info.get("preload", 1),
                                    started.info.get("frame_s", 0.0))
        m = measure(result, t0=ctx.t0)
        m.add("rtt.own_queue_requests", float(result.received - len(result.rtt_ms)))
        # Staggered flows ([workload.stream] flows): what queue the others leave once one has ended.
        ends = (ctx.leader.info.get("flow_ends") if ctx.leader else None) or []
        if ends and min(ends) < max(ends):
            standing_queue(m, after_s=min(ends) + STANDING_QUEUE_SETTLE_S,
                           base_rtt_ms=base_rtt(ctx.config.scenario.lab) * 1e3)
        return m

    def exit_problem(self, started: Started) -> str | None:
        return None  # ping exits 1 when replies were lost: that is a measurement (rtt.loss_ratio), not a failure
