"""ping (iputils): command line and parsing of per-packet replies.

We keep every reply's RTT (``-D`` timestamps) instead of ping's closing
min/avg/max/mdev line: percentiles and IPDV need the packets, and the series
shows how the queue filled during the trial.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from vnetbench.workloads.base import Measurement, ToolFailed

_REPLY = re.compile(r"^\[(?P<ts>[0-9.]+)\] \d+ bytes from .*?icmp_seq=(?P<seq>\d+) .*?time=(?P<rtt>[0-9.]+) ms")
_SUMMARY = re.compile(r"(?P<tx>\d+) packets transmitted, (?P<rx>\d+) received")


def preload_for(interval: float, max_rtt_s: float) -> int:
    """How many requests may be outstanding so ping keeps its interval at this RTT.

    iputils ping stops sending while a few requests are unanswered: with 1 ms
    interval and a 40 ms queue it sends every ~10 ms instead of every 1 ms
    (measured: 211 requests in 2 s). ``-l N`` lifts that limit to N; those N go
    out back to back at the start, so N is kept to what the RTT needs.
    """
    return max(1, min(1000, math.ceil(max_rtt_s / interval)))


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


def parse(text: str) -> PingResult:
    ts, seq, rtt = [], [], []
    transmitted = received = None
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
    if transmitted is None:
        raise ToolFailed(f"ping printed no statistics: {text.strip()[-300:] or '(empty output)'}")
    return PingResult(transmitted, received, np.array(ts), np.array(seq), np.array(rtt))


def ipdv_ms(seq: np.ndarray, rtt: np.ndarray) -> float:
    """Mean |RTT difference| between consecutive packets that both got a reply (RFC 3393 pairs)."""
    order = np.argsort(seq, kind="stable")
    s, r = seq[order], rtt[order]
    consecutive = np.diff(s) == 1
    if not np.any(consecutive):
        return float("nan")
    return float(np.mean(np.abs(np.diff(r))[consecutive]))


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

