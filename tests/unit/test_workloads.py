"""Workloads as plugins: the registry, scenarios of any workloads, and sockperf's parser on recorded real
outputs (sockperf 3.7 between two namespaces of this machine; long logs trimmed to their first 2,000 rows)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vnetbench.errors import ScenarioError
from vnetbench.metrics import METRICS
from vnetbench.scenario import load as L
from vnetbench.scenario.plan import expand
from vnetbench.workloads import registry, sockperf as S
from vnetbench.workloads.base import Started, ToolFailed

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def text(name: str) -> str:
    return (FIXTURES / name).read_text()


# ------------------------------------------------------------------ the registry


def test_every_tool_is_one_registered_module_with_typed_options_and_metrics():
    drivers = registry.drivers()
    assert {"iperf3", "ping", "ss", "sockperf"} <= set(drivers)
    for tool, d in drivers.items():
        assert d.Options.model_fields["tool"].default == tool
        assert d.requires and all(t.package for t in d.requires), tool
        for m in d.metrics:
            assert METRICS[m.name] is m and m.direction in ("higher", "lower") and m.unit, m.name


def test_metrics_of_two_tools_never_share_a_name():
    seen: dict[str, str] = {}
    for tool, d in registry.drivers().items():
        for m in d.metrics:
            assert m.name not in seen, f"{m.name} is declared by {seen.get(m.name)} and {tool}"
            seen[m.name] = tool


# ------------------------------------------------------------------ scenarios


def write(tmp_path: Path, body: str) -> str:
    path = tmp_path / "s.toml"
    path.write_text('name = "t"\n' + body)
    return str(path)


RR = '''
[lab]
bottleneck = "unlimited"
[matrix]
proto = ["tcp", "udp"]
payload = [64, 1024]
[workload.rr]
tool = "sockperf"
duration = "3s"
'''


def test_a_scenario_without_iperf3_is_a_latency_study(tmp_path):
    loaded = L.load(write(tmp_path, RR))
    configs = expand(loaded)
    assert [c.labels for c in configs] == [{"proto": p, "payload": n} for p in ("tcp", "udp") for n in (64, 1024)]
    c = configs[-1]
    assert c.stream is None and c.offered_bps is None and c.active_senders == 1
    rr = c.scenario.workload["rr"]
    assert (rr.proto, rr.payload, rr.duration) == ("udp", 1024, 3.0)
    assert c.params()["workloads"]["rr"]["payload"] == 1024
    assert loaded.scenario.phases() == [("rr", [])]


def test_a_bare_axis_sweeps_the_option_of_every_workload_that_has_it(tmp_path):
    body = RR.replace("[workload.rr]", '[workload.stream]\ntool = "iperf3"\nduration = "2s"\nomit = "0s"\n'
                                       '[workload.rr]')
    configs = expand(L.load(write(tmp_path, body)))
    for c in configs:
        assert c.scenario.workload["stream"].proto == c.scenario.workload["rr"].proto == c.labels["proto"]
    # one workload's option by its path
    body = RR.replace('proto = ["tcp", "udp"]\npayload = [64, 1024]', '"workload.rr.payload" = [14, 16384]')
    configs = expand(L.load(write(tmp_path, body)))
    assert [c.scenario.workload["rr"].payload for c in configs] == [14, 16384]


def test_set_reaches_every_workload_with_that_option(tmp_path):
    body = RR + '[workload.probe]\ntool = "ping"\ninterval = "10ms"\n'
    sc = L.load(write(tmp_path, body), ["duration=2s"]).scenario
    assert sc.workload["rr"].duration == sc.workload["probe"].duration == 2.0
    assert [p for p, _ in sc.phases()] == ["rr", "probe"]  # each on its own, one after the other


def test_a_workload_during_another_runs_in_its_phase(tmp_path):
    body = '[workload.stream]\ntool = "iperf3"\n[workload.rr]\ntool = "sockperf"\nduring = "stream"\n' \
           '[workload.tcp]\ntool = "ss"\nduring = "stream"\n'
    sc = L.load(write(tmp_path, body)).scenario
    assert sc.phases() == [("stream", ["rr", "tcp"])]


@pytest.mark.parametrize("body, needle", [
    ("", "required but missing"),
    ("[workload]\n", "no workload"),
    ('[workload.x]\ntool = "netperf"\n', "does not match any of the expected tags: 'iperf3'"),
    ('[workload.x]\ntool = "ss"\nduring = ""\n[workload.s]\ntool = "iperf3"\n', "must name a workload"),
    ('[workload.x]\ntool = "iperf3"\nduring = "y"\n[workload.y]\ntool = "sockperf"\n', "runs on its own"),
    ('[workload.a]\ntool = "sockperf"\n[workload.b]\ntool = "sockperf"\nproto = "tcp"\n', "both run sockperf"),
    ('[workload.a]\ntool = "sockperf"\n[workload.b]\ntool = "ping"\nduring = "c"\n', "'c' is no workload"),
    ('[workload.a]\ntool = "sockperf"\nduring = "b"\n[workload.b]\ntool = "ping"\nduring = "a"\n',
     "runs during another itself"),
    ('[workload.a]\ntool = "sockperf"\npayload = 1\n', "sockperf sends messages of 14 B"),
    ('[workload.a]\ntool = "sockperf"\nduration = "1.5s"\n', "whole seconds"),
    ('[workload.a]\ntool = "sockperf"\nrate = 1000\n', "sets the message rate of mode = \"under-load\""),
])
def test_workload_errors_name_the_key_and_what_to_do(tmp_path, body, needle):
    with pytest.raises(ScenarioError) as info:
        L.load(write(tmp_path, body))
    assert needle in str(info.value)


def test_sockperf_in_an_ipv6_lab_is_refused_before_anything_is_built(tmp_path):
    body = RR.replace('bottleneck = "unlimited"', 'bottleneck = "unlimited"\nip_version = 6')
    with pytest.raises(ScenarioError, match="IPv4 only"):
        expand(L.load(write(tmp_path, body)))


# ------------------------------------------------------------------ sockperf


def test_sockperf_client_command_logs_round_trips_and_emits_the_log_on_stdout():
    argv = S.client_script(S.Options(proto="tcp", payload=1024), "198.18.0.2", 5)
    assert argv[:2] == ["sh", "-c"] and "--full-log" in argv[2] and 'cat "$f"' in argv[2]
    assert argv[4:] == ["sockperf", "ping-pong", "-i", "198.18.0.2", "-p", str(S.TCP_PORT), "-t", "5", "-m", "1024",
                        "--full-rtt", "--tcp"]
    ul = S.client_script(S.Options(mode="under-load", rate=2000), "198.18.0.2", 3)
    assert ul[4:] == ["sockperf", "under-load", "-i", "198.18.0.2", "-p", str(S.UDP_PORT), "-t", "3", "-m", "64",
                      "--full-rtt", "--mps", "2000", "--reply-every", "1"]


def test_sockperf_percentiles_come_from_every_logged_message():
    log = S.parse_log(text("sockperf_pingpong_tcp64_trimmed.txt"))
    assert log.round_trip and len(log.rtt_us) == 2002 and log.dropped == 0 and log.valid_s == pytest.approx(0.55)
    m = S.measure_log(log, "ping-pong", t_offset=1.0)
    got = {s.metric: s.value for s in m.samples}
    r = log.rtt_us
    assert got["rr.p50_us"] == pytest.approx(np.percentile(r, 50))
    assert got["rr.p999_us"] == pytest.approx(np.percentile(r, 99.9))
    assert got["rr.mean_us"] == pytest.approx(r.mean()) and got["rr.stdev_us"] == pytest.approx(r.std())
    assert got["rr.min_us"] <= got["rr.p50_us"] <= got["rr.p90_us"] <= got["rr.p99_us"] <= got["rr.max_us"]
    # one message in flight: transactions/s is the reciprocal of the mean round trip, within the gaps
    # between an answer and the next send (a few microseconds here)
    tps = got["rr.transactions_per_s"]
    assert 0.7 * 1e6 / r.mean() <= tps <= 1e6 / r.mean()
    # sockperf's own summary of the whole run agrees with the log's median (same run, 2,000 of 18,888 rows)
    assert 20 <= got["rr.p50_us"] <= 40
    (series,) = m.series
    assert series.name == "rr_rtt_us" and series.t[0] == pytest.approx(1.0) and len(series.v) == 2002
    assert np.all(np.diff(series.t) >= 0)


def test_sockperf_series_keeps_the_distribution_of_a_long_log():
    log = S.parse_log(text("sockperf_pingpong_udp1024_trimmed.txt"))
    reps = int(np.ceil(3 * S.SERIES_POINTS / len(log.rtt_us)))
    long = S.Log(np.tile(log.tx, reps), np.tile(log.rx, reps), np.tile(log.rtt_us, reps), None, None, True)
    m = S.measure_log(long, "ping-pong")
    (series,) = m.series
    assert len(series.v) <= S.SERIES_POINTS
    assert np.median(series.v) == pytest.approx(np.median(long.rtt_us), rel=0.05)


def test_sockperf_under_load_log():
    log = S.parse_log(text("sockperf_underload_udp64.txt"))
    got = {s.metric: s.value for s in S.measure_log(log, "under-load").samples}
    # 2,000 messages/s offered, each answered: about that many transactions per second
    assert 1900 <= got["rr.transactions_per_s"] <= 2100
    assert got["rr.dropped_messages"] == 0


def test_sockperf_failures_quote_what_it_said(tmp_path):
    with pytest.raises(ToolFailed, match="no per-message log"):
        S.parse_log("")
    with pytest.raises(ToolFailed, match="malformed row"):
        S.parse_log(text("sockperf_underload_udp64.txt") + "17, 2.4\n")
    with pytest.raises(ToolFailed, match="one-way latency"):
        S.measure_log(S.parse_log(text("sockperf_underload_udp64.txt").replace("rtt(usec)", "latency(usec)")),
                      "ping-pong")
    # sockperf exits 0 after "Connection refused" and writes an empty log: the error it printed is quoted
    out = tmp_path / "rr.out"
    out.write_text("")
    out.with_suffix(".err").write_text(text("sockperf_refused.err"))
    started = Started("rr", outputs={"s1": out})
    with pytest.raises(ToolFailed, match=r"no per-message log.*sockperf said: sockperf: ERROR: Can`t connect socket "
                                         r"\(errno=111 Connection refused\)"):
        registry.driver("sockperf").measure(started, S.Options(), None, {"s1": ""})
