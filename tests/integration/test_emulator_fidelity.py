"""Link emulation on a real lab: the userspace emulator (vnb-link) against
issue 5's targets, with tolerances wide enough for a shared 2-core CI machine
and tight enough to catch a 1 ms timer granularity or a missing delay; an
emulator killed mid-trial; and the two built-in scenarios, run as a user would.

Physics behind the tolerances: 10 ms each way is an RTT of 20 ms (a 1 ms
release granularity would move the median by ~0.5 ms and the p99 by ~1 ms);
a full drop-tail buffer delays by buffer / rate (one packet = 121 us at
100 Mbit/s); Bernoulli loss has a binomial spread; a 50 Mbit/s link carries
at most rate x 1448/1514 of TCP payload; TCP cannot exceed window / RTT
(seed 001, equation 4.4).
"""

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from helpers import ROOT, cli, run_id_of
from vnetbench.impair import fidelity as F
from vnetbench.impair.backends import find_binary
from vnetbench.impair.model import LinkSpec
from vnetbench.lab import netns
from vnetbench.lab.clean import leftovers
from vnetbench.store.db import Store

pytestmark = [pytest.mark.lab, pytest.mark.skipif(find_binary() is None, reason="vnb-link not built: make setup")]


# Leftovers are judged by each lab's own prefix: other sessions may run labs on this machine meanwhile.


@pytest.fixture(scope="module")
def lab():
    with F.FidelityLab(settings=F.Settings.quick()) as lab:
        yield lab
    assert not leftovers(lab.prefix + "-"), "the fidelity lab left namespaces behind"


def test_fixed_delay_rtt(lab):
    # Up to three attempts: the machine's other work can stretch a tail once; a granularity or a
    # missing delay shows in every attempt. When other work held the emulator's core (schedstat:
    # runnable but waiting) in every attempt, the tail measures the machine, not the emulator: skip,
    # saying so. The median is asserted regardless.
    attempts = []
    for _ in range(3):
        median_check, p99_check = F.check_delay(lab, "userspace")
        median, p99 = median_check.values["median_ms"], p99_check.values["p99_ms"]
        attempts.append((median, p99, p99_check.values["emulator_waiting"]))
        if abs(median - 20) <= 0.5 and p99 <= 22:
            break
    assert median == pytest.approx(20, abs=0.5)
    if p99 > 22 and all((w or 0) > 0.05 for _, _, w in attempts):
        pytest.skip("RTT p99 beyond 22 ms while other work held the emulator's core: "
                    + "; ".join(f"p99 {p:.1f} ms, waiting {w:.0%}" for _, p, w in attempts))
    assert p99 <= 22, f"RTT p99 {p99:.2f} ms (median {median:.2f}); attempts (median, p99, waiting): {attempts}"


def test_rate_50mbit_tcp_goodput(lab):
    c = F.check_rate(lab, "userspace", 50e6, 0.95)
    assert c.values["fraction"] >= 0.95, c.achieved
    assert c.values["goodput_bps"] <= 50e6 * 1448 / 1514 * 1.01  # and never above the rate


def test_offloaded_frames_count_as_their_segments(lab):
    """The endpoints keep their offloads (a veth sends with TSO): vnb-link forwards 64 KB frames whole, and its
    rate, its buffer limit in packets and its counters see their segments. At 100 Mbit/s with no buffer size,
    the buffer is vnb-link's default 1000 packets: 1000 x 1514 B = 121 ms at the rate. Were a 64 KB frame one
    packet, it would hold 5 s, and the flow's RTT with it."""
    lab.set_offload(True)
    backend = lab.use("userspace", LinkSpec.model_validate({"forward": {"rate": 100e6}, "both": {"delay": "10ms"}}))
    goodput = lab.tcp(lab.settings.iperf_s)
    forward = backend.emulator.stats()["stats"]["a_to_b"]
    assert forward["offloaded_frames"] > 100, forward
    assert forward["rx_bytes"] / forward["rx_packets"] <= 1514, forward
    assert goodput >= 0.9 * 100e6 * F.TCP_EFFICIENCY and goodput <= 100e6 * F.TCP_EFFICIENCY * 1.01
    full_ms, packet_ms = 1000 * 1514 * 8 / 100e6 * 1e3, 1514 * 8 / 100e6 * 1e3
    assert full_ms / 2 <= forward["max_queue_delay_us"] / 1e3 <= full_ms + packet_ms, forward


def _received_rps() -> list[int]:
    """Per CPU, how many times other cores handed it receive work (RPS): /proc/net/softnet_stat's 10th column."""
    return [int(line.split()[9], 16) for line in open("/proc/net/softnet_stat")]


def test_the_hosts_cores_take_the_reverse_directions_receive(lab):
    """The end the emulator's reverse direction arrives at (the switch end of the receiver's link: the ACKs on
    their way to the sender) hands its receive to the hosts' core (RPS), so the sender's TCP and the next segments
    it sends run there, not on the emulator's core; the other end does not. The kernel counts each hand-off on the
    core that takes it. Only while the endpoints' offloads are off. Taken off the link, the steering goes with the
    switch end and the host end is as before."""
    from vnetbench.lab.splice import read_rps, reverse_end

    if lab.emu_cpu is None:
        pytest.skip("one core: the emulator shares it with the hosts, nothing to steer")
    hosts = [c for c in sorted(os.sched_getaffinity(0)) if c != lab.emu_cpu]
    lab.set_offload(False)
    backend = lab.use("userspace", LinkSpec.model_validate({"both": {"delay": "1ms"}}))
    splice = backend.splice
    assert reverse_end(splice) is splice.switch_end  # the receiver's link: the reverse direction goes to the switch
    mask = int(read_rps(splice.switch_end).replace(",", ""), 16)
    assert mask == sum(1 << c for c in hosts) and int(read_rps(splice.host_end).replace(",", ""), 16) == 0
    assert backend.record()["receive_cpus"] == backend.receive_steering and backend.receive_steering
    before = _received_rps()
    goodput = lab.tcp(2)
    handed = [after - b for after, b in zip(_received_rps(), before)]
    # Thousands of ACKs per second arrive at the switch end; the emulator sends them in batches of up to 64, and
    # each batch hands its ACKs over with at least one hand-off: far more than 100 in 2 s at any goodput above
    # 100 Mbit/s (4 ACKs per ms at one ACK per two 1448-byte segments).
    assert goodput > 100e6 and sum(handed[c] for c in hosts) > 100, (goodput, handed)
    assert handed[lab.emu_cpu] <= sum(handed[c] for c in hosts) / 10, handed
    # With the offloads on, 64 KB frames have few ACKs and the hand-off costs more than it saves: the steering
    # goes while they are on (the record says so), and comes back when they are off again.
    lab.set_offload(True)
    assert int(read_rps(splice.switch_end).replace(",", ""), 16) == 0 and backend.record()["receive_cpus"] is None
    lab.set_offload(False)
    assert int(read_rps(splice.switch_end).replace(",", ""), 16) == mask == sum(1 << c for c in hosts)
    assert backend.record()["receive_cpus"] == backend.receive_steering
    lab.use("tbf", LinkSpec())
    assert int(read_rps(lab.link.host_end).replace(",", ""), 16) == 0
    lab.set_offload(True)


def test_queue_delay_is_buffer_over_rate_and_no_early_drop(lab):
    checks = {c.target: c for c in F.check_queue(lab, "userspace")}
    target_ms, packet_ms = 8.0, 1514 * 8 / 100e6 * 1e3
    emu = checks["max queueing delay = buffer / rate (emulator)"].values["max_ms"]
    assert emu == pytest.approx(target_ms, abs=packet_ms)
    ping_p50 = checks["queue delay of a full drop-tail buffer (ping)"].values["median_ms"]
    # seen from outside, by probes in the full queue
    assert ping_p50 == pytest.approx(target_ms, abs=0.6), checks["queue delay of a full drop-tail buffer (ping)"].values
    burst = checks["no drop before the buffer is full (bursts)"].values
    assert burst["lost_small"] == 0 and burst["accepted_bytes"] >= 100_000 - 1514


def test_loss_ratio_and_same_seed_same_pattern(lab):
    ratio, pattern = F.check_loss(lab, "userspace", p=0.02)
    assert abs(ratio.values["z"]) <= 3, ratio.achieved
    assert pattern.values["same"] and pattern.values["other_seed_differs"], pattern.achieved


def test_jitter_standard_deviation(lab):
    c = F.check_jitter(lab, "userspace", jitter_ms=2.0)
    assert abs(c.values["rel_error"]) <= 0.15, c.achieved


def test_schedule_rate_change_on_time(lab):
    # The emulator applies a step within microseconds of its time when it has its core. Other work on that core
    # takes it for whole scheduler slices: with one core kept busy, steps came 5.5-16 ms late in about one
    # attempt in four, with the old emulator as with this one. Lateness beyond 5 ms is the machine's only when
    # the emulator spent at least that long waiting for its core during the attempt (schedstat); then up to three
    # attempts, and a skip saying so. On an idle machine it never waits, and a late step fails.
    attempts = []
    for _ in range(3):
        c = F.check_schedule(lab, at_s=1.0)
        assert c.ok is not None and "lag_ms" in c.values, c.achieved
        lag, waited = c.values["lag_ms"], c.values["emulator_waited_ms"]
        attempts.append((round(lag, 2), waited))
        if abs(lag) <= 5.0:
            return
        assert lag > 0 and waited is not None and waited >= lag - 5.0, \
            f"rate change {lag:+.2f} ms from its time, the emulator waited {waited} ms for its core: {attempts}"
    pytest.skip("rate change more than 5 ms late in three attempts, each while other work held the emulator's "
                f"core at least that long (lag ms, emulator waited ms): {attempts}")


# ------------------------------------------------------------ a dying emulator

KILL_SCENARIO = """
name = "emulator-kill"
[lab]
senders = 1
bottleneck = "50Mbit"
buffer = "100kB"
delay = "5ms"
[workload.stream]
tool = "iperf3"
duration = "4s"
omit = "0s"
[repeat]
repetitions = 2
warmup = false
"""


def _iperf3_clients(ns: str) -> list[int]:
    out = []
    for pid in netns.pids(ns):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if cmd and cmd[0].endswith(b"iperf3") and b"--client" in cmd:
            out.append(pid)
    return out


def _all_vnb_link() -> list[int]:
    out = subprocess.run(["pgrep", "-x", "vnb-link"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_emulator_killed_mid_trial_fails_the_trial_and_leaves_nothing(tmp_path):
    scenario = tmp_path / "kill.toml"
    scenario.write_text(KILL_SCENARIO)
    db = tmp_path / "r.db"
    before = set(leftovers())
    proc = subprocess.Popen([sys.executable, "-m", "vnetbench", "run", "--no-calibration", str(scenario), "--db", str(db),
                             "--no-progress"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        emu_ns = sender_ns = None
        seen_emulators: set[int] = set()
        while time.monotonic() < deadline and not (emu_ns and sender_ns and _iperf3_clients(sender_ns)):
            names = [n for n in leftovers() if n not in before]
            emu_ns = next((n for n in names if n.endswith("-er")), None)
            sender_ns = next((n for n in names if n.endswith("-s1")), None)
            if emu_ns:
                seen_emulators.update(netns.pids(emu_ns))
            time.sleep(0.05)
        assert emu_ns and sender_ns, "the run's emulator and first trial never showed up"
        time.sleep(1.0)  # one second into the first trial
        victims = [p for p in netns.pids(emu_ns) if open(f"/proc/{p}/comm").read().strip() == "vnb-link"]
        assert len(victims) == 1
        t_kill = time.monotonic()
        subprocess.run(["kill", "-KILL", str(victims[0])], check=True)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    run_id = run_id_of(subprocess.CompletedProcess([], 0, out, err))
    store = Store(db)
    trials = sorted(store.trials(run_id), key=lambda t: t["position"])
    assert [t["status"] for t in trials] == ["failed", "ok"], [t["reason"] for t in trials]
    reason = trials[0]["reason"]
    assert "link emulator on link 'bottleneck'" in reason and "killed by SIGKILL" in reason
    assert trials[0]["ended"] - trials[0]["started"] < 4.0  # ended at the death, not at the timeout
    assert time.monotonic() - t_kill < 60
    assert store.run(run_id)["status"] == "completed"
    assert "1 of 2 trials failed" in out
    assert not leftovers(f"vnb-{run_id[:6]}-")
    for pid in victims + [p for p in _all_vnb_link() if p in seen_emulators]:
        assert not _alive(pid)


# --------------------------------------------------------- built-in scenarios


def _series(store, trial_id, prefix):
    return [s for s in store.series(trial_id) if s.name.startswith(prefix)]


def test_static_congestion_short_run_shows_the_bdp_limit(tmp_path):
    db = tmp_path / "r.db"
    report = tmp_path / "report.html"
    proc = cli("run", "static-congestion", "--db", str(db), "--no-progress", "--report", str(report),
               "--set", "duration=4s",
               "--set", "workload.stream.omit=1s", "--set", "repetitions=1", "--set", "repeat.warmup=false",
               "--set", "lengths=[16000]", "--set", "ip_versions=[4]", "--set", "protos=[tcp]", timeout=300)
    run_id = run_id_of(proc)
    store = Store(db)
    trials = store.trials(run_id)
    assert len(trials) == 9 and all(t["status"] == "ok" for t in trials), [t["reason"] for t in trials]
    rx = {}
    for c in store.configurations(run_id):
        assert c["lab_state"]["links"]["bottleneck"]["backend"] == "userspace"  # no netem on this kernel
        rx[(c["labels"]["delay"], c["labels"]["ratio"])] = float(np.median(store.values(run_id)[c["key"]]
                                                                           ["throughput.rx_mbps"]))
    bottleneck = {2: 500, 4: 250, 8: 125}
    for ratio, rate in bottleneck.items():
        # The window is no limit: TCP fills the bottleneck. At 500 Mbit/s sender, receiver and emulator share
        # two cores, and a busy CI box has been seen at 74%: 65% still tells a filled link from a capped one.
        for delay in ("0.3ms", "3ms"):
            assert rx[(delay, ratio)] >= 0.65 * rate, (delay, ratio, rx[(delay, ratio)])
        assert rx[("30ms", ratio)] <= 1.02 * rate
    # 30 ms: the window (400 kB socket buffers) caps TCP near window / RTT, far below a 500 Mbit/s bottleneck
    assert rx[("30ms", 2)] < 0.5 * 500 and rx[("30ms", 2)] < 0.6 * rx[("0.3ms", 2)]
    assert "delay" in proc.stdout and "bottleneck" in proc.stdout and "30ms" in proc.stdout
    # Nothing measured in the tests' state directory: the thesis' rates scaled to the fallback, and said so
    assert "line rate 1Gbit: the scenario's fallback" in proc.stderr
    assert store.run(run_id)["fingerprint"]["scale"].startswith("line rate 1Gbit")
    # The report plots throughput against the bottleneck ratio, one line per delay, with the theory.
    html = report.read_text()
    assert "Scaled: line rate 1Gbit" in html
    assert '<h2>Against ratio</h2>' in html and "throughput.rx_mbps against ratio" in html
    assert all(f"delay={d}" in html or f'"{d}"' in html for d in ("0.3ms", "3ms", "30ms"))
    assert not leftovers(f"vnb-{run_id[:6]}-")


def test_dynamic_congestion_series_follow_the_alternating_rate(tmp_path):
    db = tmp_path / "r.db"
    proc = cli("run", "dynamic-congestion", "--db", str(db), "--no-progress", "--set", "duration=10s",
               "--set", "bottleneck_schedule=100Mbit/2s 20Mbit/2s", "--set", "congestion_controls=[cubic]",
               "--set", "repetitions=1", "--set", 'workload.stream.flows=[{start="0s"}, {start="2.5s", duration="4s"}]',
               timeout=300)
    run_id = run_id_of(proc)
    store = Store(db)
    (trial,) = store.trials(run_id)
    assert trial["status"] == "ok", trial["reason"]
    srtt = _series(store, trial["id"], "ss.srtt_ms/s1:")[0]
    cwnd = _series(store, trial["id"], "ss.cwnd_segments/s1:")[0]
    rate = _series(store, trial["id"], "ss.delivery_rate_mbps/s1:")[0]
    assert len(srtt.t) > 200  # 20 ms sampling over ~9 s

    def phase(series, fast):
        # seconds [0.5, 2) of each 2 s phase: 100 Mbit/s in even phases, 20 Mbit/s in odd ones
        k = np.floor(series.t / 2.0)
        keep = ((series.t - 2.0 * k) >= 0.5) & (k % 2 == (0 if fast else 1)) & (series.t < 8.5)
        return float(np.nanmedian(series.v[keep]))

    # RTT: base 5 ms + the queue; 250 kB drain in 20 ms at 100 Mbit/s, in 100 ms at 20 Mbit/s
    assert phase(srtt, fast=False) > 2.5 * phase(srtt, fast=True)
    assert phase(rate, fast=True) > 2.0 * phase(rate, fast=False)
    # cwnd / RTT is the sending rate (seed 001, equation 4.4): it follows the bottleneck
    mss = 1448 * 8 / 1e6  # Mbit per segment
    est = srtt.__class__(name="x", unit="Mbit/s", t=srtt.t, v=cwnd.v * mss / (srtt.v / 1e3))
    assert phase(est, fast=True) > 2.0 * phase(est, fast=False)
    state = store.configurations(run_id)[0]["lab_state"]["links"]["bottleneck"]
    assert state["backend"] == "userspace" and "repeat: rate 100Mbit for 2s; rate 20Mbit for 2s" in state["schedule"]
    names = {s.name.split("/")[0] for s in store.series(trial["id"])}
    assert {"ss.cwnd_segments", "ss.srtt_ms", "ss.delivery_rate_mbps", "ss.retrans", "rtt_ms"} <= names
    # The second flow ended at 7.5 s (2.5 s start + 1 s omit + 4 s); from 8.5 s on, mid-way through a 100 Mbit/s
    # phase, the first flow alone keeps the queue standing (seed 001, figure 4.8). The window starts half a second
    # after the 20 -> 100 Mbit/s step on purpose: in the first ~0.1 s after the step up the queue is often empty.
    # queue.standing_ms is ping's 5th percentile over that window less the 5 ms base: recomputed here from the
    # stored RTT series, which checks where the window starts on the trial's clock and which base it takes.
    (standing,) = store.values(run_id)[store.configurations(run_id)[0]["key"]]["queue.standing_ms"]
    ping_rtt = _series(store, trial["id"], "rtt_ms")[0]
    queue = ping_rtt.v[ping_rtt.t >= 8.5] - 5.0
    assert standing == pytest.approx(max(0.0, float(np.percentile(queue, 5))), abs=1e-6)
    # The standing queue, seed 001's claim: CUBIC's window stays above the BDP (43 segments at 100 Mbit/s and 5 ms;
    # its least from 8.5 s on was 79-131 segments in 22 runs with a core kept busy), so the queue's median is at
    # least the ~4 ms the excess takes at 100 Mbit/s (0.116 ms a segment): 6.9-10.6 ms in those runs, 2 ms the
    # bound. Not the 5th percentile: that is the trough between the sender's bursts, which empties now
    # and then (2.6-6.9 ms in the same runs; one CI run measured 0.39 ms while ss's smoothed RTT never fell below
    # 4.7 ms of queue). At most the buffer: 250 kB drain in 20 ms. And no more than TCP's own smoothed RTT floor
    # over the same seconds (ss -ti, an independent instrument on the same queue) less the base, plus 1 ms:
    # ping's 5th percentile sat 1.4-3.3 ms below it.
    assert 2.0 <= float(np.median(queue)) <= 20.5, np.median(queue)
    srtt_floor = float(np.percentile(srtt.v[srtt.t >= 8.5], 5)) - 5.0
    assert standing <= srtt_floor + 1.0, (standing, srtt_floor)
    assert not leftovers(f"vnb-{run_id[:6]}-")


def _sweep_at_50mbit(tmp_path, matrix: str, lab: str = "") -> list[dict]:
    """A run over `matrix` (a TOML line) through a 50 Mbit/s bottleneck with a 100 kB buffer, two 2 s trials per
    configuration, interleaved: every trial ok, every configuration at the same rate (whatever realises it and
    however often the link changes between trials), and nothing left behind."""
    scenario = tmp_path / "sweep.toml"
    scenario.write_text(textwrap.dedent("""
        name = "sweep"
        [lab]
        senders = 1
        bottleneck = "50Mbit"
        buffer = "100kB"
        {lab}
        [matrix]
        {matrix}
        [workload.stream]
        tool = "iperf3"
        duration = "2s"
        omit = "0s"
        [repeat]
        repetitions = 2
        warmup = false
    """).format(lab=lab, matrix=matrix))
    db = tmp_path / "r.db"
    run_id = run_id_of(cli("run", str(scenario), "--db", str(db), "--no-progress", timeout=300))
    store = Store(db)
    trials = store.trials(run_id)
    configs = store.configurations(run_id)
    assert len(trials) == 2 * len(configs) and all(t["status"] == "ok" for t in trials), [t["reason"] for t in trials]
    # every trial in the order it ran, for a failure to tell a slow machine (any trial) from a link that a
    # change left wrong (the trials after one backend)
    labels = {c["key"]: c["labels"] for c in configs}
    ran = [(labels[r["config_key"]], round(r["value"], 1)) for r in store.conn.execute(
        "SELECT t.config_key, s.value FROM samples s JOIN trials t ON t.id = s.trial_id WHERE t.run_id = ? AND "
        "s.metric = 'throughput.rx_mbps' ORDER BY t.position", (run_id,))]
    ran.append(("marked by the machine's noise", store.marked_trials(run_id)))
    for c in configs:
        rx = float(np.median(store.values(run_id)[c["key"]]["throughput.rx_mbps"]))
        assert 0.85 * 50 * 1448 / 1514 <= rx <= 50 * 1.02, (c["labels"], rx, ran)
    assert not leftovers(f"vnb-{run_id[:6]}-")
    return configs  # as stored, with their labels and lab state


def test_an_offload_sweep_steers_the_hosts_receive_only_with_offloads_off(tmp_path):
    """A run that sweeps `offload` through the emulator: each configuration's record says where the hosts'
    receive of the reverse direction went, their own cores with offloads off, the kernel's choice with them on
    (interleaved: off, on, off, on, so the steering comes and goes between trials)."""
    from vnetbench.lab.splice import rps_mask

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("one core: the emulator shares it with the hosts, nothing to steer")
    configs = _sweep_at_50mbit(tmp_path, 'offload = ["off", "on"]', lab='backend = "userspace"')
    hosts_mask = rps_mask(cpus[:-1])  # every core but the emulator's (the last)
    for c in configs:
        steered = c["lab_state"]["links"]["bottleneck"]["receive_cpus"]
        assert steered == (hosts_mask if c["labels"]["offload"] == "off" else None), (c["labels"], steered)


def test_a_sweep_over_backends_moves_the_link_between_them(tmp_path):
    """tbf, the emulator and htb in turn on the same link: each records the backend and the qdiscs it
    installed (none for the emulator, spliced in and out between trials), at the same rate."""
    configs = _sweep_at_50mbit(tmp_path, 'backend = ["tbf", "userspace", "htb"]')
    for c in configs:
        backend = c["labels"]["backend"]
        state = c["lab_state"]
        assert state["links"]["bottleneck"]["backend"] == backend
        kinds = {q["kind"] for q in state["qdiscs"]}
        assert kinds == {"tbf": {"tbf"}, "htb": {"htb", "bfifo"}, "userspace": set()}[backend]
