"""ping's own queue (issue 36): `ping -l N` sends its first N requests back to back, and again after a late
wake-up (measured here: about a third of the requests, 5 ms apart over a 12.5 ms path, went in pairs). On a slow
link the second of two waits behind the first, a frame time. Those requests are left out of the RTT metrics: on
an idle delayed link the average is the link's. With them it was 0.75 ms (a third of a frame) higher."""

from __future__ import annotations

import numpy as np
import pytest

from vnetbench.impair.model import base_rtt
from vnetbench.scenario.load import load_text
from vnetbench.store.db import Store
from vnetbench.workloads import ping
from helpers import run_scenario

pytestmark = pytest.mark.lab

RATE = 5e6
SIZE = 1450
INTERVAL = 0.005
JITTER_MS = 0.2
# what the userspace emulator adds to a round trip on its own: measured 0.10 ms idle (its AF_PACKET hops)
EMULATOR_MS = (0.0, 0.4)
SCENARIO = f"""
name = "ping-burst"
[lab]
senders = 1
bottleneck = "5Mbit"
buffer = "1500kB"
delay = "10ms"
jitter = "{JITTER_MS:g}ms"
[workload.probe]
tool = "ping"
interval = "{INTERVAL * 1e3:g}ms"
size = {SIZE}
duration = "3s"
[repeat]
repetitions = 3
"""


def test_the_preloads_burst_does_not_move_an_idle_links_rtt(tmp_path):
    run_id, db = run_scenario(tmp_path, SCENARIO)
    with Store(db) as store:
        trials = store.trials(run_id, with_raw=True)
        (values,) = store.values(run_id).values()
    assert all(t["status"] == "ok" for t in trials), [t["reason"] for t in trials]
    serialization_ms = ping.frame_bits(SIZE, 4) / RATE * 1e3  # the request's, at 5 Mbit/s: 2.39 ms
    expected_ms = base_rtt(load_text(SCENARIO, "burst.toml").scenario.lab) * 1e3 + serialization_ms
    for t in trials:
        raw = ping.parse(next(iter(t["raw"]["workloads"]["probe"].values())))
        preload = int(next(a for a in t["raw"]["command"].values() if " -l " in a).split(" -l ")[1].split()[0])
        assert preload >= 4, t["raw"]["command"]
        # the burst did queue: each of its requests waited for the ones before it, one frame time each
        first = raw.rtt_ms[np.argsort(raw.seq)][:preload]
        assert first[-1] - first[0] >= 0.7 * (preload - 1) * serialization_ms - 4 * JITTER_MS, first
    # ... and is left out, with every request that waited behind another of the probe's: the average is the
    # link's (a third of the requests a frame time late would put it 0.8 ms higher)
    low, high = expected_ms + EMULATOR_MS[0] - JITTER_MS / 4, expected_ms + EMULATOR_MS[1]
    assert all(low <= x <= high for x in values["rtt.avg_ms"]), (values["rtt.avg_ms"], low, high)
    assert all(x > 0 for x in values["rtt.own_queue_requests"]), values["rtt.own_queue_requests"]
