"""What a trial cost in CPU (issue 36): a busy loop of known length shows up as one core, on the core it was
pinned to; a byte through the link emulator costs more CPU than a byte over the bare veth (the emulator spins a
core of its own and carries fewer bytes); steal is a share of the machine, never more."""

from __future__ import annotations

import os

import pytest

from vnetbench.store.db import Store
from helpers import cli, run_id_of

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


def test_a_busy_loop_is_one_core_and_a_byte_through_the_emulator_costs_more(tmp_path):
    scenario = tmp_path / "cpu.toml"
    scenario.write_text(SCENARIO)
    db = tmp_path / "r.db"
    run_id = run_id_of(cli("run", str(scenario), "--db", str(db), "--no-progress"))
    with Store(db) as store:
        trials = store.trials(run_id, with_raw=True)
        assert all(t["status"] == "ok" for t in trials), [t["reason"] for t in trials if t["status"] != "ok"]
        values = store.values(run_id)
        configs = store.configurations(run_id)
        endpoints = store.run(run_id)["fingerprint"]["endpoints"]
    key = {(c["labels"]["workloads"], c["labels"].get("backend", "bare")): c["key"] for c in configs}
    loop, idle = values[key["loop", "bare"]], values[key["idle", "bare"]]
    bare, emulated = values[key["stream", "bare"]], values[key["stream", "userspace"]]
    for v in (loop, idle, bare, emulated):
        # the machine's cores bound what it can be busy with, and what the hypervisor can take
        assert all(0 <= x <= 100 * CORES + 1 for x in v["cpu.util_pct"] + v["cpu.steal_pct"]), v
    # sysbench's one thread keeps one core busy over its whole window (a 10 ms tick at each edge of 3 s: 1 %)
    assert all(x >= 90 for x in loop["cpu.util_pct"]), loop["cpu.util_pct"]
    # ... on top of whatever else the machine does, which the ping-only trials measure
    assert min(loop["cpu.util_pct"]) - max(idle["cpu.util_pct"]) >= 80, (loop["cpu.util_pct"], idle["cpu.util_pct"])
    # ... on the core the receiver is pinned to, where sysbench runs
    r_cpu = f"cpu{endpoints['bare']['r']['cpu']}"
    loop_trials = [t for t in trials if t["config_key"] == key["loop", "bare"]]
    assert all(t["raw"]["cpu"]["per_cpu_pct"][r_cpu]["user"] >= 90 for t in loop_trials), \
        [t["raw"]["cpu"] for t in loop_trials]
    # service demand: the emulator spins a core and carries a fraction of the veth's rate
    assert "cpu.us_per_kb" not in loop and "cpu.us_per_transaction" not in loop
    assert min(emulated["cpu.us_per_kb"]) > 1.5 * max(bare["cpu.us_per_kb"]), (emulated["cpu.us_per_kb"],
                                                                             bare["cpu.us_per_kb"])
