"""HTTP, TCP_CRR and CPU workloads on the real lab, judged by physics (workloads issue).

- HTTP with one keep-alive connection over a round trip of r ms does at most 1/r
  transactions/s (a request and its answer cross the path once each) and, for a
  tiny file, at least 80% of that; with a new connection per request (TCP_CRR)
  the handshake costs a second round trip: at most 1/(2r).
- sysbench cpu in a container limited to half a CPU (cgroup cpu.max) does about
  half of what it does in a bare namespace on the same core: 0.4-0.6 of bare.
- a workload killed in the middle of a trial is a failed trial with its reason,
  and the run goes on.

Run through the CLI as a user would; each judged on the median of its trials.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import numpy as np
import pytest

from helpers import cli, run_id_of
from vnetbench.store.db import Store

pytestmark = pytest.mark.lab

DELAY_MS = 5.0  # one way, in each direction: r = 10 ms


def _run(tmp_path, text: str, *args: str) -> tuple[Store, str]:
    path = tmp_path / "s.toml"
    path.write_text(text)
    proc = cli("run", str(path), "--db", str(tmp_path / "r.db"), "--no-progress", *args, timeout=900)
    return Store(tmp_path / "r.db"), run_id_of(proc)


def _medians(store: Store, run_id: str, label: str) -> dict:
    labels = {c["key"]: c["labels"] for c in store.configurations(run_id)}
    return {labels[k][label]: {m: float(np.median(v)) for m, v in per.items()} for k, per in store.values(run_id).items()}


HTTP = f"""
name = "http-physics"
[lab]
senders = 1
bottleneck = "unlimited"
shape = "both"
delay = "{DELAY_MS:g}ms"
[matrix]
connection = ["keep-alive", "close"]
[workload.web]
tool = "wrk"
connections = 1
threads = 1
file_size = "100B"
duration = "4s"
[repeat]
repetitions = 3
warmup = false
"""


def _nginx_processes() -> int:
    return len(subprocess.run(["pgrep", "-f", "^nginx: "], capture_output=True, text=True).stdout.split())


def test_http_transactions_are_bounded_by_the_round_trip(tmp_path):
    before = _nginx_processes()
    store, run_id = _run(tmp_path, HTTP)
    # nginx was restarted when the link emulator took its core: no worker of it outlives the run
    assert _nginx_processes() <= before
    trials = store.trials(run_id)
    assert all(t["status"] == "ok" for t in trials), [t["reason"] for t in trials]
    got = _medians(store, run_id, "connection")
    rtt_s = 2 * DELAY_MS / 1e3
    keep = got["keep-alive"]["http.requests_per_s"]
    assert 0.8 / rtt_s <= keep <= 1.0 / rtt_s, got["keep-alive"]
    # the request's latency is the round trip, plus microseconds of serving
    assert 2 * DELAY_MS <= got["keep-alive"]["http.latency_p50_ms"] <= 2 * DELAY_MS + 2.0
    crr = got["close"]["http.requests_per_s"]
    assert 0.8 / (2 * rtt_s) <= crr <= 1.0 / (2 * rtt_s), got["close"]
    assert got["close"]["http.errors"] == got["keep-alive"]["http.errors"] == 0
    store.close()


CPU = """
name = "cpu-quota"
[lab]
senders = 1
bottleneck = "unlimited"
[matrix]
env = [{env = "bare"}, {env = "container", cpu_quota = 0.5}]
[workload.cpu]
tool = "sysbench"
tests = ["cpu"]
duration = "3s"
[repeat]
repetitions = 3
warmup = false
"""


def test_a_container_limited_to_half_a_cpu_computes_half_as_much(tmp_path):
    store, run_id = _run(tmp_path, CPU)
    trials = store.trials(run_id)
    assert all(t["status"] == "ok" for t in trials), [t["reason"] for t in trials]
    labels = {c["key"]: c["labels"] for c in store.configurations(run_id)}
    by_env = {labels[k].get("cpu_quota", "bare"): float(np.median(per["cpu.events_per_s"]))
              for k, per in store.values(run_id).items()}
    ratio = by_env[0.5] / by_env["bare"]
    assert 0.4 <= ratio <= 0.6, by_env
    store.close()


KILLED = """
name = "killed-tool"
[lab]
senders = 1
bottleneck = "unlimited"
[workload.rr]
tool = "sockperf"
duration = "4s"
[repeat]
repetitions = 2
warmup = false
"""


def _kill_first_sockperf_client(stop: threading.Event) -> None:
    """Kill the first sockperf client that runs, once (SIGKILL: no chance to write its log)."""
    while not stop.is_set():
        out = subprocess.run(["pgrep", "-f", "^sockperf ping-pong"], capture_output=True, text=True).stdout.split()
        if out:
            time.sleep(1.0)
            for pid in out:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            return
        time.sleep(0.05)


def test_a_tool_killed_mid_trial_fails_that_trial_and_the_run_goes_on(tmp_path):
    stop = threading.Event()
    killer = threading.Thread(target=_kill_first_sockperf_client, args=(stop,), daemon=True)
    killer.start()
    try:
        store, run_id = _run(tmp_path, KILLED)
    finally:
        stop.set()
        killer.join(timeout=5)
    trials = sorted(store.trials(run_id), key=lambda t: t["position"])
    assert [t["status"] for t in trials] == ["failed", "ok"], [(t["status"], t["reason"]) for t in trials]
    assert "sockperf" in trials[0]["reason"]
    assert store.run(run_id)["status"] == "completed"
    store.close()
