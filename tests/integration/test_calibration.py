"""A run's calibration through `vnetbench run` (issue 36, item 3): measured before the lab is built and after it
is gone, stored in the fingerprint, shown by `show`; a machine that changed between two runs (here: a busy loop
of someone else's on the core the calibration loop runs on) is named by `compare`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from helpers import ROOT, cli, run_id_of
from vnetbench.lab.clean import leftovers
from vnetbench.lab.netns import run_prefix
from vnetbench.store.db import Store

pytestmark = pytest.mark.lab

SCENARIO = """
name = "calibrated"
[lab]
senders = 1
bottleneck = "unlimited"
[workload.probe]
tool = "ping"
interval = "100ms"
duration = "1s"
[repeat]
repetitions = 1
warmup = false
"""


def _run(tmp_path, db) -> str:
    scenario = tmp_path / "calibrated.toml"
    scenario.write_text(SCENARIO)
    return run_id_of(cli("run", str(scenario), "--db", str(db), "--no-progress", calibrate=True))


def test_a_run_is_calibrated_before_and_after_and_a_slower_machine_is_named(tmp_path, no_leftovers):
    db = tmp_path / "r.db"
    quiet = _run(tmp_path, db)
    # someone else's loop on the core the calibration's loop is pinned to: that core runs at half speed for it
    core = min(os.sched_getaffinity(0))
    busy = subprocess.Popen(["taskset", "-c", str(core), "sh", "-c", "while :; do :; done"])
    try:
        loaded = _run(tmp_path, db)
    finally:
        busy.kill()
        busy.wait()
    with Store(db) as store:
        quiet_cal = store.run(quiet)["fingerprint"]["calibration"]
        loaded_cal = store.run(loaded)["fingerprint"]["calibration"]
    print("calibrations", quiet_cal, loaded_cal)
    for cal in (quiet_cal, loaded_cal):
        assert len(cal) == 1 and set(cal[0]) == {"before", "after"}, cal
        for when in ("before", "after"):
            got = cal[0][when]
            assert "cpu_error" not in got and "veth_error" not in got, got
            # sysbench's prime loop: hundreds to thousands of events a second on any CPU of this century; a veth
            # pair carries TCP at gigabits per second even on one shared core
            assert 100 < got["cpu_events_per_s"] < 100_000 and 0.5 < got["veth_tcp_gbps"] < 500, got
    # sharing its core with a busy loop, the calibration's loop runs at most about half as fast
    assert max(c["cpu_events_per_s"] for c in loaded_cal[0].values()) < 0.75 * min(
        c["cpu_events_per_s"] for c in quiet_cal[0].values()), (quiet_cal, loaded_cal)
    show = cli("show", quiet, "--db", str(db)).stdout
    assert "calibration (before then after the run): one core's loop" in show, show
    compared = cli("compare", quiet, loaded, "--db", str(db)).stdout
    assert "the machine itself measured differently in B: one core's loop" in compared, compared


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_during_the_calibration_stops_the_run_and_leaves_nothing(tmp_path, no_leftovers, how):
    db = tmp_path / "r.db"
    scenario = tmp_path / "calibrated.toml"
    scenario.write_text(SCENARIO)
    proc = subprocess.Popen([sys.executable, "-m", "vnetbench", "run", str(scenario), "--db", str(db),
                             "--no-progress"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    calibrating: list[str] = []
    while not calibrating and time.monotonic() < deadline and proc.poll() is None:
        runs = Store(db).runs() if db.exists() else []
        # the calibration's own namespaces, "<run prefix>-cal-...", exist only while it measures the veth stream
        calibrating = leftovers(f"{run_prefix(runs[-1]['id'])}-cal-") if runs else []
        time.sleep(0.02)
    assert calibrating, "the calibration's namespaces never appeared"
    proc.send_signal(how)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err, err[-2000:]
    with Store(db) as store:
        run = store.runs()[-1]
        assert run["status"] == "interrupted" and store.trials(run["id"]) == []
    assert leftovers(run_prefix(run["id"])) == []  # nothing of the calibration's or the lab's
