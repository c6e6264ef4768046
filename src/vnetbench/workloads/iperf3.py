"""iperf3: command lines and parsing of its JSON output (``-J``).

Clients run with ``--get-server-output`` against servers started with ``-J``,
so each client's JSON also carries the receiver's per-second intervals. The
client measures the sending side, the server the receiving side: received
throughput and loss come from the receiver, never from the sender's guess.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from vnetbench.workloads.base import Measurement, ToolFailed

BASE_PORT = 5201


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
            "--time", f"{spec.duration:g}", "--omit", f"{spec.omit:g}", "-" + str(spec.ip_version)]
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

    sent_packets = received_packets = lost = None
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
