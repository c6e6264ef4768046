"""The `ss -ti` sampler: parsing real output recorded in a lab, picking iperf3's
data connections, series and per-trial metrics.

Fixtures (tests/fixtures/ss_*) were recorded in namespaces on this project's
lab: two iperf3 flows (IPv4 and IPv6, cubic, through a 20 Mbit/s tbf) sampled
by the sampler loop; the receiver's side of the same flows; plain `ss -tinH`
(two lines per socket); and the sampler's output kept with a
dynamic-congestion trial (its iperf3 JSON's port lists beside it).
"""

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from vnetbench.scenario import load as L
from vnetbench.workloads import iperf3, ss as T
from vnetbench.workloads.base import ToolFailed

FIX = Path(__file__).resolve().parent.parent / "fixtures"


def text(name):
    return (FIX / name).read_text()


def test_info_line_fields():
    info = T.parse_info("cubic wscale:9,9 rto:236 rtt:33.736/2.731 mss:1448 pmtu:1500 rcvmss:536 advmss:1448 "
                        "cwnd:40 ssthresh:33 bytes_sent:1550237 bytes_retrans:5792 bytes_acked:1493766 "
                        "send 13734883bps lastsnd:4 pacing_rate 16481488bps delivery_rate 12.3Mbps delivered:1034 "
                        "busy:1004ms rwnd_limited:12ms(1.2%) unacked:35 retrans:0/4 minrtt:0.013 "
                        "bbr:(bw:1448000000bps,mrtt:0.008)")
    assert info["cc"] == "cubic" and info["cwnd"] == 40 and info["ssthresh"] == 33 and info["mss"] == 1448
    assert info["srtt_ms"] == pytest.approx(33.736) and info["rttvar_ms"] == pytest.approx(2.731)
    assert info["retrans"] == 4 and info["retrans_now"] == 0 and info["bytes_retrans"] == 5792
    assert info["delivery_rate_bps"] == pytest.approx(12.3e6) and info["pacing_rate_bps"] == 16481488
    assert "bw" not in info and "mrtt" not in info  # BBR's nested fields are not the socket's


def test_sampler_output_ipv4_and_ipv6():
    samples = T.parse(text("ss_tinHO_loop_ipv4_ipv6.txt"))
    flows = T.flows(samples)
    assert len(flows) == 4  # two data connections, two iperf3 control connections
    assert {f.local for f in flows.values()} == {"198.18.0.1:38906", "198.18.0.1:38910", "[2001:2::1]:50888",
                                                "[2001:2::1]:50892"}
    ports = (iperf3.data_ports(text("ss_loop_iperf3_ipv4.json"))
             | iperf3.data_ports(text("ss_loop_iperf3_ipv6.json")))
    assert ports == {38910, 50892}
    data = T.data_flows(flows, ports)
    assert sorted(f.local_port for f in data) == [38910, 50892]
    # without iperf3's list, the control connections are told apart by what they moved
    assert sorted(f.local_port for f in T.data_flows(flows, None)) == [38910, 50892]
    v4 = next(f for f in data if f.local_port == 38910)
    assert v4.cc == "cubic" and v4.cwnd[:2] == [40, 41] and v4.srtt_ms[0] == pytest.approx(33.736)
    assert v4.retrans[0] == 4 and all(np.diff(v4.t) > 0)


def test_receiver_side_and_plain_two_line_output():
    rx = T.parse(text("ss_tinHO_receiver_side.txt"), t=1.0)
    data = T.data_flows(T.flows(rx), {38910, 50892})
    assert sorted(T.client_port(f) for f in data) == [38910, 50892]  # matched by the peer's port
    two = T.parse(text("ss_tinH_two_line.txt"), t=1.0)
    assert [(s.local, s.info["cwnd"]) for s in two] == [("198.18.0.1:39000", 13), ("198.18.0.1:39002", 18),
                                                        ("[2001:2::1]:56614", 13), ("[2001:2::1]:56620", 22)]


def test_measure_series_and_metrics_from_a_trial():
    out = text("ss_sampler_cubic_s1.txt")
    ports = set()
    for h in ("s1", "s2"):
        ports |= iperf3.data_ports(text(f"ss_sampler_cubic_iperf3_{h}.json"))
    t0 = T.parse(out)[0].t - 0.015
    m = T.measure({"s1": out}, t0=t0, data_ports=ports)
    names = {s.name for s in m.series}
    port = next(iter(iperf3.data_ports(text("ss_sampler_cubic_iperf3_s1.json"))))
    assert names == {f"ss.{q}/s1:{port}" for q in ("cwnd_segments", "srtt_ms", "delivery_rate_mbps", "retrans")}
    cwnd = next(s for s in m.series if s.name.startswith("ss.cwnd"))
    assert cwnd.unit == "segments" and 0.01 < cwnd.t[0] < 0.2 and cwnd.v.max() > 10
    values = {s.metric: s.value for s in m.samples}
    assert set(values) == {"ss.srtt_p50_ms", "ss.srtt_p99_ms", "ss.cwnd_median_segments", "ss.retrans_segments",
                           "ss.samples_per_s"}
    assert 5 <= values["ss.srtt_p50_ms"] <= values["ss.srtt_p99_ms"] < 500
    assert 30 <= values["ss.samples_per_s"] <= 55  # asked for every 20 ms
    with pytest.raises(ToolFailed, match="no iperf3 data connection"):
        T.measure({"s1": out}, t0=t0, data_ports={1})


def test_sampler_script_keeps_its_cadence_and_validates_the_interval():
    script = T.sampler_script(0.05)
    assert "ss -tinHO state established" in script and "iv=50000" in script and "sport >= :5201" in script
    with pytest.raises(ValueError, match="10..100 ms"):
        T.sampler_script(0.005)
    # the loop runs (here outside any namespace: no sockets match, only timestamps)
    out = subprocess.run(["timeout", "0.35", "bash", "-c", T.sampler_script(0.05)], capture_output=True, text=True)
    stamps = [float(line[2:]) for line in out.stdout.splitlines() if line.startswith("T ")]
    # The cadence, not each gap: beside other work one sleep may end late, and the next then ends early
    # (the loop waits for the next tick, not for 50 ms).
    assert 4 <= len(stamps) <= 8 and 0.035 < float(np.median(np.diff(stamps))) < 0.065


def test_ss_workload_in_a_scenario(tmp_path):
    f = tmp_path / "s.toml"
    base = ('name = "t"\n[workload.stream]\ntool = "iperf3"\n[workload.tcp]\ntool = "ss"\ninterval = "{}"\n'
            'during = "stream"\n')
    f.write_text(base.format("20ms"))
    sc = L.load(str(f)).scenario
    assert sc.samplers[0][0] == "tcp" and sc.samplers[0][1].interval == pytest.approx(0.02)
    for bad, needle in [("5ms", "every 10ms to 100ms"), ("1s", "every 10ms to 100ms")]:
        f.write_text(base.format(bad))
        with pytest.raises(Exception, match=needle):
            L.load(str(f))
    f.write_text(base.format("20ms").replace('during = "stream"', 'during = "nothing"'))
    with pytest.raises(Exception, match="during = .nothing. is no workload"):
        L.load(str(f))


def test_fixture_json_is_iperf3s():
    doc = json.loads(text("ss_loop_iperf3_ipv4.json"))
    assert doc["start"]["connected"][0]["remote_port"] == 5201
