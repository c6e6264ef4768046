"""netem's correlated loss and reordering through the userspace emulator (issue 36), measured by the tools that
count them: the link's own counters give the rate netem's correlated draws make (model.correlated_rate, the
same expectation the emulator's unit test and netem are held to); iperf3's receiver sees the reordering as
packets out of order, each early packet arriving ahead of the ones still in the delay line."""

from __future__ import annotations

import pytest

from vnetbench.impair.model import correlated_rate
from vnetbench.store.db import Store
from helpers import run_scenario

pytestmark = pytest.mark.lab

LOSS, REORDER, CORRELATION = 0.25, 0.25, 0.5
DELAY_S, RATE_BPS, DATAGRAM = 0.005, 20e6, 1470
SCENARIO = f"""
name = "correlation"
[lab]
senders = 1
bottleneck = "unlimited"
[lab.link.bottleneck]
backend = "userspace"
[lab.link.bottleneck.forward]
delay = "{DELAY_S * 1e3:g}ms"
loss = {{model = "bernoulli", p = "{LOSS:.0%}", correlation = "{CORRELATION:.0%}"}}
reorder = "{REORDER:.0%}"
reorder_correlation = "{CORRELATION:.0%}"
[workload.stream]
tool = "iperf3"
proto = "udp"
offered = "{RATE_BPS / 1e6:g}Mbit"
length = {DATAGRAM}
duration = "3s"
[repeat]
repetitions = 2
"""


def test_correlated_loss_and_reordering_have_netems_rates(tmp_path):
    run_id, db = run_scenario(tmp_path, SCENARIO)
    with Store(db) as store:
        trials = store.trials(run_id, with_raw=True)
        (values,) = store.values(run_id).values()
    assert all(t["status"] == "ok" for t in trials), [t["reason"] for t in trials]
    want = correlated_rate(LOSS, CORRELATION)  # 7 %: netem's correlated draws, far below the 25 % asked
    in_flight = DELAY_S * RATE_BPS / ((DATAGRAM + 42) * 8)  # datagrams in the delay line: 8.3
    for t in trials:
        fwd = t["raw"]["links"]["bottleneck"]["forward"]
        received = fwd["rx_packets"]
        assert received > 4000, fwd
        # ~5,000 draws a trial, correlated: within 3.5 standard errors of twice the independent one
        se = 2 * (want * (1 - want) / received) ** 0.5
        assert abs(fwd["lost"] / received - want) <= 3.5 * se, (fwd, want)
        kept = received - fwd["lost"]
        assert abs(fwd["reordered"] / kept - correlated_rate(REORDER, CORRELATION)) <= 3.5 * se, fwd
    # iperf3's receiver: every early datagram puts the ones still in the delay line out of order, at most all
    for x, reordered in zip(values["udp.out_of_order_packets"], values["link.reordered_packets"]):
        assert reordered <= x <= reordered * (in_flight + 2), (x, reordered)
    assert all(abs(x - want) <= 0.03 for x in values["udp.loss_ratio"]), values["udp.loss_ratio"]
