"""HTTP transactions with ApacheBench (``ab``, Debian ``apache2-utils``) against nginx on the receiver.

ab on the first sender fetches one file of ``file_size`` from an nginx of its
own on the receiver (wrk's server, :func:`vnetbench.workloads.wrk.server_script`,
on port 5321 so both tools can be in one scenario), ``concurrency`` requests in
flight, for ``duration``:

- ``keepalive = false`` (the default): every request on a new TCP connection
  (ab sends HTTP/1.0 without ``Connection: Keep-Alive``; nginx closes after the
  response): netperf TCP_CRR's transaction, connect + request + response +
  close. This is what ab measures that wrk cannot: the connect time;
- ``keepalive = true`` (ab ``-k``): connections are reused.

What ab gives, and at what resolution (ab 2.3 of apache2-utils 2.4.x; ab keeps
every request's times in microseconds and rounds them on output)::

    stdout report   requests/s (0.01/s), transfer rate, failed/non-2xx counts,
                    "Connection Times (ms)": min/mean/median/max ROUNDED to
                    whole ms (only the +/-sd column has 0.1 ms)
    -e FILE (CSV)   total time at percent 0, 1, ..., 100 of requests, 1 us
                    ("%.3f" ms); no finer percent (no 99.9)
    -g FILE (TSV)   per request: ctime (connect), dtime, ttime (total), wait,
                    each ROUNDED to whole ms (and its start in whole seconds)

So the metrics are:

- whole transaction (from ab's connect() to the response's end, the close
  included without keep-alive): p50, p90, p99 and the longest from ``-e``, to
  1 us; p99.9 from ``-g``, i.e. to the nearest ms, then kept between ``-e``'s
  p99 and longest (the true value lies in both ranges, so it is never off by
  more than 0.5 ms and never below p99); ``ab.transaction_ms`` =
  concurrency / rate, to 1 us: the time each of the concurrent clients spends
  per request, ab's own work between a request's end and the next connect
  included (netperf TCP_CRR's transaction time; wrk's ``http.transaction_ms``).
  ab gives the *mean* request time only rounded to whole ms, so there is no
  separate mean latency metric;
- connect time (without keep-alive only: ab counts a reused connection's
  connect as 0): ab times it from its non-blocking connect() to its first write
  of the request, i.e. the TCP handshake plus however long ab's single thread
  took to get to that socket (which grows with ``concurrency``). It exists only
  rounded to whole ms: the mean from the report's table, the percentiles from
  ``-g``. Rounding keeps the order of values, so each percentile is exactly the
  true percentile rounded to the nearest ms. A round trip on a bare veth takes
  ~50 us and the connect figures read 0 ("under 0.5 ms"); they say something
  on links with delay or under high concurrency, where connects take ms (with
  2 ms of delay each way, -c 4: connect 4 ms, one round trip; transaction
  p50 8.3 ms, two).

ab gives up the whole run (and the trial fails, quoting it) at the first
failed receive (a refused or reset connection: "apr_socket_recv: Connection
refused (111)"), after about ten failed connects, or when no socket makes
progress for ``timeout`` seconds (``-s``); it does not count timed-out requests
as wrk does. (``-r`` would keep it going, but then ab counts every failed
receive as a completed request, in its rate and percentiles: 40,000 "requests"/s
against a closed port.)

::

    [workload.crr]
    tool = "ab"
    concurrency = 50
    file_size = "1KiB"
    duration = "10s"
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from vnetbench.metrics import HIGHER, LOWER, Metric
from vnetbench.quantities import WholeSeconds
from vnetbench.tools import AB, NGINX
from vnetbench.workloads.base import Measurement, Started, ToolFailed, TrialContext
from vnetbench.workloads.registry import register
from vnetbench.workloads.wrk import HttpOptions, NginxClient

PORT = 5321  # wrk's nginx has 5320; both inside the range the container model publishes
MAX_CONCURRENCY = 20_000  # ab's own limit ("Invalid Concurrency [Range 0..20000]")
#: What each nginx worker accepts at once (wrk.server_script's ``worker_connections``).
NGINX_CONNECTIONS_PER_WORKER = 16384
#: ab's -n for a run of -t seconds: -t alone caps a run at 50,000 requests (ab sets -n 50000 when it reads
#: -t, so -n must come after it). ab callocs 32 bytes per request for this many up front (only the pages
#: it fills become memory: 3.2 MB of address space per second, fine in a 256 MiB guest for minutes), and a
#: run that uses them all before -t ends is refused rather than reported short (ab's one thread manages
#: ~40,000 keep-alive requests/s on the 2-core machine this was written on).
REQUESTS_PER_SECOND_BOUND = 100_000
INT_MAX = 2**31 - 1  # ab's -n is a C int
PERCENTILES = (50, 90, 99)  # whole percents: what ab's -e file has, to 1 us
OVERHEAD_S = 10.0  # beyond -t and -s: ab writes its report and files, the shell prints them
MARK_PERCENTILES = "VNB-AB-PERCENTILES"  # ab's -e CSV follows
MARK_REQUESTS = "VNB-AB-REQUESTS"  # ab's -g TSV follows
RAW_REQUEST_ROWS = 200  # of the -g table, kept with the trial (it has a row per request)


class Options(HttpOptions):
    """HTTP requests with ApacheBench against nginx on the receiver; a new connection per request unless
    ``keepalive``."""

    tool: Literal["ab"] = "ab"
    concurrency: int = Field(default=1, description="requests in flight at once (ab -c), 1 to 20000")
    keepalive: bool = Field(default=False, description="reuse connections (ab -k); false: a new TCP connection "
                                                       "per request, netperf TCP_CRR's transaction")
    timeout: WholeSeconds = Field(default=10.0, description="ab gives up the whole run when no connection makes "
                                                        "progress this long (ab -s, whole seconds)")

    @field_validator("concurrency")
    @classmethod
    def _concurrency(cls, v: int) -> int:
        if not 1 <= v <= MAX_CONCURRENCY:
            # the loader names the option and value before this
            raise ValueError(f"ab keeps 1 to {MAX_CONCURRENCY} requests in flight (ab -c); give a value in that "
                             "range")
        return v

    @model_validator(mode="after")
    def _enough_workers(self) -> "Options":
        # With keep-alive every concurrent request holds a connection at nginx; without, nearly every one does.
        needed = -(-self.concurrency // NGINX_CONNECTIONS_PER_WORKER)
        if self.workers < needed:
            raise ValueError(f"concurrency = {self.concurrency} is more connections than {self.workers} nginx "
                             f"worker(s) accept ({NGINX_CONNECTIONS_PER_WORKER} each); raise workers to {needed}")
        return self


METRICS = (
    Metric("ab.requests_per_s", "1/s", HIGHER, "HTTP requests completed per second (ab; without keepalive each is "
                                               "a new TCP connection: TCP_CRR's transactions/s); ab counts failed "
                                               "requests in it too (see ab.failed_requests)", nothing=0.0),
    Metric("ab.transfer_mbps", "Mbit/s", HIGHER, "HTTP response bytes per second (ab), headers included"),
    Metric("ab.transaction_ms", "ms", LOWER, "Time each of the concurrent clients spends per request: concurrency "
                                             "/ request rate, to 1 us (without keepalive: connect, request, "
                                             "response, close and ab's own work until the next connect, netperf "
                                             "TCP_CRR's transaction time)"),
    Metric("ab.latency_p50_ms", "ms", LOWER, "Median HTTP transaction time, ab's connect() to the response's end "
                                             "(ab -e, 1 us)"),
    Metric("ab.latency_p90_ms", "ms", LOWER, "90th percentile HTTP transaction time (ab -e, 1 us)"),
    Metric("ab.latency_p99_ms", "ms", LOWER, "99th percentile HTTP transaction time (ab -e, 1 us)", noise=0.10),
    Metric("ab.latency_p999_ms", "ms", LOWER, "99.9th percentile HTTP transaction time, to +/-0.5 ms: ab gives it "
                                              "only rounded to whole ms (-g), kept between its 1 us p99 and longest",
           noise=0.10),
    Metric("ab.latency_max_ms", "ms", LOWER, "Longest HTTP transaction (ab -e, 1 us)", noise=0.10),
    Metric("ab.connect_mean_ms", "ms", LOWER, "Mean TCP connect time, ab's connect() to its first write, rounded "
                                              "to whole ms by ab (its report; without keepalive only; ~0 on a bare "
                                              "veth)"),
    Metric("ab.connect_p50_ms", "ms", LOWER, "Median TCP connect time, to the nearest whole ms (ab -g; without "
                                             "keepalive only)", resolution=1.0),
    Metric("ab.connect_p90_ms", "ms", LOWER, "90th percentile TCP connect time, to the nearest whole ms (ab -g; "
                                             "without keepalive only)", resolution=1.0),
    Metric("ab.connect_p99_ms", "ms", LOWER, "99th percentile TCP connect time, to the nearest whole ms (ab -g; "
                                             "without keepalive only)", noise=0.10, resolution=1.0),
    Metric("ab.connect_p999_ms", "ms", LOWER, "99.9th percentile TCP connect time, to the nearest whole ms (ab -g; "
                                              "without keepalive only)", noise=0.10, resolution=1.0),
    Metric("ab.failed_requests", "requests", LOWER, "ab's Failed requests (wrong length, connect or socket errors) "
                                                    "plus its Non-2xx responses (one of another length than the "
                                                    "file counts in both)"),
)


# ------------------------------------------------------------------ the commands


def requests_for(seconds: int) -> int:
    return min(INT_MAX, seconds * REQUESTS_PER_SECOND_BOUND)


def client_script(options: Options, url: str, seconds: int) -> list[str]:
    """ab writing its -e and -g files to temporary files on the client's node, then the shell printing them
    after ab's report, each after a marker line: `measure` reads standard output only."""
    argv = ["ab", "-q", "-c", str(options.concurrency), "-s", str(int(options.timeout)),
            # -n after -t: -t sets -n to 50,000 when ab reads it, which would end a fast run early
            "-t", str(seconds), "-n", str(requests_for(seconds))]
    if options.keepalive:
        argv.append("-k")
    argv += ["-e", '"$e"', "-g", '"$g"', '"$1"']
    script = ('e=$(mktemp /tmp/vnb-ab-e.XXXXXX) || exit 1; '
              'g=$(mktemp /tmp/vnb-ab-g.XXXXXX) || { rm -f "$e"; exit 1; }; '
              'trap \'rm -f "$e" "$g"\' EXIT INT TERM; ' + " ".join(argv) + '; rc=$?; '
              # a newline first: ab's "(be patient)..." has none when it gives up
              f'printf "\\n{MARK_PERCENTILES}\\n"; cat "$e"; echo {MARK_REQUESTS}; cat "$g"; exit $rc')
    return ["sh", "-c", script, "ab", url]


# ------------------------------------------------------------------ its output


@dataclass
class AbOutput:
    """What one ab run printed, in ab's units."""

    concurrency: int
    seconds: float  # "Time taken for tests"
    complete: int
    failed: int
    non_2xx: int
    requests_per_s: float | None  # absent when nothing completed
    transfer_kib_per_s: float | None
    connect_mean_ms: int | None  # the report's table, rounded by ab
    total_ms_at_percent: dict[int, float]  # -e: percent -> ms, 1 us
    connect_ms: np.ndarray  # -g, per request, whole ms
    total_ms: np.ndarray  # -g, per request, whole ms


_REPORT = {name: re.compile(pattern, re.M) for name, pattern in {
    "concurrency": r"^Concurrency Level:\s+(\d+)$",
    "seconds": r"^Time taken for tests:\s+([\d.]+) seconds$",
    "complete": r"^Complete requests:\s+(\d+)$",
    "failed": r"^Failed requests:\s+(\d+)$",
    "non_2xx": r"^Non-2xx responses:\s+(\d+)$",
    "requests_per_s": r"^Requests per second:\s+([\d.]+) ",
    "transfer_kib_per_s": r"^Transfer rate:\s+([\d.]+) \[Kbytes/sec\]",
    # "Connect:  min  mean[+/-sd]  median  max", every figure but the sd rounded to whole ms
    "connect_mean_ms": r"^Connect:\s+\d+\s+(\d+)\s",
}.items()}


def _section(lines: list[str], mark: str, end: str | None) -> list[str] | None:
    try:
        start = lines.index(mark) + 1
    except ValueError:
        return None
    stop = lines.index(end, start) if end is not None and end in lines[start:] else len(lines)
    return [x for x in lines[start:stop] if x.strip()]


def parse(text: str) -> AbOutput:
    """ab's report and its -e and -g files, as the client script prints them; an ab that printed no report
    failed (the caller quotes what it said on standard error)."""
    found = {name: rx.search(text) for name, rx in _REPORT.items()}
    if found["complete"] is None or found["seconds"] is None:
        lines = [x.strip() for x in text.splitlines() if x.strip() and not x.startswith("VNB-AB-")]
        raise ToolFailed(f"ab printed no result: {' / '.join(lines[-3:])[-300:] or '(empty output)'}")
    lines = text.splitlines()
    percent_rows = _section(lines, MARK_PERCENTILES, MARK_REQUESTS) or []
    request_rows = _section(lines, MARK_REQUESTS, None) or []
    try:
        at_percent = {int(p): float(ms) for p, ms in (row.split(",") for row in percent_rows[1:])}
        # starttime (a date with spaces), seconds, ctime, dtime, ttime, wait: tab-separated
        table = np.array([row.split("\t")[2:6] for row in request_rows[1:]], dtype=float).reshape(-1, 4)
    except ValueError:
        raise ToolFailed("ab's -e or -g file has a malformed row") from None

    def number(name: str, kind: type = int) -> Any:
        m = found[name]
        return kind(m[1]) if m else None

    return AbOutput(concurrency=number("concurrency"), seconds=number("seconds", float),
                    complete=number("complete"), failed=number("failed") or 0, non_2xx=number("non_2xx") or 0,
                    requests_per_s=number("requests_per_s", float),
                    transfer_kib_per_s=number("transfer_kib_per_s", float), connect_mean_ms=number("connect_mean_ms"),
                    total_ms_at_percent=at_percent, connect_ms=table[:, 0], total_ms=table[:, 2])


def order_statistic(values: np.ndarray, percent: float) -> float:
    """The value at `percent` of the sorted values, picked as ab picks those of its -e file."""
    ordered = np.sort(values)
    return float(ordered[min(len(ordered) - 1, int(0.5 + len(ordered) * percent / 100))])


def measure_result(out: AbOutput, keepalive: bool, requests_asked: int | None = None) -> Measurement:
    if out.complete == 0 or not out.requests_per_s:
        raise ToolFailed(f"ab completed no request in {out.seconds:g}s ({out.failed} failed)")
    if requests_asked is not None and out.complete >= requests_asked:
        raise ToolFailed(f"ab completed all {requests_asked} requests it was given (-n) in {out.seconds:g}s, "
                         f"before its time (-t) was up: over {REQUESTS_PER_SECOND_BOUND} requests/s; raise "
                         "vnetbench.workloads.ab.REQUESTS_PER_SECOND_BOUND")
    at = out.total_ms_at_percent
    if not all(p in at for p in (*PERCENTILES, 100)) or len(out.total_ms) != out.complete:
        raise ToolFailed(f"ab's -e file has {len(at)} of 101 rows and its -g file {len(out.total_ms)} of "
                         f"{out.complete} requests: the files were not written whole")
    m = Measurement()
    m.add("ab.requests_per_s", out.requests_per_s)
    m.add("ab.transfer_mbps", (out.transfer_kib_per_s or 0.0) * 1024 * 8 / 1e6)
    m.add("ab.transaction_ms", out.concurrency / out.requests_per_s * 1e3)
    for p in PERCENTILES:
        m.add(f"ab.latency_p{p}_ms", at[p])
    m.add("ab.latency_max_ms", at[100])
    # -g's whole ms, narrowed by what -e knows to 1 us: p99 <= p99.9 <= the longest
    m.add("ab.latency_p999_ms", min(max(order_statistic(out.total_ms, 99.9), at[99]), at[100]))
    if not keepalive:  # with keep-alive ab counts a reused connection's connect as 0
        if out.connect_mean_ms is not None:
            m.add("ab.connect_mean_ms", out.connect_mean_ms)
        for p, name in ((50, "p50"), (90, "p90"), (99, "p99"), (99.9, "p999")):
            m.add(f"ab.connect_{name}_ms", order_statistic(out.connect_ms, p))
    m.add("ab.failed_requests", out.failed + out.non_2xx)
    return m


def _said(stderr: str) -> str:
    """ab's last words on standard error, e.g. ``apr_socket_recv: Connection refused (111)``."""
    lines = [x.strip() for x in stderr.splitlines() if x.strip()]
    return " / ".join(lines[-2:])[-300:]


# ------------------------------------------------------------------ the driver


@register
class Ab(NginxClient):
    tool = "ab"
    Options = Options
    requires = (AB, NGINX)
    metrics = METRICS
    port, server_label = PORT, "nginx-ab"  # wrk's nginx may run beside it
    overhead_s = OVERHEAD_S

    def client(self, options: Options, url: str, seconds: int) -> list[str]:
        return client_script(options, url, seconds)

    def info(self, seconds: float) -> dict[str, Any]:
        return {"requests": requests_for(int(seconds))}  # -n: a run that used them all ended early

    def measure(self, started: Started, options: Options, ctx: TrialContext,
                outputs: dict[str, str]) -> Measurement:
        label, text = next(iter(outputs.items()))
        with started.quoting("ab", label, _said):  # "apr_socket_recv: Connection refused (111)" is on stderr
            out = parse(text)
        return measure_result(out, options.keepalive, started.info.get("requests"))

    def raw(self, started: Started, outputs: dict[str, str]) -> dict[str, str]:
        """ab's report and -e file, and the first rows of its -g file (a row per request: megabytes)."""
        kept = {}
        for label, text in outputs.items():
            lines = text.splitlines()
            try:
                first = lines.index(MARK_REQUESTS) + 2 + RAW_REQUEST_ROWS  # the marker, the header, the rows
            except ValueError:
                first = len(lines)
            kept[label] = "\n".join(lines[:first]) + (f"\n... ({len(lines) - first} more request rows not kept)"
                                                      if len(lines) > first else "")
        return kept
