"""sockperf: request/response latency (netperf TCP_RR / UDP_RR's job; netperf is not in Debian).

The first sender sends a message to a sockperf server on the receiver, which
answers it; the client records every message's send and receive time:

- ``mode = "ping-pong"``: one message in flight, the next sent when the answer
  arrives (netperf's RR): transactions/s = 1 / mean round trip;
- ``mode = "under-load"``: messages at a fixed rate (``rate``, messages/s), each
  answered (``--reply-every 1``): latency while the path carries that load.

Every statistic comes from the full per-message log (``--full-log``, with
``--full-rtt``: round-trip times), never from sockperf's summary line: the
percentiles p50/p90/p99/p99.9, mean, standard deviation and the transaction
rate; the round trips are kept as a series (``rr_rtt_us``, at most
``SERIES_POINTS`` per trial, every k-th message: the same distribution) for
the report's CDFs and time plots. sockperf pauses 2.1 s before it starts timing
and leaves the first 0.4 s of ``duration`` (its warm-up) out of its log: the
measured part is ``duration`` - 0.4 s, from 2.5 s after it starts. During
another workload it is fitted into that one's measured time.

::

    [workload.rr]
    tool = "sockperf"
    proto = "tcp"             # or udp (sockperf's default)
    payload = 64              # message bytes (sockperf's minimum is 14: its header)
    duration = "10s"

Debian's sockperf (3.7) speaks IPv4 only: an IPv6 lab is refused before anything
is built (irtt measures UDP round trips over IPv6).
"""

from __future__ import annotations

import io
import re
import warnings
from typing import Any, Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from vnetbench.metrics import HIGHER, LOWER, Metric
from vnetbench.quantities import WholeSeconds
from vnetbench.tools import SOCKPERF
from vnetbench.workloads.base import (Measurement, ServerSpec, Started, ToolFailed, TrialContext, TrialEndpoints,
                                      Workload, WorkloadOptions)
from vnetbench.workloads.registry import register

UDP_PORT, TCP_PORT = 5301, 5302  # inside the range the container model publishes
MIN_PAYLOAD, MAX_PAYLOAD = 14, 65000  # sockperf's header; its largest message
SERIES_POINTS = 20_000
#: sockperf 3.7 sleeps this long after it starts, before --time starts (strace: a 0.1 s sleep, then one
#: clock_nanosleep of 2 s, with or without --dontwarmup); no option removes it. (It also sleeps 0.1 s after
#: --time, before it exits: the tool's own cost, counted in a trial's overhead by bench/workloads.py.)
STARTUP_PAUSE_S = 2.1
#: The first part of --time sockperf leaves out of its log and statistics ("Warm up time=400 msec").
WARMUP_S = 0.4
#: Seconds sockperf may need beyond its pause and --time: connection set-up, writing the log.
OVERHEAD_S = 15.0


class Options(WorkloadOptions):
    """Request/response latency with sockperf, first sender -> receiver."""

    tool: Literal["sockperf"] = "sockperf"
    mode: Literal["ping-pong", "under-load"] = Field(
        default="ping-pong", description="ping-pong: one message in flight, the next leaves when the answer "
        "arrives (netperf TCP_RR / UDP_RR); under-load: `rate` messages/s, each answered")
    proto: Literal["udp", "tcp"] = Field(default="udp", description="transport (IPv4 only: Debian's sockperf 3.7)")
    payload: int = Field(default=64, description="message size in bytes, as sockperf -m (at least its 14-byte "
                                                 "header)")
    duration: WholeSeconds = Field(default=10.0, description="on its own: how long it runs (whole seconds); during "
                                                         "another workload it lasts that one's measured time")
    rate: int | None = Field(default=None, ge=1, le=10_000_000, description="under-load: messages per second "
                                                                            "(sockperf --mps; default 10000)")

    @field_validator("payload")
    @classmethod
    def _payload(cls, v: int) -> int:
        if not MIN_PAYLOAD <= v <= MAX_PAYLOAD:
            raise ValueError(f"{v} B: sockperf sends messages of {MIN_PAYLOAD} B (its header; netperf's 1-byte RR "
                             f"has no exact equivalent) to {MAX_PAYLOAD} B")
        return v

    @model_validator(mode="after")
    def _rate_for_load(self) -> "Options":
        if self.rate is not None and self.mode != "under-load":
            raise ValueError(f"rate = {self.rate} sets the message rate of mode = \"under-load\"; ping-pong sends "
                             "the next message when the answer arrives: remove rate, or set mode = \"under-load\"")
        return self


METRICS = (
    Metric("rr.transactions_per_s", "1/s", HIGHER, "Request/response transactions per second (sockperf; "
                                                   "ping-pong: netperf RR's figure)", nothing=0.0),
    Metric("rr.mean_us", "us", LOWER, "Mean round-trip time of a request and its response (sockperf, every message)"),
    Metric("rr.stdev_us", "us", LOWER, "Standard deviation of request/response round-trip times (sockperf)",
           noise=0.10),
    Metric("rr.min_us", "us", LOWER, "Minimum request/response round-trip time (sockperf)"),
    Metric("rr.p50_us", "us", LOWER, "Median request/response round-trip time (sockperf)"),
    Metric("rr.p90_us", "us", LOWER, "90th percentile request/response round-trip time (sockperf)"),
    Metric("rr.p99_us", "us", LOWER, "99th percentile request/response round-trip time (sockperf)", noise=0.10),
    Metric("rr.p999_us", "us", LOWER, "99.9th percentile request/response round-trip time (sockperf)", noise=0.10),
    Metric("rr.max_us", "us", LOWER, "Maximum request/response round-trip time (sockperf)", noise=0.10),
    Metric("rr.dropped_messages", "messages", LOWER, "Messages sockperf counted as dropped (UDP)"),
)


def server_command(address: str, port: int, proto: str) -> list[str]:
    return ["sockperf", "server", "-i", address, "-p", str(port), *(["--tcp"] if proto == "tcp" else [])]


def client_script(options: Options, address: str, seconds: int) -> list[str]:
    """sockperf's client, with its full log sent to standard output once it ends.

    The log goes to a file of its own first (sockperf opens it separately: pointing it at
    /dev/stdout would overwrite what it prints there) in the node's /tmp, which every node
    has (a NamespaceNode and a GuestNode alike); its chatter goes to standard error.
    """
    port = TCP_PORT if options.proto == "tcp" else UDP_PORT
    argv = ["sockperf", options.mode, "-i", address, "-p", str(port), "-t", str(seconds), "-m", str(options.payload),
            "--full-rtt"]
    if options.proto == "tcp":
        argv.append("--tcp")
    if options.mode == "under-load":
        argv += ["--mps", str(options.rate or 10_000), "--reply-every", "1"]
    script = ('f=$(mktemp /tmp/vnb-sockperf.XXXXXX) || exit 1; trap \'rm -f "$f"\' EXIT INT TERM; '
              '"$@" --full-log "$f" >&2; rc=$?; cat "$f"; exit $rc')
    return ["sh", "-c", script, "sockperf", *argv]


# ------------------------------------------------------------------ parsing

_VALID = re.compile(r"\[Valid Duration\] RunTime=(?P<s>[0-9.]+) sec; SentMessages=(?P<tx>\d+); "
                    r"ReceivedMessages=(?P<rx>\d+)")
_DROPPED = re.compile(r"# dropped messages = (?P<d>\d+)")
_HEADER = re.compile(r"^packet, txTime\(sec\), rxTime\(sec\), (rtt|latency)\(usec\)[^\n]*$", re.M)
_NOT_A_ROW = re.compile(r"^[^0-9\s]", re.M)  # a line among the rows that is not one


class Log:
    """A parsed full log: per message, send and receive time (s, sockperf's clock) and round trip (us)."""

    def __init__(self, tx: np.ndarray, rx: np.ndarray, rtt_us: np.ndarray, valid_s: float | None,
                 dropped: int | None, round_trip: bool):
        self.tx, self.rx, self.rtt_us = tx, rx, rtt_us
        self.valid_s, self.dropped, self.round_trip = valid_s, dropped, round_trip


def parse_log(text: str) -> Log:
    """Parse sockperf's ``--full-log`` (its summary block, then ``packet, txTime, rxTime, rtt`` rows).

    The rows are read by numpy in one pass: a second of ping-pong on veth logs ~40,000 of them, and a
    Python loop over them was most of what a sockperf trial cost beyond its measured time.
    """
    header = _HEADER.search(text)
    if header is None:
        snippet = " / ".join(x.strip() for x in text.strip().splitlines()[-3:])[-300:] or "(empty output)"
        raise ToolFailed(f"sockperf wrote no per-message log: {snippet}")
    block, body = text[:header.start()], text[header.end():]
    if _NOT_A_ROW.search(body):  # a message among the rows (rare): keep the rows only
        body = "\n".join(line for line in body.splitlines() if line[:1].isdigit())
    if not body.strip():
        raise ToolFailed("sockperf's log has no message: no request was answered (server unreachable?)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # numpy warns about an empty input; that case is handled above
            table = np.loadtxt(io.StringIO(body), delimiter=",", ndmin=2)
    except ValueError as e:
        raise ToolFailed(f"sockperf's log has a malformed row: {str(e)[:160]}") from None
    if table.shape[1] != 4:
        raise ToolFailed(f"sockperf's log rows have {table.shape[1]} columns, not 4 (packet, tx, rx, rtt)")
    valid = _VALID.search(block)
    dropped = _DROPPED.search(block)
    return Log(tx=table[:, 1], rx=table[:, 2], rtt_us=table[:, 3],
               valid_s=float(valid["s"]) if valid else None, dropped=int(dropped["d"]) if dropped else None,
               round_trip=header[1] == "rtt")


def measure_log(log: Log, mode: str, t_offset: float = 0.0) -> Measurement:
    """Per-trial metrics from every message; the round trips as a series on the trial's clock."""
    if not log.round_trip:
        raise ToolFailed("sockperf logged one-way latency (half the round trip), not round trips: run it with "
                         "--full-rtt")
    r = log.rtt_us
    m = Measurement()
    p50, p90, p99, p999 = np.percentile(r, [50, 90, 99, 99.9])
    m.add("rr.mean_us", float(r.mean()))
    m.add("rr.stdev_us", float(r.std()))
    m.add("rr.min_us", float(r.min()))
    m.add("rr.p50_us", float(p50))
    m.add("rr.p90_us", float(p90))
    m.add("rr.p99_us", float(p99))
    m.add("rr.p999_us", float(p999))
    m.add("rr.max_us", float(r.max()))
    span = float(log.rx[-1] - log.tx[0])
    if span > 0:
        # Answered messages over the time from the first send to the last answer: in ping-pong
        # one message is in flight, so this is 1 / mean round trip.
        m.add("rr.transactions_per_s", len(r) / span)
    if log.dropped is not None:
        m.add("rr.dropped_messages", log.dropped)
    step = max(1, int(np.ceil(len(r) / SERIES_POINTS)))
    m.add_series("rr_rtt_us", "us", t_offset + (log.tx[::step] - log.tx[0]), r[::step])
    return m


def _errors(stderr: str) -> str:
    """sockperf's error lines (colour codes removed), else the last line it printed."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", x).strip() for x in stderr.splitlines() if x.strip()]
    errors = [x for x in lines if "ERROR" in x]
    return " / ".join(errors or lines[-1:])[:300]


# ------------------------------------------------------------------ the driver


@register
class Sockperf(Workload):
    tool = "sockperf"
    instrument = True
    Options = Options
    requires = (SOCKPERF,)
    metrics = METRICS

    def problems(self, options: Options, lab: Any) -> list[str]:
        if lab.ip_version == 6:
            return ["sockperf (Debian's 3.7) speaks IPv4 only: use ip_version = 4 for it (irtt measures UDP "
                    "round trips over IPv6)"]
        return []

    def timing(self, options: Options, config: Any) -> tuple[float, float]:
        return STARTUP_PAUSE_S + WARMUP_S, float(options.duration) - WARMUP_S

    def servers(self, hosts: TrialEndpoints, ip_version: int, options: list[Options], workdir: str) -> list[ServerSpec]:
        address = hosts.receiver.address(4)  # its own: a container's node forwards published ports to it
        return [ServerSpec(hosts.receiver, server_command(address, port, proto), port, proto, f"sockperf-{proto}")
                for proto, port in (("udp", UDP_PORT), ("tcp", TCP_PORT))]

    def start(self, name: str, options: Options, ctx: TrialContext) -> Started:
        begins, seconds = ctx.window(options.duration)
        if ctx.leader is not None:
            # under the leader's load: its pause comes out of the leader's time, so that every logged
            # message is sent before the leader ends
            seconds = max(1.0, float(int(ctx.leader.measured_s - 0.5 - STARTUP_PAUSE_S)))
        started = Started(name, measured_from=begins + STARTUP_PAUSE_S + WARMUP_S, measured_s=seconds - WARMUP_S,
                          ends_by=begins + STARTUP_PAUSE_S + seconds + OVERHEAD_S)
        sender = ctx.endpoints.senders[0]
        argv = client_script(options, ctx.endpoints.receiver.service_address(4), int(seconds))
        started.procs[sender.name], started.outputs[sender.name] = ctx.popen(sender, name, argv)
        return started

    def measure(self, started: Started, options: Options, ctx: TrialContext,
                outputs: dict[str, str]) -> Measurement:
        label, text = next(iter(outputs.items()))
        with started.quoting("sockperf", label, _errors):  # it exits 0 after "Connection refused"
            log = parse_log(text)
        return measure_log(log, options.mode, t_offset=started.measured_from)

    def raw(self, started: Started, outputs: dict[str, str]) -> dict[str, str]:
        """The log's summary block and its first rows (the whole log can be tens of megabytes)."""
        kept = {}
        for label, text in outputs.items():
            lines = text.splitlines()
            head = [x for x in lines[:200]]
            kept[label] = "\n".join(head) + (f"\n... ({len(lines) - 200} more log rows not kept)" if len(lines) > 200
                                             else "")
        return kept
