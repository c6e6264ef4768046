"""The recorders around a trial (runner/recorders.py): what each records, in which order their drops count, and
that a workload during another gets a context of its own instead of a shared one changed under it."""

from __future__ import annotations

from pathlib import Path

import pytest

from vnetbench.impair.backend import TrialCounters
from vnetbench.runner import recorders
from vnetbench.runner.recorders import EnvironmentRecorder, LinkRecorder, QdiscRecorder
from vnetbench.workloads.base import Measurement, Started, TrialContext, TrialHosts, WorkloadOptions


class CountingLinks:
    """The part of LinkManager a trial's recorder uses, with counters given by the test."""

    def __init__(self, counters: dict[str, TrialCounters]):
        self.counters = counters
        self.started_with: float | None = None

    def start_trial(self, seconds: float) -> None:
        self.started_with = seconds

    def end_trial(self) -> dict[str, TrialCounters]:
        return self.counters


def values(m: Measurement) -> dict[str, float]:
    return {s.metric: s.value for s in m.samples}


def test_the_links_give_the_bottleneck_drops_and_the_emulators_own_metrics():
    links = CountingLinks({"bottleneck": TrialCounters({"forward": {"dropped_queue": 7, "lost": 3,
                                                                     "max_queue_delay_us": 2500}}),
                           "s1": TrialCounters({"forward": {"lost": 2}, "reverse": {"drops": 1}})})
    rec = LinkRecorder(links)
    rec.start(4.5)
    rec.stop()
    m, raw = Measurement(), {}
    rec.collect(m, raw)
    assert links.started_with == 4.5
    assert values(m) == {"bottleneck.drops": 7.0, "link.lost_packets": 3.0, "link.max_queue_delay_ms": 2.5}
    assert raw["links"]["s1"] == {"forward": {"lost": 2}, "reverse": {"drops": 1}}
    assert rec.dropped() == 7 + 3 + 2 + 1  # every link and direction: what can explain a trial with nothing


def test_the_port_qdisc_counts_the_drops_only_where_the_links_count_none(monkeypatch):
    reads = iter([{"packets": 10, "drops": 1, "overlimits": 0}, {"packets": 510, "drops": 41, "overlimits": 9}] * 2)
    monkeypatch.setattr(recorders.tc, "counters", lambda iface: next(reads))

    def trial(link_counters: dict[str, TrialCounters]) -> tuple[dict[str, float], dict]:
        chain = [LinkRecorder(CountingLinks(link_counters)), QdiscRecorder(object())]
        for r in chain:
            r.start(1.0)
        for r in chain:
            r.stop()
        m, raw = Measurement(), {}
        for r in chain:
            r.collect(m, raw)
        return values(m), raw

    kernel_shaped, raw = trial({})  # tbf/htb on the switch port: only the kernel counts
    assert kernel_shaped == {"bottleneck.drops": 40.0}
    assert raw["bottleneck_counters"]["after"]["packets"] == 510
    emulated, _ = trial({"bottleneck": TrialCounters({"forward": {"dropped_queue": 5}})})
    assert emulated == {"bottleneck.drops": 5.0}  # the emulator's queue, not the port's


@pytest.mark.parametrize("counts, recorded", [(None, False), ({}, True), ({"r": {"tx_packets": 1}}, True)])
def test_an_environment_records_its_counters_only_when_it_keeps_some(counts, recorded):
    class Env:
        def counters(self):
            return counts

    rec = EnvironmentRecorder(Env())
    rec.start(1.0)
    rec.stop()
    m, raw = Measurement(), {}
    rec.collect(m, raw)
    assert ("environment_counters" in raw) == recorded
    assert not m.samples and rec.dropped() == 0.0


def test_a_companion_gets_its_own_context_and_the_trials_stays_as_it_was(tmp_path: Path):
    ctx = TrialContext(config=None, hosts=TrialHosts(None, []), ip_version=4, tmp=tmp_path, t0=100.0)
    leader = Started("stream", measured_from=2.0, measured_s=10.0, ends_by=13.0)
    options = WorkloadOptions(tool="iperf3")
    during = ctx.during(leader, options)
    assert (during.leader, during.leader_options) == (leader, options)
    assert ctx.leader is None and ctx.leader_options is None
    assert during.window(5.0) == (2.0, 9.0) and ctx.window(5.0) == (0.0, 5.0)
    during.labels["0"] = "ss on s1"  # output files are numbered across the whole trial
    assert ctx.labels == {"0": "ss on s1"}
