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


def test_the_time_idle_cores_polled_is_idle_not_the_traffics_cost():
    """A kernel without a cpuidle driver: the lab's pollers (lab/idle.py, niced to 19) spin on every idle core,
    and /proc/stat counts their time as nice. cpu0 works a quarter of the time and polls the rest; cpu1 polls
    all but 10 % of softirq. Sampled as CpuRecorder samples, with the pollers' schedstat read at each sample."""
    hz = recorders.CLOCK_TICKS
    clock = {"t": 0.0}
    def stat() -> str:
        ticks = hz * clock["t"]
        return stat_text({"cpu0": (int(0.25 * ticks), int(0.75 * ticks), 0, 0, 0, 0, 0, 0),
                          "cpu1": (0, int(0.9 * ticks), 0, 0, 0, 0, int(0.1 * ticks), 0)})

    polled = lambda: {"cpu0": int(0.75e9 * clock["t"]), "cpu1": int(0.9e9 * clock["t"])}  # noqa: E731
    rec = CpuRecorder("test", read=stat, processes=None, polled=polled)
    for t in (0.0, 1.0, 2.0):
        clock["t"] = t
        rec._sample()
    rec.samples = [(1000.0 + t, counters) for t, (_, counters) in zip((0.0, 1.0, 2.0), rec.samples)]
    m, raw = Measurement(), {}
    m.add("rr.transactions_per_s", 10000.0)
    rec.collect(m, raw, (1000.0, 1002.0))
    got = values(m)
    assert got["cpu.util_pct"] == pytest.approx(35)  # a quarter of cpu0 and cpu1's softirq: not the polling
    assert got["cpu.us_per_transaction"] == pytest.approx(0.35e6 / 10000)
    assert raw["cpu"]["per_cpu_pct"]["cpu0"]["idle"] == pytest.approx(75)
    assert raw["cpu"]["per_cpu_pct"]["cpu1"]["nice"] == 0 and raw["cpu"]["per_cpu_pct"]["cpu1"]["idle"] == 90
    # what a niced process of someone else's ran is still busy: only the pollers' own time moves
    assert recorders.polling_as_idle({"cpu0": (0, 50, 0, 50, 0, 0, 0, 0)}, {"cpu0": int(0.2e9)})["cpu0"] == \
        (0, 50 - 0.2 * hz, 0, 50 + 0.2 * hz, 0, 0, 0, 0)


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


def fake_process(root: Path, pid: int, threads: dict[int, tuple[str, int]]) -> None:
    """A /proc/<pid>/task tree: per thread id its name and nanoseconds on a CPU (schedstat's first field)."""
    for tid, (name, ns) in threads.items():
        task = root / str(pid) / "task" / str(tid)
        task.mkdir(parents=True)
        (task / "comm").write_text(name + "\n")
        (task / "schedstat").write_text(f"{ns} 123 45\n")


def test_a_processs_threads_are_summed_by_kind_with_their_numbers_folded(tmp_path: Path):
    fake_process(tmp_path, 7, {7: ("qemu-system-x86", 10), 8: ("CPU 0/TCG", 1_000), 9: ("CPU 1/TCG", 2_000),
                               10: ("vhost-7", 50)})
    fake_process(tmp_path, 20, {20: ("vnb-link", 5)})
    assert recorders.thread_times(7, tmp_path) == {"qemu-system-x86": 10, "CPU #/TCG": 3_000, "vhost-#": 50}
    assert recorders.thread_times(99, tmp_path) == {}  # gone
    assert recorders.parts_times({"qemu": [7, 99], "emulator": [20]}, tmp_path) == {
        "qemu/qemu-system-x86": (10,), "qemu/CPU #/TCG": (3_000,), "qemu/vhost-#": (50,), "emulator/vnb-link": (5,)}


def test_a_parts_cpu_is_its_threads_time_over_the_window_per_kind():
    """Two vCPU threads a full core each, an I/O thread that starts half-way (0 before it existed), and the
    emulator's core half busy; the window's edges fall between samples."""
    s = 1e9  # ns a second
    samples = [(1000.0, {"qemu/CPU #/TCG": (0,), "emulator/vnb-link": (0,)}),
               (1001.0, {"qemu/CPU #/TCG": (2 * s,), "emulator/vnb-link": (0.5 * s,), "qemu/worker": (0,)}),
               (1002.0, {"qemu/CPU #/TCG": (4 * s,), "emulator/vnb-link": (1 * s,), "qemu/worker": (0.25 * s,)})]
    assert recorders.parts_pct(samples, (1000.5, 1002.0)) == {"qemu": {"CPU #/TCG": 200.0, "worker": 16.67},
                                                              "emulator": {"vnb-link": 50.0}}
    assert recorders.parts_pct(samples, (1000.0, 1000.4)) is None  # shorter than a judged window
    assert recorders.parts_pct(samples[:1], (1000.0, 1002.0)) is None


def test_the_parts_become_metrics_beside_the_machines_cpu():
    rec = two_seconds_of_work()
    rec._parts = {"emulator": [1], "qemu": [2]}
    rec.part_samples = [(1000.0 + t, {"emulator/vnb-link": (int(t * 1e9),), "qemu/CPU #/KVM": (int(t * 0.1e9),),
                                      "qemu/qemu-system-x86": (int(t * 0.05e9),)}) for t in (0.0, 1.0, 2.0)]
    m, raw = Measurement(), {}
    rec.collect(m, raw, (1000.0, 1002.0))
    got = values(m)
    assert got["cpu.emulator_pct"] == pytest.approx(100) and got["cpu.qemu_pct"] == pytest.approx(15)
    assert raw["cpu"]["parts_pct"]["qemu"] == {"CPU #/KVM": 10.0, "qemu-system-x86": 5.0}


def test_a_real_spinning_process_is_sampled_as_the_scheduler_counts_it():
    """A process that spins, sampled while it runs: its threads' schedstat time agrees with its own utime +
    stime (/proc/<pid>/stat, 10 ms ticks) read at the same moments, and the recorder asks for the parts when
    the trial starts and samples them with /proc/stat."""
    import os
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        asked = []
        rec = CpuRecorder("test", interval=0.05, processes=None,
                          parts=lambda: asked.append(1) or {"emulator": [proc.pid], "qemu": []})
        rec.start(1.0)
        time.sleep(1.0)
        rec.stop()
        hz = os.sysconf("SC_CLK_TCK")
        fields = open(f"/proc/{proc.pid}/stat").read().rsplit(")", 1)[1].split()
        ticks_ns = (int(fields[11]) + int(fields[12])) * 1e9 / hz
        ns = sum(recorders.thread_times(proc.pid).values())
    finally:
        proc.kill()
        proc.wait()
    assert asked == [1] and rec._parts == {"emulator": [proc.pid]}  # a part without processes is left out
    assert len(rec.part_samples) == len(rec.samples) >= 10
    assert abs(ns - ticks_ns) <= 3 * 1e9 / hz  # a tick at either end, and the read between them
    m, raw = Measurement(), {}
    rec.collect(m, raw, (rec.samples[0][0], rec.samples[-1][0]))
    assert 0 < values(m)["cpu.emulator_pct"] <= 101  # one thread: at most one core


def test_a_cgroups_cpu_account_is_read_from_either_version(tmp_path: Path):
    from vnetbench.lab.cgroups import CpuAccount
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "cpuacct.usage").write_text("1500000000\n")
    (tmp_path / "v2").mkdir()
    (tmp_path / "v2" / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n")
    v1, v2 = CpuAccount("r", tmp_path / "v1" / "cpuacct.usage"), CpuAccount("s1", tmp_path / "v2" / "cpu.stat")
    assert v1.ns() == 1_500_000_000 and v2.ns() == 2_500_000_000
    assert CpuAccount("gone", tmp_path / "nowhere" / "cpu.stat").ns() is None
    fake_process(tmp_path, 7, {7: ("qemu-system-x86", 10)})
    assert recorders.parts_times({"container": [v1, v2, CpuAccount("gone", tmp_path / "x")], "qemu": [7]},
                                 tmp_path) == {"container/r": (1_500_000_000,), "container/s1": (2_500_000_000,),
                                               "qemu/qemu-system-x86": (10,)}


def test_this_processs_cgroup_counts_the_cpu_it_spends():
    """On this machine's own cgroups (v1's cpuacct or v2's cpu.stat, whichever counts here)."""
    import os
    import time

    from vnetbench.lab import cgroups
    account = cgroups.cpu_account("me", os.getpid())
    assert account is not None
    before = account.ns()
    t = time.process_time()
    while time.process_time() - t < 0.2:
        pass
    assert account.ns() - before >= 0.19e9  # its cgroup holds this process and maybe others: at least its time


def test_a_guests_part_is_its_qemu_process_and_an_engines_its_containers_cgroups(tmp_path: Path):
    from types import SimpleNamespace

    from vnetbench.lab.cgroups import CpuAccount
    from vnetbench.lab.environments.docker import EngineEnvironment
    from vnetbench.lab.environments.vm import VmEnvironment
    vm = VmEnvironment.__new__(VmEnvironment)
    vm.nodes = [SimpleNamespace(guest=SimpleNamespace(pid=41)), SimpleNamespace(guest=SimpleNamespace(pid=None)),
                SimpleNamespace(guest=SimpleNamespace(pid=43))]
    assert vm.cpu_parts() == {"qemu": [41, 43]}  # a guest whose QEMU is not running has no part
    engine = EngineEnvironment.__new__(EngineEnvironment)
    engine.cpu_accounts = [CpuAccount("d-r", tmp_path / "cpuacct.usage")]
    assert engine.cpu_parts() == {"container": engine.cpu_accounts}


GUEST_LOOP_OUTPUT = """vnb-boot 1000100.50 99.98 100.02
vnb-t 100.20
cpu  100 0 50 800 0 0 50 0 0 0
cpu0 100 0 50 800 0 0 50 0 0 0
softirq 1 2 3
vnb-t 101.20
cpu  150 0 75 850 0 0 75 0 0 0
cpu0 150 0 75 850 0 0 75 0 0 0
softirq 1 2 3
vnb-t 102.20
cpu0 200 0 100 900
"""


def test_a_guests_samples_are_put_on_the_controllers_clock_by_its_uptime():
    """Booted at 1000100.50 - 100.00 = 1000000.50 on its own clock, 0.25 s ahead of the controller's: the sample
    at uptime 100.20 was taken at 1000100.45 here. The last sample, cut short (no softirq line), is left out."""
    samples = recorders.parse_uptime_stamped_stats(GUEST_LOOP_OUTPUT, offset_s=0.25)
    assert [round(t, 2) for t, _ in samples] == [1000100.45, 1000101.45]
    assert samples[1][1]["cpu0"] == (150, 0, 75, 850, 0, 0, 75, 0)
    assert recorders.parse_uptime_stamped_stats(GUEST_LOOP_OUTPUT.replace("1000100.50", "1000100.%N")) == []
    assert recorders.parse_uptime_stamped_stats(GUEST_LOOP_OUTPUT.split("\n", 1)[1]) == []  # no start line


def test_the_guests_cpu_from_inside_is_their_busy_time_less_the_samplers():
    from types import SimpleNamespace
    guests = [SimpleNamespace(name="r", offset_s=0.0, cpu_seconds=lambda proc, err: 0.1),
              SimpleNamespace(name="s1", offset_s=0.0, cpu_seconds=lambda proc, err: None)]
    rec = recorders.GuestsCpuRecorder(guests, Path("/nonexistent"))
    # r: its one vCPU half busy (a quarter of it softirq) over 2 s; its sampler used 0.1 s of it over 2 s of life
    # s1: fully busy, no softirq; its sampler's time not known
    r = [(1000.0 + t, {"cpu0": (int(25 * t), 0, 0, int(50 * t), 0, 0, int(25 * t), 0)}) for t in (0.0, 1.0, 2.0)]
    s1 = [(1000.0 + t, {"cpu0": (int(100 * t), 0, 0, 0, 0, 0, 0, 0)}) for t in (0.0, 1.0, 2.0)]
    rec.samples = {"r": r, "s1": s1}
    rec._procs = {"r": (SimpleNamespace(started_at=1000.0, ended_at=1002.0), None, None),
                  "s1": (SimpleNamespace(started_at=1000.0, ended_at=1002.0), None, None)}
    m, raw = Measurement(), {"instruments_cpu_pct": {"s1": 20.0, "elsewhere": 7.0}}  # a ping in s1: 20 % of it
    rec.collect(m, raw, (1000.0, 1002.0))
    got = values(m)
    assert got == pytest.approx({"cpu.guest_util_pct": 50 - 5 + 100 - 20, "cpu.guest_softirq_pct": 25,
                                 "cpu.guest_steal_pct": 0})
    assert "cpu.util_pct" not in got and set(raw) == {"guest_cpu", "instruments_cpu_pct"}
    assert raw["guest_cpu"]["machines"]["r"]["sampler_pct"] == 5.0


def test_an_instruments_cpu_is_taken_out_of_the_part_that_ran_it_as_out_of_the_machine():
    """A guest's ping used 20 % of a core: it is in the QEMU part's time and the machine's busy time, and is
    taken out of both; the emulator, which ran no instrument, keeps all of its own. Parts may not go below 0."""
    rec = CpuRecorder("here", read=lambda: "", processes=None, parts=lambda: {},
                      part_of={"r": "qemu", "s1": "qemu"}.get)
    rec._parts = {"emulator": [1], "qemu": [2]}
    # one CPU: 150 of 200 ticks busy over 2 s (two CPUs: 150 cores x 100)
    rec.samples = [(1000.0 + t, {"cpu0": (100 * t, 0, 0, 0, 0, 0, 0, 0), "cpu1": (50 * t, 0, 0, 50 * t, 0, 0, 0, 0)})
                   for t in (0, 1, 2)]
    rec.part_samples = [(1000.0 + t, {"emulator/vnb-link": (int(0.3e9 * t),), "qemu/CPU #/TCG": (int(1.1e9 * t),)})
                        for t in (0, 1, 2)]
    m = Measurement()
    m.add("cpu.probe_pct", 20.0)
    raw = {"instruments_cpu_pct": {"s1": 20.0}}
    rec.collect(m, raw, (1000.0, 1002.0))
    got = values(m)
    assert got["cpu.util_pct"] == pytest.approx(130) and got["cpu.qemu_pct"] == pytest.approx(90)
    assert got["cpu.emulator_pct"] == pytest.approx(30)
    assert raw["cpu"]["parts_pct"]["qemu"] == {"CPU #/TCG": 110.0}  # as sampled, the instrument in it
    m = Measurement()
    rec.collect(m, {"instruments_cpu_pct": {"r": 500.0}}, (1000.0, 1002.0))
    assert values(m)["cpu.qemu_pct"] == 0


def test_a_guest_holds_its_endpoints_processes_and_an_engine_its_containers():
    from types import SimpleNamespace

    from vnetbench.lab.cgroups import CpuAccount
    from vnetbench.lab.environments.base import EnvironmentType
    from vnetbench.lab.environments.docker import EngineEnvironment
    from vnetbench.lab.environments.vm import VmEnvironment
    vm = VmEnvironment.__new__(VmEnvironment)
    vm.nodes = [SimpleNamespace(name="r"), SimpleNamespace(name="s1")]
    assert (vm.cpu_part_of("r"), vm.cpu_part_of("s2")) == ("qemu", None)
    engine = EngineEnvironment.__new__(EngineEnvironment)
    engine.cpu_accounts = [CpuAccount("r", Path("/x"))]
    assert (engine.cpu_part_of("r"), engine.cpu_part_of("s1")) == ("container", None)  # s1 has no account
    assert EnvironmentType.cpu_part_of(object(), "r") is None
