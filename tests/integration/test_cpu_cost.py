"""What a trial cost in CPU (issue 36): a busy loop of known length shows up as one core, on the core it was
pinned to; a byte through the link emulator costs more CPU than a byte over the bare veth (the emulator spins a
core of its own and carries fewer bytes); steal is a share of the machine, never more; the endpoints leave the
emulator's core only while it is on their path; a trial run while someone else's busy loop holds a core is
marked."""

from __future__ import annotations

import os
import signal
import subprocess

import numpy as np
import pytest

from vnetbench.store.db import Store
from helpers import cli, run_scenario

pytestmark = pytest.mark.lab

SCENARIO = """
name = "cpu-cost"
[lab]
senders = 1
bottleneck = "unlimited"
[matrix]
test = [
  {workloads = "loop"},
  {workloads = "idle"},
  {workloads = "stream"},
  {workloads = "stream", backend = "userspace", delay = "1ms"},
]
[workload.loop]
tool = "sysbench"
tests = ["cpu"]
threads = 1
duration = "3s"
[workload.idle]
tool = "ping"
interval = "100ms"
duration = "3s"
[workload.stream]
tool = "iperf3"
duration = "3s"
omit = "1s"
[repeat]
repetitions = 2
"""

CORES = len(os.sched_getaffinity(0))
OURS = {"sysbench", "iperf3", "ping", "vnb-link", "ip", "taskset"}


def test_a_busy_loop_is_one_core_and_a_byte_through_the_emulator_costs_more(tmp_path):
    run_id, db = run_scenario(tmp_path, SCENARIO)
    with Store(db) as store:
        trials = store.trials(run_id, with_raw=True)
        assert all(t["status"] == "ok" for t in trials), [t["reason"] for t in trials if t["status"] != "ok"]
        values = store.values(run_id)
        configs = store.configurations(run_id)
    key = {(c["labels"]["workloads"], c["labels"].get("backend", "bare")): c["key"] for c in configs}
    loop, idle = values[key["loop", "bare"]], values[key["idle", "bare"]]
    bare, emulated = values[key["stream", "bare"]], values[key["stream", "userspace"]]
    for v in (loop, idle, bare, emulated):
        # the machine's cores bound what it can be busy with, and what the hypervisor can take
        assert all(0 <= x <= 100 * CORES + 1 for x in v["cpu.util_pct"] + v["cpu.steal_pct"]), v
    # sysbench's one thread keeps one core busy over its whole window (a 10 ms tick at each edge of 3 s: 1 %)
    assert all(x >= 90 for x in loop["cpu.util_pct"]), loop["cpu.util_pct"]
    # ... on top of what the run itself does beside it, which the ping-only trials measure: both net of other
    # processes' time (a build or a shell loop beside the run counts in the machine's total; measured: an idle
    # trial at 164 % while one core was kept busy and a test suite ran, 0-2 % of it the run's own)
    def own(v: dict) -> list[float]:
        return [u - f for u, f in zip(v["cpu.util_pct"], v["cpu.foreign_pct"])]

    assert min(own(loop)) - max(own(idle)) >= 80, (own(loop), own(idle))
    # ... on the core the receiver is pinned to, where sysbench runs: that core never idles (a tick at each edge of
    # the window: 1 %), and its time is the loop's user time but for what the hypervisor took (steal; a check of
    # user time alone failed once in 13 runs with one core kept busy)
    loop_trials = [t for t in trials if t["config_key"] == key["loop", "bare"]]
    on_its_core = [t["raw"]["cpu"]["per_cpu_pct"][f"cpu{t['raw']['cores']['endpoints']['r']}"] for t in loop_trials]
    assert all(c["idle"] + c["iowait"] <= 5 and c["user"] + c["nice"] + c["steal"] >= 90 for c in on_its_core), \
        on_its_core
    # the emulator's own process, told apart where one carried the link: a part of the machine's busy time, and
    # as it polls its sockets without sleeping, most of a core
    print("emulator", emulated["cpu.emulator_pct"], "util", emulated["cpu.util_pct"])
    assert all("cpu.emulator_pct" not in v for v in (loop, idle, bare))
    assert all(e <= u + 1 for e, u in zip(emulated["cpu.emulator_pct"], emulated["cpu.util_pct"])), emulated
    assert all(50 <= e <= 101 for e in emulated["cpu.emulator_pct"]), emulated["cpu.emulator_pct"]
    # the run's own tools are never counted as other work
    for t in trials:
        assert not {p["command"] for p in t["raw"]["cpu"]["foreign"]["top"]} & OURS, t["raw"]["cpu"]["foreign"]
    # placement per configuration: the receiver leaves the emulator's core only while the emulator is on its path
    for t in trials:
        cores = t["raw"]["cores"]
        emulated_trial = t["config_key"] == key["stream", "userspace"]
        assert (cores["emulators"] != {}) == emulated_trial, cores
        if emulated_trial and CORES > 1:
            assert cores["endpoints"]["r"] not in cores["emulators"].values(), cores
        elif CORES > 1:
            assert cores["endpoints"]["r"] != cores["endpoints"]["s1"], cores  # as the topology places them
    # service demand: the emulator spins a core of its own and carries a fraction of the veth's rate. Net of other
    # processes' CPU (a competing load counts on both sides, unequally). Measured idle: 2.0 against 1.08 us/KB;
    # beside a busy loop, the bare stream shares its cores with it and costs more per byte: 2.4-2.7 against
    # 0.8-1.8 us/KB net (whole machine 3.1-3.3 against 1.4-1.6)
    assert "cpu.us_per_kb" not in loop and "cpu.us_per_transaction" not in loop

    def net_us_per_kb(v: dict) -> list[float]:
        return [(u - f) / 100 * 1e6 / (mbps * 1e6 / 8 / 1024)
                for u, f, mbps in zip(v["cpu.util_pct"], v["cpu.foreign_pct"], v["throughput.rx_mbps"])]

    for v in (bare, emulated):  # the metric is the whole machine's, as netperf's
        assert all(whole >= net - 1e-9 for whole, net in zip(v["cpu.us_per_kb"], net_us_per_kb(v)))
    # the emulator's spinning core alone is a core's time per KB it carries
    spinning = [1e6 / (mbps * 1e6 / 8 / 1024) for mbps in emulated["throughput.rx_mbps"]]
    assert all(net >= 0.9 * core for net, core in zip(net_us_per_kb(emulated), spinning)), (
        net_us_per_kb(emulated), spinning)
    # ... and so a byte through the emulator costs more than over the bare veth, on average over the trials.
    # Not by a fixed factor: the endpoints' own work per byte falls as their rate rises, and the emulated stream
    # runs at its own rate (measured over 16 runs, quiet and with one core kept busy: 1.14-2.25 times the bare
    # stream's cost, the emulator's core alone 0.6-1.7 us/KB; one trial against one is 0.92-1.99)
    assert np.mean(net_us_per_kb(emulated)) > np.mean(net_us_per_kb(bare)), (net_us_per_kb(emulated),
                                                                            net_us_per_kb(bare))


IDLE = """
name = "idle"
[lab]
senders = 1
bottleneck = "unlimited"
[workload.idle]
tool = "ping"
interval = "100ms"
duration = "2s"
[repeat]
repetitions = 2
"""


def test_a_trial_run_while_someone_elses_busy_loop_holds_a_core_is_marked(tmp_path):
    # someone else's loop: in the run's namespace, not started by the run (vnetbench is a sibling: helpers.cli)
    busy = subprocess.Popen(["sh", "-c", "while :; do :; done"])
    loop = busy.pid
    try:
        run_id, db = run_scenario(tmp_path, IDLE)
    finally:
        busy.send_signal(signal.SIGKILL)
        busy.wait()
    with Store(db) as store:
        trials = store.trials(run_id, with_raw=True)
        values = store.values(run_id)
        marked = store.marked_trials(run_id)
    assert all(t["status"] == "ok" for t in trials), [t["reason"] for t in trials]
    (foreign,) = [v["cpu.foreign_pct"] for v in values.values()]
    # the loop has a core of its own or shares one with at most the trial's work and a kept-busy core: >= 1/2
    assert all(x >= 50 for x in foreign), foreign
    assert all(loop in {p["pid"] for p in t["raw"]["cpu"]["foreign"]["top"]} for t in trials), \
        [t["raw"]["cpu"]["foreign"] for t in trials]
    assert sum(len(v) for v in marked.values()) == len(trials), marked
    shown = cli("show", run_id, "--db", str(db)).stdout
    assert f"marked: {len(trials)} of {len(trials)} ok trials" in shown, shown


PROBE = """
name = "probe-cpu"
[lab]
senders = 1
bottleneck = "unlimited"
[matrix]
"workload.probe.interval" = ["2ms", "20ms"]
[workload.stream]
tool = "iperf3"
proto = "udp"
offered = "20Mbit"
duration = "4s"
omit = "1s"
[workload.probe]
tool = "ping"
size = 56
during = "stream"
[repeat]
repetitions = 3
"""


def test_a_probe_that_spins_a_core_is_its_own_cost_not_the_traffics(tmp_path):
    # iputils ping below a 10 ms interval polls without sleeping whenever no reply is outstanding: over a bare
    # veth (replies within microseconds) that is nearly all the time
    run_id, db = run_scenario(tmp_path, PROBE)
    with Store(db) as store:
        trials = store.trials(run_id, with_raw=True)
        assert all(t["status"] == "ok" for t in trials), [t["reason"] for t in trials if t["status"] != "ok"]
        values = store.values(run_id)
        key = {c["labels"]["workload.probe.interval"]: c["key"] for c in store.configurations(run_id)}
    fast, slow = values[key["2ms"]], values[key["20ms"]]
    print("probe", fast["cpu.probe_pct"], slow["cpu.probe_pct"], "util", fast["cpu.util_pct"], slow["cpu.util_pct"])
    for t in trials:
        processes = t["raw"]["process_cpu_pct"]
        assert set(processes) == {"stream/s1", "probe/s1"}, processes
        # one thread cannot use more than a core over its life (rusage and the clock: within 2 %)
        assert 0 <= processes["probe/s1"] <= 102, processes
        whole, net = t["raw"]["cpu"]["busy_pct"], t["raw"]["cpu"]["per_cpu_pct"]
        assert whole <= 100 * CORES + 1, net
    assert all(p >= 40 for p in fast["cpu.probe_pct"]), fast["cpu.probe_pct"]
    assert all(p <= 5 for p in slow["cpu.probe_pct"]), slow["cpu.probe_pct"]
    # what is left is the traffic's: the spin is gone from it (the fast probe's own packets stay, in softirq)
    spin = np.mean(fast["cpu.probe_pct"])
    assert np.mean(fast["cpu.util_pct"]) - np.mean(slow["cpu.util_pct"]) < 0.5 * spin, (fast, slow)
