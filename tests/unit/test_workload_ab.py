"""ApacheBench (ab): its parser on recorded real outputs, its commands and its options.

The fixtures are what :func:`vnetbench.workloads.ab.client_script` printed with the real ab
(apache2-utils 2.4.71, "ApacheBench 2.3") in a network namespace of this machine against
nginx 1.22 (wrk's configuration, port 5321) in another, over a plain veth (198.18.250.1 ->
.2), 1 KiB file. To keep them a few kB they ran 1500 requests (``-n 1500``) instead of
``-t 1 -n 100000``; the report and the files are the same shape either way:

- ab_crr_c1_1KiB: -c 1, a new connection per request (TCP_CRR);
- ab_crr_c16_1KiB: -c 16, new connections: ab's connect times straddle 0.5 ms;
- ab_keepalive_c4_1KiB: -c 4 -k;
- ab_refused (.txt, .err): no server on the port (exit 111).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from vnetbench.errors import ScenarioError
from vnetbench.scenario import load as L
from vnetbench.scenario.plan import expand
from vnetbench.workloads import ab as A, registry, wrk as W
from vnetbench.workloads.base import Started, ToolFailed, TrialEndpoints

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def text(name: str) -> str:
    return (FIXTURES / name).read_text()


def figures(name: str, keepalive: bool = False) -> dict[str, float]:
    return {s.metric: s.value for s in A.measure_result(A.parse(text(name)), keepalive).samples}


def report_number(name: str, label: str) -> float:
    return float(re.search(rf"^{label}:\s+([\d.]+)", text(name), re.M)[1])


# ------------------------------------------------------------------ the figures and their resolution


def test_crr_figures_come_from_the_report_and_the_percentile_file():
    got = figures("ab_crr_c1_1KiB.txt")
    out = A.parse(text("ab_crr_c1_1KiB.txt"))
    assert out.complete == 1500 and out.failed == out.non_2xx == 0 and out.concurrency == 1
    assert got["ab.requests_per_s"] == report_number("ab_crr_c1_1KiB.txt", "Requests per second")
    assert got["ab.transfer_mbps"] == pytest.approx(report_number("ab_crr_c1_1KiB.txt", "Transfer rate") * 8192 / 1e6)
    # one client: its time per transaction is 1 / rate, and ab's own "Time per request" agrees to its 1 us
    assert got["ab.transaction_ms"] == pytest.approx(1e3 / got["ab.requests_per_s"])
    assert got["ab.transaction_ms"] == pytest.approx(report_number("ab_crr_c1_1KiB.txt", "Time per request"), abs=5e-4)
    for p in (50, 90, 99):
        assert got[f"ab.latency_p{p}_ms"] == out.total_ms_at_percent[p]  # -e's own rows, 1 us
    assert got["ab.latency_max_ms"] == out.total_ms_at_percent[100]
    assert 0.05 < got["ab.latency_p50_ms"] < got["ab.latency_p90_ms"] < got["ab.latency_p99_ms"] < 1  # a veth
    # a transaction is connect + request + response + close; the client's cycle adds ab's own work to it
    assert got["ab.latency_p50_ms"] < got["ab.transaction_ms"]
    assert got["ab.failed_requests"] == 0


def test_per_request_file_is_the_same_times_rounded_to_whole_ms():
    """What the module's docstring says of -g, on real output: each -e row (1 us) rounded half up
    (ab's ap_round_ms) is the -g total time of the same rank."""
    for name in ("ab_crr_c1_1KiB.txt", "ab_crr_c16_1KiB.txt", "ab_keepalive_c4_1KiB.txt"):
        out = A.parse(text(name))
        ordered = np.sort(out.total_ms)
        assert np.all(ordered == np.round(ordered)) and np.all(out.connect_ms == np.round(out.connect_ms))
        for p in range(1, 100):
            us = round(out.total_ms_at_percent[p] * 1000)
            assert ordered[int(0.5 + len(ordered) * p / 100)] == (us + 500) // 1000, (name, p)


def test_p999_is_whole_ms_kept_between_the_exact_p99_and_longest():
    for name in ("ab_crr_c1_1KiB.txt", "ab_crr_c16_1KiB.txt", "ab_keepalive_c4_1KiB.txt"):
        out = A.parse(text(name))
        got = figures(name, keepalive="keepalive" in name)
        rounded = A.order_statistic(out.total_ms, 99.9)
        assert got["ab.latency_p99_ms"] <= got["ab.latency_p999_ms"] <= got["ab.latency_max_ms"]
        assert abs(got["ab.latency_p999_ms"] - rounded) <= 0.5
    # this run's 99.9th percentile rounded to 2 ms, above its longest request (1.886 ms): kept at the longest
    out = A.parse(text("ab_crr_c1_1KiB.txt"))
    assert A.order_statistic(out.total_ms, 99.9) == 2 and figures("ab_crr_c1_1KiB.txt")["ab.latency_p999_ms"] == 1.886


def test_connect_time_is_whole_ms_and_only_without_keepalive():
    got = figures("ab_crr_c16_1KiB.txt")
    table = re.search(r"^Connect:\s+(\d+)\s+(\d+)\s+([\d.]+)\s+(\d+)\s+(\d+)$", text("ab_crr_c16_1KiB.txt"), re.M)
    assert got["ab.connect_mean_ms"] == int(table[2])
    assert got["ab.connect_p50_ms"] == int(table[4])  # ab's median of 1500 is the same rank, rounded the same way
    for p in ("p50", "p90", "p99", "p999"):
        assert got[f"ab.connect_{p}_ms"] in (0, 1)  # whole ms: ab's 16 connects in flight take ~0.5 ms here
    assert got["ab.connect_p50_ms"] <= got["ab.connect_p90_ms"] <= got["ab.connect_p99_ms"] <= got["ab.connect_p999_ms"]
    # a reused connection's connect is 0 to ab: no connect figure with keep-alive
    keep = figures("ab_keepalive_c4_1KiB.txt", keepalive=True)
    assert not any(k.startswith("ab.connect_") for k in keep)
    assert "Keep-Alive requests:    1500" in text("ab_keepalive_c4_1KiB.txt")


def test_keepalive_is_faster_than_a_connection_per_request():
    # measured the same minute on the same path: the handshake and close cost more than the request itself
    crr, keep = figures("ab_crr_c1_1KiB.txt"), figures("ab_keepalive_c4_1KiB.txt", keepalive=True)
    assert keep["ab.requests_per_s"] > 2 * crr["ab.requests_per_s"]


def test_failed_requests_add_non_2xx_answers():
    body = text("ab_crr_c1_1KiB.txt").replace("Failed requests:        0\n",
                                              "Failed requests:        3\nNon-2xx responses:      4\n")
    assert {s.metric: s.value for s in A.measure_result(A.parse(body), False).samples}["ab.failed_requests"] == 7


# ------------------------------------------------------------------ failures


def test_connection_refused_quotes_ab(tmp_path):
    with pytest.raises(ToolFailed, match=r"ab printed no result: .*Benchmarking 198\.18\.250\.2 \(be patient\)"):
        A.parse(text("ab_refused.txt"))
    out = tmp_path / "crr.out"
    out.write_text(text("ab_refused.txt"))
    out.with_suffix(".err").write_text(text("ab_refused.err"))
    with pytest.raises(ToolFailed, match=r"ab said: apr_socket_recv: Connection refused \(111\)$"):
        registry.driver("ab").measure(Started("crr", outputs={"s1": out}), A.Options(), None,
                                      {"s1": text("ab_refused.txt")})


def test_results_that_cannot_be_trusted_fail_the_trial():
    out = A.parse(text("ab_crr_c1_1KiB.txt"))
    with pytest.raises(ToolFailed, match=r"completed all 1500 requests it was given \(-n\).*before its time"):
        A.measure_result(out, False, requests_asked=1500)
    A.measure_result(out, False, requests_asked=A.requests_for(1))  # the -n a 1 s run gets: not reached
    short = text("ab_crr_c1_1KiB.txt").splitlines()[:-10]  # the output cut off in the -g rows
    with pytest.raises(ToolFailed, match="1490 of 1500 requests: the files were not written whole"):
        A.measure_result(A.parse("\n".join(short)), False)
    none = A.AbOutput(concurrency=1, seconds=1.0, complete=0, failed=12, non_2xx=0, requests_per_s=None,
                      transfer_kib_per_s=None, connect_mean_ms=None, total_ms_at_percent={},
                      connect_ms=np.array([]), total_ms=np.array([]))
    with pytest.raises(ToolFailed, match=r"ab completed no request in 1s \(12 failed\)"):
        A.measure_result(none, False)
    bad = text("ab_crr_c1_1KiB.txt").replace("50,", "50;", 1)
    with pytest.raises(ToolFailed, match="malformed row"):
        A.parse(bad)


def test_raw_keeps_the_report_and_the_first_request_rows():
    kept = registry.driver("ab").raw(Started("crr"), {"s1": text("ab_crr_c1_1KiB.txt")})["s1"]
    assert "Requests per second:" in kept and "100,1.886" in kept
    assert kept.endswith(f"... ({1500 - A.RAW_REQUEST_ROWS} more request rows not kept)")
    assert registry.driver("ab").raw(Started("crr"), {"s1": text("ab_refused.txt")})["s1"] == text(
        "ab_refused.txt").rstrip("\n")


# ------------------------------------------------------------------ commands


def test_client_gives_n_after_t_and_keepalive_only_when_asked():
    argv = A.client_script(A.Options(concurrency=50, timeout="5s"), "http://198.18.0.2:5321/f1024", 3)
    assert argv[0:2] == ["sh", "-c"] and argv[3:] == ["ab", "http://198.18.0.2:5321/f1024"]
    # -t first: it sets -n to 50,000, which the -n after it replaces
    assert "ab -q -c 50 -s 5 -t 3 -n 300000 -e" in argv[2] and " -k" not in argv[2]
    assert " -k -e " in A.client_script(A.Options(keepalive=True), "http://x/f", 3)[2]
    assert A.requests_for(100_000) == 2**31 - 1  # ab's -n is a C int


def test_client_script_prints_both_files_removes_them_and_keeps_abs_exit_status(tmp_path):
    """The shell around ab, with a stand-in ab that writes its -e and -g files and exits 3."""
    fake = tmp_path / "ab"
    fake.write_text('#!/bin/sh\nwhile [ $# -gt 1 ]; do case $1 in -e) e=$2;; -g) g=$2;; esac; shift; done\n'
                    'echo "Complete requests:      1"\n'
                    'echo "Percentage served,Time in ms" > "$e"; echo "0,0.100" >> "$e"\n'
                    'printf "starttime\\tseconds\\tctime\\tdtime\\tttime\\twait\\n" > "$g"\necho "$e $g" > "$0.files"; '
                    'exit 3\n')
    fake.chmod(0o755)
    argv = A.client_script(A.Options(), "http://198.18.0.2:5321/f1024", 1)
    p = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert p.returncode == 3
    lines = p.stdout.splitlines()
    assert lines[lines.index(A.MARK_PERCENTILES) + 1:] == [
        "Percentage served,Time in ms", "0,0.100", A.MARK_REQUESTS, "starttime\tseconds\tctime\tdtime\tttime\twait"]
    assert all(not Path(f).exists() for f in (tmp_path / "ab.files").read_text().split())


def test_its_own_nginx_on_its_own_port():
    argv = W.server_script("198.18.0.2", 4, [1024], 2, "/tmp/run/nginx-ab-r", A.PORT)
    assert "listen 198.18.0.2:5321 backlog=4096;" in argv[4] and ":5320" not in argv[4]
    assert "worker_processes 2;" in argv[4] and 'head -c 1024 /dev/zero > "$d/www/f1024"' in argv[2]
    assert "listen [2001:2::1]:5321 backlog" in W.server_script("2001:2::1", 6, [1], 1, "/d", A.PORT)[4]

    class Receiver:
        name = "r"

        def address(self, ip_version):
            return "198.18.0.2"

    spec, = registry.driver("ab").servers(TrialEndpoints(Receiver(), []), 4, [A.Options(file_size="1KiB"),
                                                                         A.Options(file_size="1MiB", workers=4)], "/w")
    assert (spec.port, spec.label) == (5321, "nginx-ab") and spec.label != "nginx"  # wrk's may run beside it
    assert "worker_processes 4;" in spec.argv[4] and "f1048576" in spec.argv[2]
    # Its directory is named by a digest of the receiver's name, never the name (an inventory's, on real hosts).
    assert re.search(r"^d=/w/nginx-ab-[0-9a-f]{12}; ", spec.argv[2]) and "/w/nginx-ab-r" not in spec.argv[2]


# ------------------------------------------------------------------ options


def write(tmp_path: Path, body: str) -> str:
    path = tmp_path / "s.toml"
    path.write_text('name = "t"\n' + body)
    return str(path)


@pytest.mark.parametrize("body, needle", [
    ("concurrency = 0\n", r"workload\.crr\.concurrency = 0: ab keeps 1 to 20000 requests in flight"),
    ("concurrency = 20001\n", r"concurrency = 20001: ab keeps 1 to 20000"),
    ("concurrency = 20000\n", r"concurrency = 20000 is more connections than 1 nginx worker\(s\) accept "
                              r"\(16384 each\); raise workers to 2"),
    ('duration = "2.5s"\n', r"duration.*whole seconds"),
    ('timeout = "500ms"\n', r"timeout.*whole seconds"),
    ('file_size = "2GiB"\n', r"1 B to 1 GiB"),
    ("keepalive = \"sometimes\"\n", r"keepalive"),
    ("connections = 4\n", r"connections"),  # wrk's option, not ab's
])
def test_options_are_checked(tmp_path, body, needle):
    with pytest.raises(ScenarioError, match=needle):
        L.load(write(tmp_path, '[workload.crr]\ntool = "ab"\n' + body))


def test_ab_and_wrk_in_one_scenario_and_seed_002s_concurrency_sweep(tmp_path):
    loaded = L.load(write(tmp_path, '[matrix]\nconcurrency = [50, 100, 200]\n'
                                    '[workload.crr]\ntool = "ab"\nduration = "2s"\n'
                                    '[workload.web]\ntool = "wrk"\nduration = "2s"\n'))
    crr = loaded.scenario.workload["crr"]
    assert (crr.tool, crr.keepalive, crr.duration, crr.timeout) == ("ab", False, 2.0, 10.0)
    assert registry.driver("ab").timing(crr, None) == (0.0, 2.0)
    assert [p for p, _ in loaded.scenario.phases()] == ["crr", "web"]  # each on its own, one after the other
    assert [c.scenario.workload["crr"].concurrency for c in expand(loaded)] == [50, 100, 200]
