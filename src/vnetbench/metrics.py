"""The metrics vnetbench records: stable dotted names, units, and which way is better.

Definitions follow the RFCs so numbers mean the same thing in every report:
RTT per RFC 2681, loss ratio per RFC 7680 (lost / sent), IPDV per RFC 3393.
iperf3's ``jitter_ms`` is RFC 3550's smoothed interarrival jitter, which is not
IPDV; its metric name says so.

Every sample stored carries its unit and direction from here, so comparisons
never count an improvement as a failure.
"""

from __future__ import annotations

from dataclasses import dataclass

HIGHER = "higher"
LOWER = "lower"


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    direction: str  # HIGHER or LOWER is better
    description: str
    noise: float | None = None  # default noise threshold for comparisons, if not the global one


_METRICS = [
    Metric("throughput.offered_mbps", "Mbit/s", HIGHER, "Offered load: the sum of the senders' target rates"),
    Metric("throughput.tx_mbps", "Mbit/s", HIGHER, "Sent throughput, summed over flows (sender side, iperf3)"),
    Metric("throughput.rx_mbps", "Mbit/s", HIGHER, "Received throughput (goodput), summed over flows (receiver side, iperf3)"),
    Metric("flows.jain_fairness", "ratio", HIGHER, "Jain's fairness index of the flows' received throughput (1 = equal shares)"),
    Metric("udp.loss_ratio", "ratio", LOWER, "UDP packet loss ratio, lost / sent, over all flows (RFC 7680)"),
    Metric("udp.lost_packets", "packets", LOWER, "UDP packets lost, over all flows"),
    Metric("udp.sent_packets", "packets", HIGHER, "UDP packets sent, over all flows"),
    Metric("udp.jitter_rfc3550_ms", "ms", LOWER, "iperf3's jitter: RFC 3550 smoothed interarrival jitter (not IPDV), mean over flows"),
    Metric("tcp.retransmits", "segments", LOWER, "TCP retransmitted segments, over all flows (sender side)"),
    Metric("tcp.mean_srtt_ms", "ms", LOWER, "Mean smoothed RTT reported by the TCP sender, over intervals and flows"),
    Metric("bottleneck.drops", "packets", LOWER, "Packets the bottleneck qdisc dropped during the trial (kernel counters)"),
    Metric("rtt.min_ms", "ms", LOWER, "Minimum round-trip time (RFC 2681), ping during the load"),
    Metric("rtt.avg_ms", "ms", LOWER, "Mean round-trip time (RFC 2681), ping during the load"),
    Metric("rtt.max_ms", "ms", LOWER, "Maximum round-trip time, ping during the load", noise=0.10),
    Metric("rtt.stdev_ms", "ms", LOWER, "Standard deviation of round-trip times, ping during the load", noise=0.10),
    Metric("rtt.p50_ms", "ms", LOWER, "Median round-trip time, ping during the load"),
    Metric("rtt.p90_ms", "ms", LOWER, "90th percentile round-trip time, ping during the load"),
    Metric("rtt.p99_ms", "ms", LOWER, "99th percentile round-trip time, ping during the load", noise=0.10),
    Metric("rtt.p999_ms", "ms", LOWER, "99.9th percentile round-trip time, ping during the load", noise=0.10),
    Metric("rtt.ipdv_ms", "ms", LOWER, "Mean absolute IPDV between consecutive ping replies (RFC 3393)"),
    Metric("rtt.loss_ratio", "ratio", LOWER, "Ping packets without a reply / sent (RFC 7680)"),
    Metric("queue.standing_ms", "ms", LOWER, "Queueing delay left standing after the earliest-ending of staggered "
                                            "flows stopped: 5th percentile of ping RTT from 1 s after, less the "
                                            "links' configured base RTT (seed 001's window scaling test)",
           noise=0.10),
    # TCP state sampled with `ss -ti` during the load (workloads/tcpinfo.py), over the data connections
    Metric("ss.srtt_p50_ms", "ms", LOWER, "Median smoothed RTT of the TCP senders, sampled with ss -ti"),
    Metric("ss.srtt_p99_ms", "ms", LOWER, "99th percentile smoothed RTT of the TCP senders, sampled with ss -ti",
           noise=0.10),
    Metric("ss.cwnd_median_segments", "segments", HIGHER, "Median congestion window (segments), mean over flows, "
                                                          "sampled with ss -ti"),
    Metric("ss.retrans_segments", "segments", LOWER, "Retransmitted segments (ss -ti retrans total), over flows"),
    Metric("ss.samples_per_s", "1/s", HIGHER, "ss -ti samples per second actually taken (sampler cadence)",
           noise=0.5),
    # The link emulator's own counters over the trial (impair/, userspace backend)
    Metric("link.lost_packets", "packets", LOWER, "Packets the link's loss model dropped (forward direction)"),
    Metric("link.max_queue_delay_ms", "ms", LOWER, "Longest time a packet waited in the emulated link's queue "
                                                   "(forward direction)", noise=0.10),
]

METRICS: dict[str, Metric] = {m.name: m for m in _METRICS}


def metric(name: str) -> Metric:
    """Metadata for a metric; unknown names are a programming error, said loudly."""
    try:
        return METRICS[name]
    except KeyError:
        raise KeyError(f"metric {name!r} is not registered in vnetbench.metrics") from None
