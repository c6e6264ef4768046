"""HTTP transactions: wrk on the first sender against nginx on the receiver, a fixed file of `file_size`.

Both run inside the environment under test (bare, container, VM guest, overlay),
so its cost is measured on the real path. nginx (Debian ``nginx-light``) is
started by vnetbench with a configuration of its own: one file per size the run
asks for, no access log, ``worker_processes`` from the option ``workers``.

- ``connection = "keep-alive"``: ``connections`` open connections shared by
  ``threads`` wrk threads, each sending its next request when the answer is in
  (seed 003's 1/4/16 workers: ``threads = connections = workers``);
- ``connection = "close"``: every request on a new connection (wrk sends
  ``Connection: close``; nginx closes after the response): netperf TCP_CRR's
  transaction, connect + request + response + close, with an HTTP request.

Latency percentiles come from wrk's own HdrHistogram of every request (1 us
resolution), read through its Lua ``done()`` hook, not from its printed
summary; wrk times a request from its first byte written to the response's
last byte read, so a new connection's handshake is not in it (in CRR mode,
``http.transaction_ms`` = connections / rate is the whole transaction's time).

::

    [workload.web]
    tool = "wrk"
    connections = 16
    threads = 2
    file_size = "1KiB"
    duration = "10s"
"""

from __future__ import annotations

import hashlib
import json
import shlex
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from vnetbench.metrics import HIGHER, LOWER, Metric
from vnetbench.quantities import Duration, Size, WholeSeconds
from vnetbench.tools import NGINX, WRK
from vnetbench.workloads.base import (Measurement, ServerSpec, Started, ToolFailed, TrialContext, TrialEndpoints,
                                      Workload, WorkloadOptions)
from vnetbench.workloads.registry import register

PORT = 5320  # inside the range the container model publishes
MAX_FILE = 1 << 30
PERCENTILES = (50, 90, 99, 99.9)
OVERHEAD_S = 10.0  # beyond --duration: threads start, connections close, the report is written
MARK = "VNB-WRK-JSON "

# wrk's done() hook: every figure of the run as one JSON line (its histogram's percentiles at 1 us).
DONE_LUA = r"""
done = function(summary, latency, requests)
  local e = summary.errors
  local p = {}
  for _, q in ipairs({PERCENTILES}) do p[#p + 1] = string.format('"%g":%d', q, latency:percentile(q)) end
  io.write(string.format(
    'MARK{"duration_us":%d,"requests":%d,"bytes":%d,' ..
    '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
    '"latency_us":{"min":%d,"max":%d,"mean":%.3f,"stdev":%.3f,"percentiles":{%s}}}\n',
    summary.duration, summary.requests, summary.bytes, e.connect, e.read, e.write, e.status, e.timeout,
    latency.min, latency.max, latency.mean, latency.stdev, table.concat(p, ",")))
end
""".replace("{PERCENTILES}", "{" + ", ".join(f"{q:g}" for q in PERCENTILES) + "}").replace("MARK", MARK)


class HttpOptions(WorkloadOptions):
    """What every HTTP client against vnetbench's nginx has: the file it fetches, the server's workers, how
    long it runs (wrk and ab add their own options)."""

    file_size: Size = Field(default=1024, description="size of the file every request fetches")
    workers: int = Field(default=1, ge=1, le=64, description="nginx worker processes on the receiver")
    duration: WholeSeconds = Field(default=10.0, description="on its own: how long it runs (whole seconds); during "
                                                         "another workload it lasts that one's measured time")

    @field_validator("file_size")
    @classmethod
    def _file_size(cls, v: float) -> float:
        if v != int(v) or not 0 < v <= MAX_FILE:
            raise ValueError(f"{v:g} B: the served file is 1 B to 1 GiB, whole bytes")
        return v


class Options(HttpOptions):
    """HTTP requests with wrk against nginx on the receiver."""

    tool: Literal["wrk"] = "wrk"
    connections: int = Field(default=1, ge=1, le=10_000, description="open connections (wrk -c)")
    threads: int = Field(default=1, ge=1, le=256, description="wrk threads (-t); at most `connections`")
    connection: Literal["keep-alive", "close"] = Field(default="keep-alive", description="close: a new "
                                                       "connection per request (netperf TCP_CRR's transaction)")
    timeout: Duration = Field(default=2.0, description="a request without an answer this long counts as a "
                                                       "timeout (wrk --timeout)")

    @model_validator(mode="after")
    def _threads(self) -> "Options":
        if self.threads > self.connections:
            raise ValueError(f"threads = {self.threads} is more than connections = {self.connections}: each wrk "
                             "thread needs a connection of its own; lower threads or raise connections")
        return self


METRICS = (
    Metric("http.requests_per_s", "1/s", HIGHER, "HTTP requests answered per second (wrk; with connection = close "
                                                 "each is a new TCP connection: TCP_CRR's transactions/s)", nothing=0.0),
    Metric("http.transfer_mbps", "Mbit/s", HIGHER, "HTTP response bytes per second (wrk), headers included"),
    Metric("http.latency_mean_ms", "ms", LOWER, "Mean HTTP request latency, first byte sent to last byte received "
                                                "(wrk's histogram of every request)"),
    Metric("http.latency_stdev_ms", "ms", LOWER, "Standard deviation of HTTP request latency (wrk)", noise=0.10),
    Metric("http.latency_p50_ms", "ms", LOWER, "Median HTTP request latency (wrk's histogram)"),
    Metric("http.latency_p90_ms", "ms", LOWER, "90th percentile HTTP request latency (wrk's histogram)"),
    Metric("http.latency_p99_ms", "ms", LOWER, "99th percentile HTTP request latency (wrk's histogram)", noise=0.10),
    Metric("http.latency_p999_ms", "ms", LOWER, "99.9th percentile HTTP request latency (wrk's histogram)",
           noise=0.10),
    Metric("http.latency_max_ms", "ms", LOWER, "Longest HTTP request (wrk)", noise=0.10),
    Metric("http.transaction_ms", "ms", LOWER, "Mean time one connection spends per request: connections / "
                                               "request rate (with connection = close: connect, request, "
                                               "response and close, netperf TCP_CRR's transaction time)"),
    Metric("http.errors", "requests", LOWER, "Requests that failed: connect, read or write errors, and non-2xx/3xx "
                                             "answers (wrk)"),
    Metric("http.timeouts", "requests", LOWER, "Requests without an answer within `timeout` (wrk)"),
)


def file_name(size: float) -> str:
    return f"f{int(size)}"


def server_script(address: str, ip_version: int, sizes: list[int], workers: int, directory: str,
                  port: int = PORT) -> list[str]:
    """nginx in the foreground with a configuration and files of its own, made in `directory` on the
    node it runs on (a NamespaceNode and a GuestNode alike; the run's work directory goes at teardown)."""
    listen = f"[{address}]:{port}" if ip_version == 6 else f"{address}:{port}"
    conf = "\n".join([
        # user root: the run's directory is private to root, and a guest knows no other user
        "daemon off;", "master_process on;", "user root root;", f"worker_processes {workers};",
        f"pid {directory}/nginx.pid;",
        "error_log stderr warn;", "events { worker_connections 16384; }",
        "http {", "  access_log off;", "  sendfile on;", "  tcp_nopush on;", "  tcp_nodelay on;",
        "  keepalive_requests 100000000;", "  keepalive_timeout 600s;", "  default_type application/octet-stream;",
        *(f"  {k}_temp_path {directory}/{k};" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")),
        f"  server {{ listen {listen} backlog=4096; root {directory}/www; }}", "}", ""])
    files = " && ".join(f'head -c {n} /dev/zero > "$d/www/{file_name(n)}"' for n in sizes)
    script = (f'd={shlex.quote(directory)}; mkdir -p "$d/www" && {files} && printf "%s" "$1" > "$d/nginx.conf" && '
              'exec nginx -p "$d" -e stderr -c "$d/nginx.conf"')
    return ["sh", "-c", script, "nginx", conf]


def nginx_server(hosts: TrialEndpoints, ip_version: int, options: list[Any], workdir: str, port: int,
                 label: str) -> ServerSpec:
    """One nginx on the receiver for the whole run, serving every `file_size` its configurations ask for
    with as many workers as the most any asks (idle ones cost nothing); HTTP clients (wrk, ab) each have
    their own, on their own port, so that both can be in one scenario."""
    sizes = sorted({int(o.file_size) for o in options})
    workers = max(o.workers for o in options)
    receiver = hosts.receiver
    # One directory per receiver (the lab's variants share this machine's file system), named by a digest of
    # the receiver's name and not the name: on real hosts that is an inventory's, and the directory goes into
    # a path, a shell line and nginx's configuration.
    node = hashlib.sha256(receiver.name.encode()).hexdigest()[:12]
    argv = server_script(receiver.address(ip_version), ip_version, sizes, workers, f"{workdir}/{label}-{node}", port)
    return ServerSpec(receiver, argv, port, "tcp", label)


def file_url(ctx: TrialContext, port: int, size: float) -> str:
    """The URL of the served file of `size`, at the receiver's service address."""
    address = ctx.endpoints.receiver.service_address(ctx.ip_version)
    host = f"[{address}]" if ctx.ip_version == 6 else address
    return f"http://{host}:{port}/{file_name(size)}"


def client_script(options: Options, url: str, seconds: int) -> list[str]:
    """wrk with its done() hook written to a temporary file on the client's node (wrk reads scripts from
    files only); the JSON line it prints is what is parsed."""
    argv = ["wrk", "-t", str(options.threads), "-c", str(options.connections), "-d", f"{seconds}s",
            "--timeout", f"{options.timeout:g}s", "-s", '"$f"']
    if options.connection == "close":
        argv += ["-H", "'Connection: close'"]
    script = ('f=$(mktemp /tmp/vnb-wrk.XXXXXX) || exit 1; trap \'rm -f "$f"\' EXIT INT TERM; '
              'printf "%s" "$1" > "$f"; ' + " ".join(argv) + ' "$2"')
    return ["sh", "-c", script, "wrk", DONE_LUA, url]


def parse(text: str) -> dict[str, Any]:
    """The done() hook's JSON line; a wrk that printed none failed (its message is quoted)."""
    for line in text.splitlines():
        if line.startswith(MARK):
            try:
                return json.loads(line[len(MARK):])
            except json.JSONDecodeError:
                raise ToolFailed(f"wrk's result line is not JSON: {line[:200]!r}") from None
    snippet = " / ".join(x.strip() for x in text.strip().splitlines()[-3:])[-300:] or "(empty output)"
    raise ToolFailed(f"wrk printed no result: {snippet}")


def measure_result(doc: dict[str, Any], connections: int) -> Measurement:
    m = Measurement()
    seconds = doc["duration_us"] / 1e6
    requests = doc["requests"]
    if requests == 0 or seconds <= 0:
        e = doc["errors"]
        raise ToolFailed(f"wrk completed no request in {seconds:g}s (errors: connect {e['connect']}, read "
                         f"{e['read']}, write {e['write']}, timeout {e['timeout']})")
    rate = requests / seconds
    m.add("http.requests_per_s", rate)
    m.add("http.transfer_mbps", doc["bytes"] * 8 / seconds / 1e6)
    m.add("http.transaction_ms", connections / rate * 1e3)
    lat = doc["latency_us"]
    m.add("http.latency_mean_ms", lat["mean"] / 1e3)
    m.add("http.latency_stdev_ms", lat["stdev"] / 1e3)
    m.add("http.latency_max_ms", lat["max"] / 1e3)
    for q in PERCENTILES:
        m.add(f"http.latency_p{f'{q:g}'.replace('.', '')}_ms", lat["percentiles"][f"{q:g}"] / 1e3)
    e = doc["errors"]
    m.add("http.errors", e["connect"] + e["read"] + e["write"] + e["status"])
    m.add("http.timeouts", e["timeout"])
    return m


class NginxClient(Workload):
    """An HTTP client on the first sender against an nginx of its own on the receiver, on `port`; a
    subclass says how to start its client (`client`) and what it records at the start (`info`)."""

    port: ClassVar[int]
    server_label: ClassVar[str]
    overhead_s: ClassVar[float] = OVERHEAD_S  # beyond its run and its timeout: starting, writing its report

    def client(self, options: Any, url: str, seconds: int) -> list[str]:
        raise NotImplementedError

    def info(self, seconds: float) -> dict[str, Any]:
        return {}

    def timing(self, options: HttpOptions, config: Any) -> tuple[float, float]:
        return 0.0, float(options.duration)

    def start(self, name: str, options: Any, ctx: TrialContext) -> Started:
        begins, seconds = ctx.window(options.duration)
        started = Started(name, measured_from=begins, measured_s=seconds,
                          ends_by=begins + seconds + options.timeout + self.overhead_s, info=self.info(seconds))
        sender = ctx.endpoints.senders[0]
        url = file_url(ctx, self.port, options.file_size)
        started.procs[sender.name], started.outputs[sender.name] = ctx.popen(
            sender, name, self.client(options, url, int(seconds)))
        return started

    def servers(self, hosts: TrialEndpoints, ip_version: int, options: list[HttpOptions],
                workdir: str) -> list[ServerSpec]:
        return [nginx_server(hosts, ip_version, options, workdir, self.port, self.server_label)]


@register
class Wrk(NginxClient):
    tool = "wrk"
    Options = Options
    requires = (WRK, NGINX)
    metrics = METRICS
    port, server_label = PORT, "nginx"

    def client(self, options: Options, url: str, seconds: int) -> list[str]:
        return client_script(options, url, seconds)

    def measure(self, started: Started, options: Options, ctx: TrialContext,
                outputs: dict[str, str]) -> Measurement:
        label, text = next(iter(outputs.items()))
        with started.quoting("wrk", label):
            doc = parse(text)
        return measure_result(doc, options.connections)

