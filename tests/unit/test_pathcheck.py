"""The path check's judgements (runner/pathcheck.py), on ping outputs recorded in the lab.

Fixtures (ping from s1 to r, the lab's own addresses):
- ping_probe_loss20pct.txt: 100 echo requests through the emulator's 20 % forward loss (80 answered);
- ping_probe_emulator_5ms.txt: 100 through the emulator at 20 Mbit/s with 5 ms forward delay;
- ping_train_tbf_5mbit.txt: 56 preloaded 1400-byte requests into a 5 Mbit/s tbf (100 kB buffer);
- ping_train_emulator_20mbit_5ms.txt: 54 into the emulator at 20 Mbit/s, 5 ms;
- ping_train_emulator_50mbit_5ms_100kB.txt: 132 into the emulator at 50 Mbit/s, 5 ms, 100 kB, which ping
  took 26 ms to send (its loop preempted): judged, it would have measured 33 Mbit/s (the others 49-51);
- ping_train_tbf_100mbit_100kB.txt: 280 into a 100 Mbit/s tbf, 100 kB (139 answered; 75 Mbit/s, the
  farthest of eight trains through tbf and htb, the others 89-106);
- ping_unreachable.txt: 12 requests, none answered.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vnetbench.impair.backend import TrialCounters
from vnetbench.impair.model import LinkSpec
from vnetbench.runner import pathcheck as P
from vnetbench.workloads import ping

FIXTURES = Path(__file__).parent.parent / "fixtures"


def _ping(name: str) -> ping.PingResult:
    return ping.parse((FIXTURES / name).read_text())


def _spec(**forward) -> LinkSpec:
    return LinkSpec.model_validate({"forward": forward})


def _exp(spec: LinkSpec, kernel: bool = False, sender: LinkSpec | None = None) -> P.Expectation:
    return P.expectation([(spec, kernel), (sender or LinkSpec(), False)], 1500)


def test_expectation_multiplies_delivery_and_adds_delay_over_links_and_directions():
    bottleneck = LinkSpec.model_validate({"forward": {"loss": "20%", "delay": "5ms"}, "reverse": {"delay": "1ms"}})
    sender = LinkSpec.model_validate({"forward": {"loss": "10%"}, "reverse": {"delay": "2ms", "rate": "10Mbit"}})
    exp = _exp(bottleneck, sender=sender)
    assert exp.delivery == pytest.approx(0.8 * 0.9)
    assert exp.base_rtt_s == pytest.approx(0.008)
    assert exp.rate_bps == 10e6 and exp.burst_bytes == 0  # the emulator realises the sender's link


def test_a_rate_qdiscs_burst_is_the_one_of_the_slowest_link():
    exp = _exp(_spec(rate="5Mbit"), kernel=True, sender=_spec(rate="50Mbit"))
    assert exp.rate_bps == 5e6 and exp.burst_bytes == 2 * 1514  # at least two full frames


def test_recorded_20pct_loss_probe_passes_and_a_black_hole_fails():
    result = _ping("ping_probe_loss20pct.txt")
    assert (result.transmitted, result.received) == (100, 80)
    assert P.judge_probe(_exp(_spec(loss="20%")), result.transmitted, result.rtt_ms, "bare") == []
    # The same replies where no loss is declared: a loss model that should not be there.
    lossless = P.judge_probe(_exp(LinkSpec()), result.transmitted, result.rtt_ms, "bare")
    assert len(lossless) == 1 and "80 of 100 echo requests answered on a path lossless" in lossless[0]
    # Where 50 % is declared, 80 of 100 is far too many (p ~ 1e-9): the declared loss is not what is installed.
    assert "declared to deliver 50%" in P.judge_probe(_exp(_spec(loss="50%")), 100, result.rtt_ms, "bare")[0]
    dead = _ping("ping_unreachable.txt")
    found = P.judge_probe(_exp(_spec(loss="20%")), dead.transmitted, dead.rtt_ms, "bare")
    assert found and "carries nothing" in found[0]


def test_a_probe_with_everything_lost_is_right_where_everything_is_declared_lost():
    dead = _ping("ping_unreachable.txt")
    assert P.judge_probe(_exp(_spec(loss="100%")), dead.transmitted, dead.rtt_ms, "bare") == []
    alive = _ping("ping_probe_loss20pct.txt")
    assert "declared to lose everything" in P.judge_probe(_exp(_spec(loss="100%")), 100, alive.rtt_ms, "bare")[0]


def test_delay_below_the_declaration_or_far_above_it_is_named():
    result = _ping("ping_probe_emulator_5ms.txt")
    assert 5.0 < result.rtt_ms.min() < 5.5
    assert P.judge_probe(_exp(_spec(delay="5ms")), 100, result.rtt_ms, "bare") == []
    missing = P.judge_probe(_exp(_spec(delay="10ms")), 100, result.rtt_ms, "bare")
    assert len(missing) == 1 and "a delay is missing" in missing[0]
    extra = P.judge_probe(_exp(LinkSpec()), 100, result.rtt_ms, "bare")  # 5 ms left where none is declared
    assert len(extra) == 1 and "where the declared delay is 0.000 ms" in extra[0]
    assert P.judge_probe(_exp(LinkSpec()), 100, result.rtt_ms, "vm") == []  # a TCG guest's path adds that much


def test_jitter_lowers_the_delay_floor():
    rtts = np.array([3.0, 6.0, 7.0])  # ms: 5 ms declared, normal jitter of 1 ms can reach 4 sd below
    assert P.judge_probe(_exp(_spec(delay="5ms", jitter="1ms")), 3, rtts, "bare") == []
    assert "a delay is missing" in P.judge_probe(_exp(_spec(delay="5ms")), 3, rtts, "bare")[0]


def test_a_reordering_direction_may_skip_its_delay():
    """netem's reorder sends a packet without the delay: the shortest round trip may lack that direction's."""
    rtts = np.array([0.07, 10.1, 10.2])  # ms: 5 ms declared each way, one request reordered on the way out
    assert P.judge_probe(_exp(_spec(delay="5ms", reorder="25%")), 3, rtts, "bare") == []
    assert "a delay is missing" in P.judge_probe(_exp(_spec(delay="5ms")), 3, rtts, "bare")[0]
    assert _exp(_spec(delay="5ms", reorder="25%")).reordering


def test_probe_plan_keeps_the_probes_under_a_tenth_of_a_slow_rate():
    count, interval = P.probe_plan(_exp(LinkSpec()))
    assert (count, interval) == (P.PROBES, P.PROBE_INTERVAL_S)
    count, interval = P.probe_plan(_exp(_spec(rate="1Mbit")), senders=2)
    assert 2 * (P.PROBE_SIZE + 62) * 8 / interval <= 0.1 * 1e6 * 1.001
    assert count * interval <= P.PROBE_BUDGET_S + interval and count >= P.MIN_PROBES


@pytest.mark.parametrize("fixture, spec, kernel, measured", [
    ("ping_train_tbf_5mbit.txt", {"rate": "5Mbit", "buffer": "100kB"}, True, 5.00),
    ("ping_train_emulator_20mbit_5ms.txt", {"rate": "20Mbit", "delay": "5ms"}, False, 19.7),
    ("ping_train_tbf_100mbit_100kB.txt", {"rate": "100Mbit", "buffer": "100kB"}, True, 75.3),
])
def test_recorded_trains_measure_the_declared_rate(fixture, spec, kernel, measured):
    exp = _exp(_spec(**spec), kernel=kernel)
    requests, payload = P.burst_plan(exp, 1500, 4, "bare")
    assert payload == 1400
    result = _ping(fixture)
    assert result.transmitted == requests and result.elapsed_ms is not None
    rate, problems = P.judge_burst(exp, payload, 4, result)
    assert problems == [] and rate / 1e6 == pytest.approx(measured, rel=0.01)


def test_a_train_off_by_more_than_the_factor_is_named():
    def judged(fixture: str, declared: str) -> list[str]:
        exp = _exp(_spec(rate=declared), kernel="tbf" in fixture)
        return P.judge_burst(exp, 1400, 4, _ping(fixture))[1]

    # a link slower than declared: 5 Mbit/s where 20 are (a rate left by another configuration)
    slow = judged("ping_train_tbf_5mbit.txt", "20Mbit")
    assert slow and "left the queue at 5 Mbit/s, where 20 Mbit/s is declared" in slow[0]
    # faster: 75 where 20 are, and 20 where 1 is (no rate limit at all)
    fast = judged("ping_train_tbf_100mbit_100kB.txt", "20Mbit")
    assert fast and "left the queue at 77.6 Mbit/s, where 20 Mbit/s is declared" in fast[0]
    assert "did not queue: no rate limit of 1 Mbit/s" in judged("ping_train_emulator_20mbit_5ms.txt", "1Mbit")[0]
    # within the factor: not named
    assert judged("ping_train_tbf_5mbit.txt", "10Mbit") == []


def test_a_train_ping_could_not_send_at_once_is_not_judged():
    """ENOBUFS half-way: ping sends the rest at its interval, and its "time" is far longer than the train's
    time on the link."""
    result = _ping("ping_train_tbf_5mbit.txt")
    slow = ping.PingResult(**{**result.__dict__, "elapsed_ms": 500.0})
    assert P.judge_burst(_exp(_spec(rate="5Mbit"), kernel=True), 1400, 4, slow) == (None, [])
    # A train recorded so: ping's loop took 26 ms of the train's 30 ms on the link.
    exp = _exp(_spec(rate="50Mbit", delay="5ms", buffer="100kB"))
    assert P.judge_burst(exp, 1400, 4, _ping("ping_train_emulator_50mbit_5ms_100kB.txt")) == (None, [])


def test_burst_plan_declines_what_cannot_be_timed():
    assert P.burst_plan(_exp(LinkSpec()), 1500, 4, "bare") is None  # no rate
    assert P.burst_plan(_exp(_spec(rate="200Mbit")), 1500, 4, "bare") is None  # too fast
    assert P.burst_plan(_exp(_spec(rate="10Mbit", jitter="1ms")), 1500, 4, "bare") is None  # reorders
    assert P.burst_plan(_exp(_spec(rate="10Mbit")), 1500, 4, "vm") is None  # a guest's clock
    assert P.burst_plan(_exp(_spec(rate="32kbit")), 1500, 4, "bare") is None  # too slow for the budget
    exp = _exp(_spec(rate="256kbit"), kernel=True)
    requests, payload = P.burst_plan(exp, 1500, 4, "bare")
    queued = requests - P._line_rate_frames(exp, payload + 42)
    assert payload < 1400 and queued == 2 * P.RATE_POINTS and queued * (payload + 42) * 8 / 256e3 <= P.BURST_BUDGET_S
    requests, payload = P.burst_plan(_exp(_spec(rate="100Mbit")), 1500, 4, "bare")  # 30 ms of queue
    assert payload == 1400 and requests * 1442 * 8 / 100e6 >= P.TRAIN_SPAN_S


def test_nothing_received_fails_only_what_the_configuration_cannot_explain():
    nothing = [("rtt.loss_ratio", 1.0), ("rtt.min_ms", 0.1)]
    lossy = _exp(_spec(loss="20%"))
    reason = P.nothing_received(nothing, lossy, drops=0)
    assert reason and "rtt.loss_ratio = 1" in reason and "80%" in reason
    # The link's model dropped some, but 20 % loss does not lose everything: still not a measurement.
    assert P.nothing_received(nothing, lossy, drops=12)
    assert P.nothing_received(nothing, _exp(_spec(loss="60%")), drops=0) is None  # can lose everything
    assert P.nothing_received(nothing, _exp(_spec(loss="100%")), drops=0) is None
    scheduled = LinkSpec.model_validate({"schedule": {"steps": [{"at": "1s", "forward": {"loss": "100%"}}]}})
    assert P.nothing_received(nothing, _exp(scheduled), drops=40) is None  # its own model dropped them
    assert P.nothing_received(nothing, _exp(scheduled), drops=0)
    assert P.nothing_received([("rtt.loss_ratio", 0.2)], lossy, drops=0) is None
    assert "throughput.rx_mbps = 0" in P.nothing_received([("throughput.rx_mbps", 0.0)], _exp(LinkSpec()), 0)


def test_link_drops_adds_every_kind_over_links_and_directions():
    counters = {"bottleneck": TrialCounters({"forward": {"lost": 3, "dropped_queue": 2, "forwarded_packets": 90},
                                              "reverse": {"tx_errors": 1}}),
                "s1": TrialCounters({"forward": {"drops": 4}})}
    assert P.link_drops(counters) == 10
