"""The recorders around a trial (runner/recorders.py): what each records, in which order their drops count, and
that a workload during another gets a context of its own instead of a shared one changed under it."""

from __future__ import annotations

from pathlib import Path

import pytest

from vnetbench.impair.backend import TrialCounters
from vnetbench.runner import recorders
from vnetbench.runner.recorders import CpuRecorder, EnvironmentRecorder, LinkRecorder, QdiscRecorder
from vnetbench.workloads.base import Measurement, Started, TrialContext, TrialEndpoints, WorkloadOptions


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
    rec.collect(m, raw, None)
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
            r.collect(m, raw, None)
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
    rec.collect(m, raw, None)
    assert ("environment_counters" in raw) == recorded
    assert not m.samples and rec.dropped() == 0.0


def test_a_companion_gets_its_own_context_and_the_trials_stays_as_it_was(tmp_path: Path):
    ctx = TrialContext(config=None, endpoints=TrialEndpoints(None, []), ip_version=4, tmp=tmp_path, t0=100.0)
    leader = Started("stream", measured_from=2.0, measured_s=10.0, ends_by=13.0)
    options = WorkloadOptions(tool="iperf3")
    during = ctx.during(leader, options)
    assert (during.leader, during.leader_options) == (leader, options)
    assert ctx.leader is None and ctx.leader_options is None
    assert during.window(5.0) == (2.0, 9.0) and ctx.window(5.0) == (0.0, 5.0)
    during.labels["0"] = "ss on s1"  # output files are numbered across the whole trial
    assert ctx.labels == {"0": "ss on s1"}


# ------------------------------------------------------------------ the CPU of the lab's machine

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "proc"


def stat_text(per_cpu: dict[str, tuple[int, ...]]) -> str:
    return "".join(f"{cpu} {' '.join(map(str, v))} 0 0\n" for cpu, v in per_cpu.items())


def test_proc_stat_is_read_per_cpu_in_its_kernel_order():
    stat = recorders.parse_proc_stat((FIXTURES / "stat-2cpu.txt").read_text())  # this VM's, with steal
    assert list(stat) == ["cpu0", "cpu1"] and all(len(v) == len(recorders.STAT_FIELDS) for v in stat.values())
    assert stat["cpu0"][recorders.STAT_FIELDS.index("steal")] > 0
    # an old kernel's line without iowait, irq, softirq and steal: the missing counters are 0
    assert recorders.parse_proc_stat("cpu 4 0 2 9\ncpu0 4 0 2 9\nintr 1 2\n") == {"cpu0": (4, 0, 2, 9, 0, 0, 0, 0)}


def two_seconds_of_work() -> CpuRecorder:
    """cpu0 all user for 2 s; cpu1 idle but for 0.2 s of softirq and 0.1 s stolen (100 ticks a second)."""
    rec = CpuRecorder("test", read=lambda: "")
    counters = lambda t: {"cpu0": (int(100 * t), 0, 0, 0, 0, 0, 0, 0),  # noqa: E731
                          "cpu1": (0, 0, 0, int(85 * t), 0, 0, int(10 * t), int(5 * t))}
    rec.samples = [(1000.0 + t, counters(t)) for t in (0.0, 1.0, 2.0)]
    return rec


def test_busy_cores_softirq_steal_and_the_service_demand_of_a_stream():
    rec = two_seconds_of_work()
    m, raw = Measurement(), {}
    m.add("throughput.rx_mbps", 1000.0)
    rec.collect(m, raw, (1000.0, 1002.0))
    got = values(m)
    assert got["cpu.util_pct"] == pytest.approx(110)  # one core, and a tenth of the other in softirq
    assert got["cpu.softirq_pct"] == pytest.approx(10) and got["cpu.steal_pct"] == pytest.approx(5)
    # 1.1 cores = 1.1e6 us of CPU a second, over 1000 Mbit/s = 122070.3 KB/s
    assert got["cpu.us_per_kb"] == pytest.approx(1.1e6 / (1e9 / 8 / 1024))
    assert "cpu.us_per_transaction" not in got
    assert raw["cpu"]["per_cpu_pct"]["cpu1"] == {"user": 0, "nice": 0, "system": 0, "idle": 85, "iowait": 0, "irq": 0,
                                                 "softirq": 10, "steal": 5}


def test_the_window_edges_are_interpolated_and_a_transaction_rate_gives_its_cost():
    rec = two_seconds_of_work()
    m = Measurement()
    m.add("rr.transactions_per_s", 20000.0)
    rec.collect(m, {}, (1000.5, 1001.5))  # between the samples: the same steady shares
    got = values(m)
    assert got["cpu.util_pct"] == pytest.approx(110)
    assert got["cpu.us_per_transaction"] == pytest.approx(1.1e6 / 20000)


def test_no_cpu_numbers_from_a_window_too_short_a_failed_trial_or_nothing_moved():
    rec = two_seconds_of_work()
    m, raw = Measurement(), {}
    rec.collect(m, raw, (1000.0, 1000.0 + recorders.CPU_MIN_WINDOW_S / 2))
    assert not m.samples and "cpu" not in raw
    raw = {}
    rec.collect(None, raw, (1000.0, 1002.0))  # a failed trial: its CPU is kept with it, measured nothing
    assert raw["cpu"]["window_s"] == 2.0
    m = Measurement()
    m.add("throughput.rx_mbps", 0.0)
    rec.collect(m, {}, (1000.0, 1002.0))
    assert "cpu.us_per_kb" in m.undefined  # nothing received: a cost per byte has no value


def test_the_sampler_reads_from_start_to_stop_and_then_ends():
    reads = []

    def read() -> str:
        reads.append(1)
        return stat_text({"cpu0": (len(reads), 0, 0, 0, 0, 0, 0, 0)})

    rec = CpuRecorder("test", read=read, interval=0.01)
    rec.start(1.0)
    import time
    time.sleep(0.2)
    rec.stop()
    n = len(reads)
    time.sleep(0.05)
    assert len(reads) == n >= 3 and len(rec.samples) == n
    assert [s[0] for s in rec.samples] == sorted(s[0] for s in rec.samples)
