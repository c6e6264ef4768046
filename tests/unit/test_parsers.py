"""iperf3 and ping parsing, on outputs recorded from the real tools in a vnetbench lab
(tests/fixtures; 100 Mbit/s tbf bottleneck with a 500 kB buffer unless said otherwise)."""

from pathlib import Path

import numpy as np
import pytest

from vnetbench.workloads import iperf3, ping
from vnetbench.workloads.base import ToolFailed

FIX = Path(__file__).parent.parent / "fixtures"


def fixture(name):
    return (FIX / name).read_text()


def test_udp_overload_counts_loss_at_the_receiver():
    # 200 Mbit/s offered into 100 Mbit/s: about half is lost.
    f = iperf3.parse_client(fixture("iperf3_udp_overload_omit.json"))
    assert f.proto == "udp"
    assert f.sent_bps / 1e6 == pytest.approx(200, rel=0.01)
    assert f.received_bps / 1e6 == pytest.approx(97, rel=0.02)  # 100 Mbit/s x 1448/1490 B per frame
    assert f.sent_packets == f.received_packets + f.lost_packets
    assert f.lost_packets / f.sent_packets == pytest.approx(0.5, abs=0.03)
    assert f.jitter_ms is not None and f.jitter_ms >= 0
    # Omitted warm-up intervals and the receiver's short tail are not per-second points.
    assert len(f.tx_t) == 3 and len(f.rx_t) == 3
    assert np.all(np.diff(f.rx_t) > 0.5)


def test_udp_underload_has_no_loss():
    f = iperf3.parse_client(fixture("iperf3_udp_underload.json"))
    assert f.lost_packets == 0 and f.received_bps / 1e6 == pytest.approx(30, rel=0.01)


def test_tcp_cubic_with_omit_has_cwnd_and_rtt_series():
    f = iperf3.parse_client(fixture("iperf3_tcp_cubic_omit.json"))
    assert f.proto == "tcp" and f.congestion_control == "cubic"
    assert f.received_bps / 1e6 == pytest.approx(95.6, rel=0.02)
    assert f.retransmits == 1
    assert len(f.cwnd_bytes) == 3 and np.all(f.cwnd_bytes > 1448)
    # A full 500 kB queue at 100 Mbit/s adds up to 40 ms: the sender's smoothed RTT sits near it.
    assert np.all((f.srtt_ms > 20) & (f.srtt_ms < 50))


def test_tcp_ipv6_parallel_sums_streams():
    f = iperf3.parse_client(fixture("iperf3_tcp_ipv6_parallel.json"))
    assert f.congestion_control == "reno" and f.received_bps / 1e6 == pytest.approx(94.3, rel=0.02)
    assert f.retransmits == 412


def test_tcp_reverse_takes_receiver_from_the_client_side():
    f = iperf3.parse_client(fixture("iperf3_tcp_reverse.json"))
    assert f.received_bps / 1e6 == pytest.approx(40.4, rel=0.02)
    assert f.cwnd_bytes is not None  # sender intervals come from the server document when reversed
    assert len(f.rx_t) == 2


def test_iperf3_errors_are_quoted():
    with pytest.raises(ToolFailed, match="Connection refused"):
        iperf3.parse_client(fixture("iperf3_connect_refused.json"))
    with pytest.raises(ToolFailed, match="no JSON"):
        iperf3.parse_client("iperf3: error - unable to connect\n")


def test_measure_aggregates_flows_and_fairness():
    flows = {"s1": iperf3.parse_client(fixture("iperf3_udp_overload_omit.json")),
             "s2": iperf3.parse_client(fixture("iperf3_udp_underload.json"))}
    m = iperf3.measure(flows, offered_bps=230e6, t_offset=1.0)
    got = {s.metric: s.value for s in m.samples}
    assert got["throughput.offered_mbps"] == pytest.approx(230)
    assert got["throughput.rx_mbps"] == pytest.approx((flows["s1"].received_bps + flows["s2"].received_bps) / 1e6)
    sent = flows["s1"].sent_packets + flows["s2"].sent_packets
    assert got["udp.loss_ratio"] == pytest.approx(flows["s1"].lost_packets / sent)
    assert 0.5 < got["flows.jain_fairness"] < 1
    units = {s.metric: (s.unit, s.direction) for s in m.samples}
    assert units["udp.loss_ratio"] == ("ratio", "lower") and units["throughput.rx_mbps"] == ("Mbit/s", "higher")
    series = {s.name: s for s in m.series}
    assert series["throughput_mbps/s1"].t[0] == pytest.approx(2.0, abs=0.01)  # omit offset applied


def test_jain_fairness():
    assert iperf3.jain_fairness([50, 50]) == pytest.approx(1.0)
    assert iperf3.jain_fairness([100, 0]) == pytest.approx(0.5)
    assert iperf3.jain_fairness([30, 30, 30, 10]) == pytest.approx(100**2 / (4 * 2800))


def test_client_command_flags():
    spec = iperf3.ClientSpec(server="198.18.0.2", port=5202, proto="udp", duration=20, omit=2, rate_bps=50e6,
                             congestion_control=None, length=1400, ip_version=4)
    argv = iperf3.client_command(spec)
    assert argv[:5] == ["iperf3", "--client", "198.18.0.2", "--port", "5202"]
    for flag in ("--udp", "--json", "--get-server-output", "-4"):
        assert flag in argv
    assert argv[argv.index("--bitrate") + 1] == "50000000" and argv[argv.index("--length") + 1] == "1400"
    assert argv[argv.index("--omit") + 1] == "2"
    tcp = iperf3.client_command(iperf3.ClientSpec("2001:2::1", 5201, "tcp", 5, 0, None, "cubic", None, 4, True, 6))
    assert "--omit" not in tcp and "--bitrate" not in tcp and tcp[tcp.index("--congestion") + 1] == "cubic"
    assert "--parallel" in tcp and "--reverse" in tcp and "-6" in tcp


def test_ping_parse_per_packet():
    r = ping.parse(fixture("ping_idle.txt"))
    assert r.transmitted == 50 and r.received == 50 and len(r.rtt_ms) == 50
    assert r.rtt_ms.min() == pytest.approx(0.028) and r.rtt_ms.max() == pytest.approx(0.074)
    m = ping.measure(r, t0=r.timestamps[0] - 1.0)
    got = {s.metric: s.value for s in m.samples}
    # ping's own summary line: rtt min/avg/max/mdev = 0.028/0.036/0.074/0.006 ms
    assert got["rtt.min_ms"] == pytest.approx(0.028)
    assert got["rtt.avg_ms"] == pytest.approx(0.036, abs=0.001)  # ping truncates to 3 decimals
    assert got["rtt.stdev_ms"] == pytest.approx(0.006, abs=0.0006)
    assert got["rtt.loss_ratio"] == 0
    assert got["rtt.p50_ms"] <= got["rtt.p99_ms"] <= got["rtt.max_ms"]
    assert m.series[0].name == "rtt_ms" and m.series[0].t[0] == pytest.approx(1.0)


def test_ping_ipv6_and_unreachable():
    assert ping.parse(fixture("ping_ipv6.txt")).received == 20
    r = ping.parse(fixture("ping_unreachable.txt"))
    assert r.received == 0 and r.transmitted == 12
    got = {s.metric: s.value for s in ping.measure(r, 0).samples}
    assert got == {"rtt.loss_ratio": 1.0}
    with pytest.raises(ToolFailed, match="no statistics"):
        ping.parse("ping: connect: Network is unreachable\n")


def test_ipdv_uses_consecutive_pairs_only():
    seq = np.array([1, 2, 3, 5, 6])
    rtt = np.array([1.0, 3.0, 2.0, 10.0, 10.5])
    # pairs (1,2),(2,3),(5,6): |2| + |1| + |0.5| over 3; the gap 3->5 is not a pair.
    assert ping.ipdv_ms(seq, rtt) == pytest.approx(3.5 / 3)


def test_ping_command():
    argv = ping.command("198.18.0.1", 0.001, 1450, 15, 4)
    assert argv == ["ping", "-4", "-D", "-n", "-i", "0.001", "-s", "1450", "-w", "15", "198.18.0.1"]
    assert ping.command("2001:2::1", 0.001, 56, 3, 6, preload=65)[-3:] == ["-l", "65", "2001:2::1"]
    assert ping.preload_for(0.001, 0.065) == 65 and ping.preload_for(1.0, 0.065) == 1


def test_standing_queue_is_the_floor_of_rtt_after_a_flow_ends_less_the_base():
    from vnetbench.workloads.base import Measurement

    t = np.arange(0, 10, 0.01)
    # Two flows fill a 20 ms queue until t = 7; then one flow's queue saws between 12 and 20 ms above a
    # 5 ms base (CUBIC backing off to 0.7 of its window and growing back, period 1 s).
    sawtooth = 12 + 8 * ((t - 7) % 1.0)
    rtt = np.where(t < 7, 5 + 20.0, 5 + sawtooth)
    m = Measurement()
    m.add_series("rtt_ms", "ms", t, rtt)
    ping.standing_queue(m, after_s=8.0, base_rtt_ms=5.0)
    (s,) = [x for x in m.samples if x.metric == "queue.standing_ms"]
    assert s.value == pytest.approx(12.4, abs=0.1) and s.unit == "ms" and s.direction == "lower"
    # A flow that drains the queue now and then (BBR's ProbeRTT) leaves next to nothing standing.
    drained = Measurement()
    drained.add_series("rtt_ms", "ms", t, np.where((t % 1.0) < 0.2, 5.05, 15.0))
    ping.standing_queue(drained, after_s=8.0, base_rtt_ms=5.0)
    assert [x.value for x in drained.samples] == [pytest.approx(0.05)]
    # Too few samples after the flow ended: no estimate rather than a noisy one.
    short = Measurement()
    short.add_series("rtt_ms", "ms", t, rtt)
    ping.standing_queue(short, after_s=9.9, base_rtt_ms=5.0)
    assert short.samples == []


def test_udp_out_of_order_is_the_receivers_count_over_its_streams():
    import json

    doc = json.loads(fixture("iperf3_udp_underload.json"))
    assert iperf3.parse_client(json.dumps(doc)).out_of_order == 0
    doc["server_output_json"]["end"]["streams"][0]["udp"]["out_of_order"] = 7
    doc["end"]["streams"][0]["udp"]["out_of_order"] = 99  # the client's copy: not the receiver's own count
    flow = iperf3.parse_client(json.dumps(doc))
    assert flow.out_of_order == 7
    got = {s.metric: s.value for s in iperf3.measure({"s1": flow, "s2": flow}, offered_bps=None).samples}
    assert got["udp.out_of_order_packets"] == 14
    del doc["server_output_json"]
    assert iperf3.parse_client(json.dumps(doc)).out_of_order == 99  # no server document: the client's copy
    for st in doc["end"]["streams"]:
        del st["udp"]["out_of_order"]
    old = iperf3.parse_client(json.dumps(doc))
    assert old.out_of_order is None  # an iperf3 without the count: no metric rather than a 0
    assert "udp.out_of_order_packets" not in {s.metric for s in iperf3.measure({"s1": old}, None).samples}


def test_the_preloads_burst_and_what_waits_behind_it_are_left_out():
    """ping -l N sends N requests back to back; recorded: 56 requests of 1400 B into a 5 Mbit/s tbf, RTTs
    growing from 1.2 to 123.5 ms: the burst's own queue. Replaying the link with the probe's requests alone
    finds every one of them but the first waited; they are left out."""
    train = ping.parse(fixture("ping_train_tbf_5mbit.txt"))
    frame_s = ping.frame_bits(1400, 4) / 5e6  # 2.3 ms
    waited = ping.waited_behind_own(train, frame_s)
    assert not waited[np.argmin(train.seq)] and waited.sum() == len(train.seq) - 1
    # each waited about one frame time more than the one before it: the replay and the link agree
    assert np.diff(np.sort(train.rtt_ms)).mean() == pytest.approx(frame_s * 1e3, rel=0.1)

    # 5 ms apart through 2.4 ms frames: a burst of 3, then seq 4 (sent at 5 ms) still waits 2.2 ms behind it; a
    # pair sent back to back after a late wake-up (seq 9, 10); one lost (11)
    send = np.array([0, 0, 0, 5, 10, 15, 20, 25, 31, 31.1, 36, 41, 46], dtype=float) * 1e-3
    seq = np.arange(1, 14)
    rtt = np.array([20, 22.4, 24.8, 22.2, 20, 20, 20, 20, 20, 22.3, 20, 20, 20], dtype=float)
    lost = seq != 11
    result = ping.PingResult(13, 12, (send + rtt / 1e3)[lost], seq[lost], rtt[lost])
    kept = ping.own_queue_left_out(result, preload=3, frame_s=0.0024)
    assert list(kept.seq) == [5, 6, 7, 8, 9, 12, 13]  # not the burst (1-3), nor 4 and 10 that waited behind it
    assert (kept.transmitted, kept.received) == (10, 9)  # loss over the requests after the burst: 1 of 10
    got = {m.metric: m.value for m in ping.measure(kept, t0=0.0).samples}
    assert got["rtt.avg_ms"] == 20 and got["rtt.max_ms"] == 20 and got["rtt.loss_ratio"] == pytest.approx(0.1)
    # a probe that is a load itself (frame_s 0): its own queue is what it measures; only the burst goes
    assert list(ping.own_queue_left_out(result, preload=3, frame_s=0.0).seq) == [4, 5, 6, 7, 8, 9, 10, 12, 13]
    # (seq 4 and 10 then count with the queue the probe itself built)
    # ping prints 3 significant digits: a pair's send times, reply time less RTT, can come out in the wrong order
    # (14.8 ms printed for 14.849): the order is icmp_seq's, the later of the two is the one that waited
    pair = ping.PingResult(2, 2, np.array([1.0125, 1.014849]), np.array([7, 8]), np.array([12.5, 14.8]))
    assert list(ping.waited_behind_own(pair, 0.0024)) == [False, True]
    assert list(ping.rtt_resolution_ms(np.array([0.052, 2.4, 14.8, 123.0]))) == [0.001, 0.01, 0.1, 1.0]
    assert list(ping.own_queue_left_out(result, preload=1, frame_s=0.0).seq) == list(seq[lost])
    with pytest.raises(ToolFailed, match="nothing is left to measure"):
        ping.own_queue_left_out(result, preload=13, frame_s=0.0024)


def test_the_slowest_rate_on_the_path():
    from vnetbench.impair.model import slowest_rate
    from vnetbench.scenario.load import load_text

    def lab(text: str):
        return load_text('name = "x"\n[workload.p]\ntool = "ping"\n' + text, "x.toml").scenario.lab

    assert slowest_rate(lab('[lab]\nbottleneck = "unlimited"\n')) is None
    assert slowest_rate(lab('[lab]\nbottleneck = "100Mbit"\n')) == 100e6
    assert slowest_rate(lab('[lab]\nbottleneck = "100Mbit"\n[lab.link.s1.reverse]\nrate = "5Mbit"\n')) == 5e6
