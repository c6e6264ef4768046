"""Does the path carry traffic as the configuration declares? A short check before trials.

Before the first trial on each path (configurations that differ only in their workloads share one), and
whenever the lab's state changed, each sender of the configuration sends echo requests to the receiver
(``ping``): an echo crosses the path both ways, the request in the links' forward direction and the reply in
their reverse. What comes back is judged against what the declared conditions allow (:class:`Expectation`):

- **reachability and loss**: replies are drawn with the declared delivery probability (1 - loss, and
  1 - corruption, each direction of each link on the path); a count that probability makes implausible
  (two-sided binomial test, p < ``ALPHA``) is named, so a black hole (no replies where 20 % loss is declared)
  and a loss model that is not there (every reply where 50 % loss is declared) both fail;
- **delay**: the smallest RTT can be neither below the declared fixed delay (less the jitter's reach) nor far
  above it (``DELAY_SLACK_S`` per environment: the path's own processing);
- **rate**, where a rate of at most ``RATE_CHECK_MAX_BPS`` is declared and nothing makes packets' times vary
  on purpose: a train of full-size requests sent at once queues at the slowest rate on the round trip, and
  the replies arrive one frame's serialisation apart (a packet train's dispersion); the slope of arrival time
  over arrival rank gives the rate. Named when it is off by more than a factor ``RATE_FACTOR``.

Pure functions here; the bench runs the commands (:meth:`vnetbench.runner.bench.DumbbellBench.check_path`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from vnetbench.impair.model import FRAME_OVERHEAD, LinkConditions, LinkSpec, frame_bytes
from vnetbench.impair.tc import burst_bytes
from vnetbench.metrics import metric
from vnetbench.stats import binomial
from vnetbench.workloads.ping import PingResult

# A check that fails by chance fails a configuration: with hundreds of checks in a run, this keeps the chance of
# one false failure per run below 1e-4, and still rejects a black hole or a missing loss model at once.
ALPHA = 1e-7
PROBES = 100  # echo requests of the reachability/loss/delay probe (fewer on slow paths: PROBE_BUDGET_S)
PROBE_SIZE = 56  # ping's default payload: 98-byte frames
# The shortest interval iputils' ping allows a user without privileges (hosts reached over SSH): the check comes
# before every trial whose configuration differs from the last one's, so its 100 requests take 0.2 s, not 0.5.
PROBE_INTERVAL_S = 0.002
PROBE_BUDGET_S = 0.6  # the probe's sending time at most
PROBE_LOAD = 0.1  # the probe uses at most this share of the slowest declared rate (it must not queue)
MIN_PROBES = 20
LOSSLESS_DELIVERY = 0.99
# Above the declared fixed delay, how much longer the smallest RTT of a probe may be: what the path itself adds
# (namespaces: tens of microseconds, more on a busy core; a guest under TCG: milliseconds). Only a delay that
# is not what was declared (one left behind, one applied twice) is that far off.
DELAY_SLACK_S = {"vm": 0.05}
DEFAULT_DELAY_SLACK_S = 0.005
DELAY_FLOOR_SLACK_S = 0.0005  # below the declared delay: timer granularity of the emulator and of ping
# Above: a frame's serialisation (115 us at 100 Mbit/s) comes near what timing it adds up to on a busy core
# (one train at 200 Mbit/s measured 407).
RATE_CHECK_MAX_BPS = 100e6
# The spread of trains measured on a busy 2-core VM (a core kept busy by stress-ng): 0.55-1.41 of the declared
# rate over 40 trains each through tbf, htb and the emulator at 50 and 100 Mbit/s. A factor 3 either way still
# names a rate that is missing or one of a configuration several times slower or faster.
RATE_FACTOR = 3.0
SEND_SHARE = 0.5  # ping's sending of a train must take at most this share of the train's time on the link
NO_QUEUE_FACTOR = 10.0  # a burst that passes this much faster than declared did not meet the rate at all
RATE_POINTS = 25  # replies fitted, at least (the later half of a train of at least twice as many)
MIN_RATE_POINTS = 8
TRAIN_SPAN_S = 0.03
BURST_BUDGET_S = 0.5
MIN_BURST_PAYLOAD = 64


@dataclass(frozen=True)
class Expectation:
    """What the declared conditions of a sender's path promise an echo exchange.

    ``delivery``: the probability that a request and its reply both arrive; ``base_rtt_s``: the declared fixed
    delay, both ways; ``jitter_s``: how far below that the declared jitter can take a packet's delay (sum over
    directions); ``rate_bps`` / ``overhead``: the slowest declared rate on the round trip and the bytes it adds
    per frame; ``burst_bytes``: what the rate qdisc lets through at line rate first; ``dynamic``: a schedule
    or trace changes the conditions over time (only reachability and the delay floor are judged);
    ``bursty_loss``: loss comes in bursts (Gilbert-Elliott, correlated Bernoulli), so probe counts are not
    binomial; ``skippable_s``: the delay of directions that reorder (netem's reorder sends a packet without
    its delay), which the shortest round trip may lack."""

    delivery: float
    base_rtt_s: float
    jitter_s: float
    rate_bps: float | None
    overhead: int
    burst_bytes: int
    dynamic: bool
    bursty_loss: bool
    skippable_s: float = 0.0

    @property
    def reordering(self) -> bool:
        return self.jitter_s > 0 or self.skippable_s > 0


def _initial(spec: LinkSpec, direction: str) -> LinkConditions:
    """A direction's conditions at time 0: its own, with the schedule's first step (as the emulator starts)."""
    cond = spec.direction(direction)
    if spec.schedule is not None:
        at0 = spec.schedule.initial(direction)
        if at0 is not None:
            cond = cond.merged(at0)
    return cond


def expectation(links: Iterable[tuple[LinkSpec, bool]], mtu: int) -> Expectation:
    """The expectation of a path made of `links` (the receiver's and the sender's own), each given as its
    conditions and whether a rate qdisc (with its burst) realises them."""
    delivery, base, jitter, overhead, burst, skippable = 1.0, 0.0, 0.0, 0, 0, 0.0
    rate: float | None = None
    dynamic = bursty = False
    for spec, shaped_by_kernel in links:
        dynamic |= spec.schedule is not None
        for d in ("forward", "reverse"):
            c = _initial(spec, d)
            delivery *= (1 - c.loss.mean_loss()) * (1 - c.corrupt)
            bursty |= c.loss.model == "gilbert_elliott" or c.loss.correlation > 0
            base += c.delay
            if c.reorder > 0:
                skippable += c.delay
            jitter += 4 * c.jitter
            if c.rate and (rate is None or c.rate < rate):
                rate, overhead = c.rate, c.overhead
                burst = burst_bytes(c.rate, mtu) if shaped_by_kernel else 0
    return Expectation(delivery, base, jitter, rate, overhead, burst, dynamic, bursty, skippable)


def probe_plan(exp: Expectation, senders: int = 1) -> tuple[int, float]:
    """(echo requests, interval): PROBES at PROBE_INTERVAL_S, spaced out so the probes of all `senders` together
    stay under PROBE_LOAD of the slowest rate, and fewer when that would take longer than PROBE_BUDGET_S."""
    interval = PROBE_INTERVAL_S
    if exp.rate_bps:
        frame_bits = (PROBE_SIZE + 48 + FRAME_OVERHEAD + exp.overhead) * 8
        interval = max(interval, senders * frame_bits / (PROBE_LOAD * exp.rate_bps))
    count = max(MIN_PROBES, min(PROBES, int(PROBE_BUDGET_S / interval)))
    return count, round(interval, 4)


def judge_probe(exp: Expectation, sent: int, rtts_ms: np.ndarray, env: str) -> list[str]:
    """What is wrong with a probe of `sent` echo requests whose replies took `rtts_ms`: [] when nothing is."""
    if sent <= 0:
        return ["ping sent no echo request"]
    out = []
    received = len(rtts_ms)
    if received == 0 and exp.delivery > 0 and (1 - exp.delivery) ** sent < ALPHA:
        return [f"no reply to {sent} echo requests: the path carries nothing, where the declared conditions "
                f"deliver {100 * exp.delivery:.3g}% of round trips"]
    if exp.delivery <= 0 and received:
        out.append(f"{received} of {sent} echo requests answered on a path declared to lose everything")
    elif not exp.dynamic and not exp.bursty_loss:
        # A lossless path is held to 99 %: an odd request lost to the machine's own hiccups is not the lab's.
        q = min(exp.delivery, LOSSLESS_DELIVERY)
        p = binomial.two_sided_p(received, sent, q)
        if p < ALPHA:
            declared = "lossless" if exp.delivery >= 1 else f"declared to deliver {100 * exp.delivery:.3g}%"
            out.append(f"{received} of {sent} echo requests answered on a path {declared} (binomial p = {p:.1e})")
    if received:
        low = float(np.min(rtts_ms)) / 1e3
        floor = max(0.0, exp.base_rtt_s - exp.skippable_s - exp.jitter_s) - DELAY_FLOOR_SLACK_S
        if low < floor:
            out.append(f"the shortest round trip took {1e3 * low:.3f} ms, below the declared delay's "
                       f"{1e3 * exp.base_rtt_s:.3f} ms: a delay is missing")
        slack = DELAY_SLACK_S.get(env, DEFAULT_DELAY_SLACK_S)
        ceiling = exp.base_rtt_s + exp.jitter_s + slack
        if not exp.dynamic and low > ceiling:
            out.append(f"the shortest round trip took {1e3 * low:.3f} ms, where the declared delay is "
                       f"{1e3 * exp.base_rtt_s:.3f} ms (at most {1e3 * ceiling:.3f} ms with what the path adds)")
    return out


def burst_plan(exp: Expectation, mtu: int, ip_version: int, env: str) -> tuple[int, int] | None:
    """(requests, payload bytes) of the rate train, or None when the rate is not judged here (none declared,
    too fast to time, times varied on purpose, a guest's emulated clock, too slow for a train in
    BURST_BUDGET_S). The train is long enough that its queued part lasts TRAIN_SPAN_S at the declared rate (a
    rate qdisc is served by timers, which release packets in batches on a busy core: only a span of tens of
    milliseconds averages them out), and at least 2 x RATE_POINTS frames; full-size frames where the rate
    allows, smaller on slow links."""
    if (exp.rate_bps is None or exp.rate_bps > RATE_CHECK_MAX_BPS or exp.dynamic or exp.reordering
            or env == "vm"):
        return None
    headers = (48 if ip_version == 6 else 28) + FRAME_OVERHEAD
    frame = min(frame_bytes(mtu), 1400 + headers)
    queued = max(2 * RATE_POINTS, math.ceil(TRAIN_SPAN_S * exp.rate_bps / ((frame + exp.overhead) * 8)))
    if queued * (frame + exp.overhead) * 8 / exp.rate_bps > BURST_BUDGET_S:
        frame = int(BURST_BUDGET_S * exp.rate_bps / 8 / queued) - exp.overhead
    payload = frame - headers
    if payload < MIN_BURST_PAYLOAD:
        return None
    return _line_rate_frames(exp, frame) + queued, payload


def _line_rate_frames(exp: Expectation, frame: int) -> int:
    """Frames of a train that may pass before the queue builds: a rate qdisc's burst, counted twice (htb and
    tbf hold a little more than the burst they are given), and one."""
    return math.ceil(2 * exp.burst_bytes / (frame + exp.overhead)) + 1


def judge_burst(exp: Expectation, payload: int, ip_version: int, result: PingResult) -> tuple[float | None, list[str]]:
    """(the rate measured, what is wrong) from a train's replies. Past the rate qdisc's burst the link is busy
    serving the queue, so replies arrive one frame's serialisation apart (a packet train's dispersion). Each
    reply's arrival is its request's send time plus its round trip (timed by the kernel's receive timestamp);
    ping sends the preloaded train in one loop, so request i leaves (i - 1) x (the loop's time / (requests -
    1)) after the first (ping's own "time"). The slope of arrival time over arrival rank, Theil-Sen's over the
    queued replies less their first quarter (the queue's start), is frame / rate: drops from a full buffer
    and the rate qdisc's timers, which release packets in batches on a busy core, do not bend it."""
    headers = (48 if ip_version == 6 else 28) + FRAME_OVERHEAD
    frame_bits = (payload + headers + exp.overhead) * 8
    requests = result.transmitted
    if result.elapsed_ms is None or result.elapsed_ms / 1e3 > SEND_SHARE * requests * frame_bits / exp.rate_bps:
        # ping could not send the train at once (the sender's device queue was full: ENOBUFS, after which ping
        # goes on at its interval), or sent it so slowly that its own loop shapes it: not judged
        return None, []
    spacing = result.elapsed_ms / 1e3 / max(1, requests - 1)
    arrivals = np.sort((result.seq - 1) * spacing + result.rtt_ms / 1e3)
    queued = arrivals[_line_rate_frames(exp, payload + headers):]
    queued = queued[len(queued) // 4:]
    if len(queued) < MIN_RATE_POINTS or exp.rate_bps is None:
        return None, []  # the buffer (or the declared loss) left too few to judge
    slope_s = theil_sen_slope(queued)
    rate = frame_bits / slope_s if slope_s > 0 else math.inf
    if rate > NO_QUEUE_FACTOR * exp.rate_bps:
        return rate, [f"a train of {requests} full-size echo requests did not queue: no rate limit of "
                      f"{exp.rate_bps / 1e6:.3g} Mbit/s is on the path"]
    if not (exp.rate_bps / RATE_FACTOR <= rate <= exp.rate_bps * RATE_FACTOR):
        return rate, [f"a train of full-size echo requests left the queue at {rate / 1e6:.3g} Mbit/s, where "
                      f"{exp.rate_bps / 1e6:.3g} Mbit/s is declared"]
    return rate, []


def theil_sen_slope(y: np.ndarray) -> float:
    """The median of the slopes between every two of `y`'s points, at x = 0, 1, 2, ... (Theil-Sen's estimator,
    scipy.stats.theilslopes' slope, which imports scipy.stats: a second of every run)."""
    y = np.asarray(y, dtype=float)
    i, j = np.triu_indices(len(y), k=1)
    return float(np.median((y[j] - y[i]) / (j - i)))


# What a link's backend counts as packets it did not deliver (the emulator's models and queue, a kernel
# qdisc's drops, frames it could not forward or the kernel refused, corrupted ones the receiver drops).
NOTHING_PLAUSIBLE = 0.5  # declared delivery at or below which a trial may receive nothing at all

LINK_DROP_KEYS = ("lost", "dropped_queue", "drops", "dropped_oversize", "tx_errors", "corrupted")


def link_drops(counters: Mapping[str, Any]) -> float:
    """Packets the links' own models and queues dropped in a trial, over links and directions
    (LinkManager.end_trial's counters)."""
    return float(sum(c.get(d, k) for c in counters.values() for d in c.per_direction for k in LINK_DROP_KEYS))


def nothing_received(samples: Iterable[tuple[str, float]], exp: Expectation, drops: float) -> str | None:
    """Why a trial whose workload received nothing at all (a metric at its ``nothing`` value: a loss ratio of 1,
    a rate of 0) is not a measurement, or None when its configuration explains it: its declared conditions lose
    at least half of all round trips (with few packets, all of them can go), or they change over time (a
    schedule, a trace) and the links' own models and queues did drop packets. Otherwise the path did not carry
    the configuration's traffic: a black hole beyond what the links count (the issue-35 reproducer lost every
    echo request with none counted lost by the link's own model)."""
    empty = sorted({name for name, value in samples
                    if (m := metric(name)).nothing is not None and value == m.nothing})
    if not empty or exp.delivery <= NOTHING_PLAUSIBLE or (exp.dynamic and drops > 0):
        return None
    return (f"{', '.join(f'{n} = {metric(n).nothing:g}' for n in empty)}: nothing arrived, where the declared "
            f"conditions deliver {100 * exp.delivery:.3g}% of round trips (the links' own models and queues dropped "
            f"{drops:g} packets); the path did not carry the configuration's traffic")
