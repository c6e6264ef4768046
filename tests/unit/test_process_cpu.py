"""What a trial's own processes used in CPU (issue 36): iputils ping below a 10 ms interval spins a core while
it waits for nothing, and a trial's CPU cost counted that spin as the traffic's. Each process a trial starts is
now metered where it runs (rusage when this machine reaps it; the exec wrapper's `times` in a container, a
guest or on an SSH host), and the instruments' share (cpu.probe_pct) is left out of cpu.util_pct.

The busy children below stop at a fixed CPU time (time.process_time), not a wall time: their CPU is known
whatever else the machine does."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from vnetbench.lab.nodes import (CPU_MARK, RunsCommands, exec_wrapper, run_holding_input, without_cpu_time,
                                 wrapper_cpu_seconds)
from vnetbench.lab.teardown import Registry, poll_metered, stop_groups, wait_metered
from vnetbench.runner.bench import instruments_cpu
from vnetbench.runner import recorders
from vnetbench.runner.recorders import CpuRecorder
from vnetbench.workloads.base import Measurement, Started, TrialContext, TrialEndpoints


def values(m: Measurement) -> dict[str, float]:
    return {s.metric: s.value for s in m.samples}

BUSY_S = 0.3
# A child that computes until it has used BUSY_S of CPU, then says so on standard error.
BUSY = [sys.executable, "-c", f"import sys, time\nwhile time.process_time() < {BUSY_S}: pass\n"
                              "print('busy done', file=sys.stderr)"]


# ------------------------------------------------------------------ reaping here keeps the rusage


def test_a_reaped_child_keeps_its_cpu_time_and_when_it_ended():
    proc = subprocess.Popen(BUSY, stderr=subprocess.DEVNULL)
    assert wait_metered(proc, timeout=30) == 0 and proc.returncode == 0
    assert BUSY_S <= proc.cpu_s < BUSY_S + 0.5  # the interpreter's start-up on top
    assert abs(proc.ended_at - time.time()) < 5


def test_a_timeout_leaves_the_child_running_and_a_later_wait_reaps_it():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    with pytest.raises(subprocess.TimeoutExpired):
        wait_metered(proc, timeout=0.05)
    assert poll_metered(proc) is None and proc.returncode is None
    assert wait_metered(proc, timeout=30) == 0 and proc.cpu_s < 0.5


def test_exit_statuses_and_signals_come_back_as_subprocess_gives_them():
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    assert wait_metered(proc, timeout=30) == 3
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    assert stop_groups([proc], grace=5) == [] and proc.returncode == -15 and hasattr(proc, "cpu_s")


def test_a_child_reaped_elsewhere_is_not_metered():
    proc = subprocess.Popen(["true"])
    proc.wait(timeout=30)
    assert wait_metered(proc, timeout=1) == 0 and not hasattr(proc, "cpu_s")


# ------------------------------------------------------------------ the wrapper's -t


@pytest.mark.parametrize("shell", ["sh", "busybox"])
def test_the_wrapper_says_the_commands_cpu_time_after_its_own_output(shell):
    if shell == "busybox" and subprocess.run(["which", "busybox"], capture_output=True).returncode:
        pytest.skip("busybox is not installed (the containers' and guests' shell)")
    argv = [*(["busybox", "sh"] if shell == "busybox" else ["sh"]), "-c", exec_wrapper("", "here"), "vnb-exec"]
    # its input held open while it runs, as a container's or a guest's command channel holds it
    done = run_holding_input([*argv, "-t", *BUSY], 60)
    assert done.returncode == 0
    seconds = wrapper_cpu_seconds(done.stderr)
    assert seconds is not None and BUSY_S - 0.02 <= seconds < BUSY_S + 0.5, done.stderr  # `times` counts 10 ms ticks
    assert without_cpu_time(done.stderr) == "busy done"
    untimed = run_holding_input([*argv, *BUSY], 60)
    assert untimed.stderr == "busy done\n" and wrapper_cpu_seconds(untimed.stderr) is None
    failing = run_holding_input([*argv, "-t", "sh", "-c", "exit 4"], 60)
    assert failing.returncode == 4 and wrapper_cpu_seconds(failing.stderr) is not None


def test_the_wrappers_lines_are_read_from_the_end():
    text = f"ping: warning\n{CPU_MARK}\n0m0.010000s 0m0.020000s\n1m2.500000s 0m0.250000s\n"
    assert wrapper_cpu_seconds(text) == pytest.approx(62.75)
    assert without_cpu_time(text) == "ping: warning"
    assert wrapper_cpu_seconds("ping: warning\n") is None
    assert wrapper_cpu_seconds(f"{CPU_MARK}\n0m 0.01s 0m 0.02s\n0m 1.50s 0m 0.25s\n") == pytest.approx(1.75)  # busybox
    assert wrapper_cpu_seconds(f"{CPU_MARK}\n0m0.01s 0m0.02s\n") is None  # cut short


# ------------------------------------------------------------------ a trial's instruments


class Here(RunsCommands):
    """A node whose commands run on this machine, as the lab's namespaces' do."""

    def __init__(self, name: str, wrapped: bool = False) -> None:
        self.name, self.registry = name, Registry()
        self.timed_by_wrapper = wrapped
        # the wrapper ends its command when its input closes: a pipe held open, as a container's exec's
        self.stdin_of_started = subprocess.PIPE if wrapped else subprocess.DEVNULL

    def command(self, argv, pin=True, timed=False):
        if self.timed_by_wrapper:
            return ["sh", "-c", exec_wrapper("", "here"), "vnb-exec", *(["-t"] if timed else []), *argv]
        return list(argv)


def _scenario(probe_tool: str = "ping"):
    workloads = {"stream": SimpleNamespace(tool="iperf3"), "probe": SimpleNamespace(tool=probe_tool)}
    return SimpleNamespace(workload=workloads, phases=lambda: [("stream", ["probe"])])


def _trial(tmp_path: Path, wrapped: bool) -> TrialContext:
    trial = tmp_path / "run" / "p0-r0"
    trial.mkdir(parents=True)
    node = Here("s1", wrapped)
    return TrialContext(config=SimpleNamespace(scenario=_scenario()), endpoints=TrialEndpoints(node, [node]),
                        ip_version=4, tmp=trial, t0=time.time())


@pytest.mark.parametrize("wrapped", [False, True], ids=["reaped here", "through the wrapper"])
def test_an_instruments_cpu_inside_the_window_is_counted_and_the_leaders_is_not(tmp_path, monkeypatch, wrapped):
    ctx = _trial(tmp_path, wrapped)
    monkeypatch.setattr("vnetbench.runner.bench.registry.of",
                        lambda options: SimpleNamespace(instrument=options.tool == "ping"))
    node = ctx.endpoints.receiver
    leader, probe = Started("stream"), Started("probe")
    leader.procs["s1"], _ = ctx.popen(node, "s1", BUSY)
    probe.procs["s1"], _ = ctx.popen(node, "s1", BUSY)
    for p in (*leader.procs.values(), *probe.procs.values()):
        wait_metered(p, timeout=60)
    started, ended = probe.procs["s1"].started_at, probe.procs["s1"].ended_at
    raw: dict = {}
    runs = [("stream", leader), ("probe", probe)]
    # A window that holds the probe's whole life: all of its CPU, over the window's length.
    window = (started - 1.0, ended + 1.0)
    pct = instruments_cpu(ctx, runs, window, ended, raw)
    cpu = ctx.cpu_seconds(probe.procs["s1"])
    assert cpu is not None and BUSY_S - 0.02 <= cpu < BUSY_S + 0.5
    assert pct == pytest.approx(100 * cpu / (window[1] - window[0]))
    assert set(raw["process_cpu_pct"]) == {"stream/s1", "probe/s1"}
    assert raw["instruments_cpu_pct"] == {node.name: pytest.approx(pct, abs=0.01)}  # by the endpoint it ran on
    # The window's second half of the probe's life: half of it.
    half = instruments_cpu(ctx, runs, ((started + ended) / 2, ended + 1.0), ended, {})
    assert half == pytest.approx(100 * cpu / 2 / (ended + 1.0 - (started + ended) / 2))
    # No instrument ran: nothing to say.
    monkeypatch.setattr("vnetbench.runner.bench.registry.of", lambda options: SimpleNamespace(instrument=False))
    assert instruments_cpu(ctx, runs, window, ended, {}) is None


def test_an_instrument_whose_cpu_is_not_known_leaves_the_trials_cost_whole(tmp_path, monkeypatch):
    ctx = _trial(tmp_path, wrapped=False)
    monkeypatch.setattr("vnetbench.runner.bench.registry.of", lambda options: SimpleNamespace(instrument=True))
    probe = Started("probe")
    probe.procs["s1"], _ = ctx.popen(ctx.endpoints.receiver, "s1", ["true"])
    probe.procs["s1"].wait(timeout=30)  # reaped without its rusage
    assert instruments_cpu(ctx, [("stream", Started("stream")), ("probe", probe)], (0, time.time()), time.time(),
                           {}) is None


def test_the_trials_cpu_cost_is_counted_without_its_instruments():
    stat = iter([
        "cpu0 0 0 0 1000 0 0 0 0\ncpu1 0 0 0 1000 0 0 0 0\n",
        # over 10 s (1000 ticks a CPU): cpu0 busy all along (80 user, 20 system), cpu1 a quarter in softirq
        "cpu0 800 0 200 1000 0 0 0 0\ncpu1 0 0 0 1750 0 0 250 0\n",
    ])
    recorder = CpuRecorder("here", read=lambda: next(stat), interval=3600, processes=None)
    recorder.start(10)
    recorder.stop()
    t0 = recorder.samples[0][0]
    recorder.samples = [(t0, recorder.samples[0][1]), (t0 + 10, recorder.samples[1][1])]
    m = Measurement()
    m.add("throughput.rx_mbps", 8.192)  # 1000 KB/s
    m.add("cpu.probe_pct", 90.0)  # a spinning ping's
    raw: dict = {}
    recorder.collect(m, raw, (t0, t0 + 10))
    assert raw["cpu"]["busy_pct"] == pytest.approx(125.0)
    assert m.value("cpu.util_pct") == pytest.approx(35.0)
    assert m.value("cpu.us_per_kb") == pytest.approx(350.0)  # 0.35 s of CPU a second over 1000 KB
    assert m.value("cpu.softirq_pct") == pytest.approx(25.0)


# ------------------------------------------------------------------ the hosts' machines, sampled there


def _stamped(t: float, busy_ticks: int, idle_ticks: int, cut: bool = False) -> str:
    text = f"vnb-t {t:.6f}\ncpu {busy_ticks} 0 0 {idle_ticks} 0 0 0 0\ncpu0 {busy_ticks} 0 0 {idle_ticks} 0 0 0 0\n"
    return text if cut else text + "intr 1 2\nsoftirq 5 0 0\n"


def test_a_hosts_samples_are_put_on_the_controllers_clock_and_a_cut_one_is_left_out():
    from vnetbench.runner.recorders import parse_stamped_stats

    text = _stamped(1002.0, 10, 90) + _stamped(1003.0, 60, 140) + _stamped(1004.0, 99, 999, cut=True)
    samples = parse_stamped_stats(text, offset_s=2.0)  # the host's clock 2 s ahead
    assert [t for t, _ in samples] == [1000.0, 1001.0]
    assert samples[1][1]["cpu0"][:4] == (60, 0, 0, 140)


def _recorder(machines: dict[str, str], senders=("s1",)):
    from vnetbench.runner.recorders import MachinesCpuRecorder

    nodes = {n: Here(n) for n in ("r", *senders)}
    return MachinesCpuRecorder(nodes["r"], [nodes[s] for s in senders], machines, Path("/nonexistent"))


def _give(rec, machine: str, busy_per_s: int, own_cpu_s: float = 0.0) -> None:
    """A machine of one CPU busy `busy_per_s` ticks of 100 a second over [1000, 1002]; its sampler used
    `own_cpu_s` over the same span."""
    rec.samples[machine] = [(1000.0 + t, {"cpu0": (busy_per_s * t, 0, 0, (100 - busy_per_s) * t, 0, 0, 0, 0)})
                            for t in (0, 1, 2)]
    proc = SimpleNamespace(started_at=1000.0, ended_at=1002.0, cpu_s=own_cpu_s)
    rec._procs[machine] = (proc, Path("/nonexistent.out"), Path("/nonexistent.err"))


def test_the_receivers_and_the_senders_machines_are_measured_apart_less_the_samplers_own():
    rec = _recorder({"r": "boot-a", "s1": "boot-b"})
    _give(rec, "boot-a", 40, own_cpu_s=0.1)  # 40 % busy, 5 % of it the sampler
    _give(rec, "boot-b", 70)
    m, raw = Measurement(), {"instruments_cpu_pct": {"s1": 20.0}}  # a ping on the sender used 20 % of a core
    m.add("throughput.rx_mbps", 100.0)
    m.add("cpu.probe_pct", 20.0)
    rec.collect(m, raw, (1000.0, 1002.0))
    got = {s.metric: s.value for s in m.samples}
    assert got["cpu.rx_util_pct"] == pytest.approx(35) and got["cpu.tx_util_pct"] == pytest.approx(50)
    assert got["cpu.util_pct"] == pytest.approx(85)  # the instruments taken out once, where they ran
    assert raw["cpu"]["machines"]["r"]["sampler_pct"] == pytest.approx(5)
    assert raw["cpu"]["machines"]["s1"]["instruments_pct"] == pytest.approx(20)
    assert raw["cpu"]["machines"]["s1"]["hosts"] == ["s1"]


def test_hosts_of_one_machine_are_counted_once_and_not_split():
    rec = _recorder({"r": "boot-a", "s1": "boot-a", "s2": "boot-a"}, senders=("s1", "s2"))
    assert list(rec.sampled_by) == ["boot-a"] and rec.hosts["boot-a"] == ["r", "s1", "s2"]
    _give(rec, "boot-a", 50)
    m, raw = Measurement(), {}
    rec.collect(m, raw, (1000.0, 1002.0))
    got = {s.metric: s.value for s in m.samples}
    assert got["cpu.util_pct"] == pytest.approx(50) and "cpu.rx_util_pct" not in got
    assert list(raw["cpu"]["machines"]) == ["r+s1+s2"]


def _a_busy_core(rec) -> tuple[float, float]:
    """A child busy for 2 CPU seconds while `rec` samples, then `rec` stopped half a second later: the child's
    span on this clock."""
    t0 = time.time()
    busy = subprocess.run([sys.executable, "-c", "import time\nwhile time.process_time() < 2.0: pass"])
    t1 = time.time()
    time.sleep(0.5)
    rec.stop()
    assert busy.returncode == 0
    return t0, t1


def test_the_sampler_loop_reads_this_machines_cpus_through_the_wrapper(tmp_path):
    """The loop itself, as a host runs it (through the exec wrapper, stopped by closing its input): a child
    busy for a known CPU time shows up as that much of a core, and the loop says its own time."""
    from vnetbench.runner.recorders import MachinesCpuRecorder

    node = Here("r", wrapped=True)
    rec = MachinesCpuRecorder(node, [Here("s1", wrapped=True)], {"r": "m", "s1": "m"}, tmp_path)
    assert rec.sampled_by == {"m": node}  # one machine, this one: sampled through the receiver's node
    rec.start(2.0)
    time.sleep(0.5)
    t0, t1 = _a_busy_core(rec)
    m, raw = Measurement(), {}
    # judged inside the busy span by more than a sample's interval, so that no sample around an edge is idle
    inset = 0.25
    assert recorders.REMOTE_SAMPLE_S < inset
    rec.collect(m, raw, (t0 + inset, t1 - inset))
    machine = raw["cpu"]["machines"]["r+s1"]
    assert machine["samples"] >= 10
    # one core busy for the whole window (the interpreter's start included), whatever else this machine does
    # beside it; the loop's own forks a few percent of a core
    assert 90 <= machine["busy_pct"] <= 200, machine
    assert 0 < machine["sampler_pct"] < 20, machine


class InPod(Here):
    """A node whose shell is busybox's, as a pod of the tools image runs commands (its `sh` and `read -t`)."""

    def __init__(self, name: str, bin_dir: Path) -> None:
        super().__init__(name, wrapped=True)
        self.bin_dir = bin_dir
        self.offset_s = 0.0

    def command(self, argv, pin=True, timed=False):
        import os
        return ["env", f"PATH={self.bin_dir}:{os.environ['PATH']}", *super().command(argv, pin, timed)]


@pytest.mark.skipif(not Path("/bin/busybox").exists(), reason="/bin/busybox is missing")
def test_a_nodes_cpu_is_sampled_in_a_pod_by_busybox_and_put_on_this_clock_by_its_uptime(tmp_path):
    """The node loop as a pod runs it (busybox's shell, through the exec wrapper): the pod's uptime against this
    machine's clock (within half the shortest round trip, and /proc/uptime's 10 ms), its samples stamped by
    uptime land on this clock, five a second, and a child busy for a known CPU time is seen as a core."""
    import os

    from vnetbench.runner.hosts_bench import UPTIME_CLOCK, clock_offset
    from vnetbench.runner.recorders import UPTIME_SAMPLE_S, NodesCpuRecorder

    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "sh").symlink_to("/bin/busybox")
    node = InPod("r", tmp_path / "bin")
    clock = clock_offset(node, samples=4, clock=UPTIME_CLOCK)
    expected = time.clock_gettime(time.CLOCK_BOOTTIME) - time.time()  # /proc/uptime counts boot time
    assert abs(clock["offset_ms"] / 1e3 - expected) <= clock["uncertainty_ms"] / 1e3 + 0.011, (clock, expected)
    node.offset_s = clock["offset_ms"] / 1e3
    rec = NodesCpuRecorder(node, [InPod("s1", tmp_path / "bin")], {"r": "boot", "s1": "boot"}, tmp_path)
    started = time.time()
    rec.start(2.0)
    assert time.time() - started < 5  # it waited for the first sample, which came
    t0, t1 = _a_busy_core(rec)
    samples = rec.samples["boot"]
    stamps = [t for t, _ in samples]
    assert started - 0.05 <= stamps[0] <= t0 + 0.05 and stamps[-1] <= time.time() + 0.05, (started, stamps)
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    assert UPTIME_SAMPLE_S - 0.02 <= sorted(gaps)[len(gaps) // 2] <= UPTIME_SAMPLE_S + 0.1, gaps
    assert set(samples[0][1]) == {f"cpu{i}" for i in range(os.cpu_count())}
    m, raw = Measurement(), {}
    inset = 0.25
    rec.collect(m, raw, (t0 + inset, t1 - inset))
    machine = raw["cpu"]["machines"]["r+s1"]
    assert 90 <= machine["busy_pct"] <= 200, machine
    assert 0 <= machine["sampler_pct"] < 10, machine  # it forks only at its start
    assert raw["cpu"]["where"] == "the pods' nodes" and 90 <= values(m)["cpu.util_pct"] <= 200
