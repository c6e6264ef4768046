"""The congestion study on a real lab: numbers must obey the physics of a
drop-tail bottleneck (seed 001, chapter 4), with the foundation issue's own
tolerances: UDP loss within 0.05 of 1 - 1/ratio at ratios 2 and 4, ping RTT
under UDP saturation within 15% of buffer / rate, TCP at ratio 2 filling at
least 90% of the bottleneck, received throughput never above 1.05 x the rate.

Defaults: 100 Mbit/s bottleneck, 500 kB buffer -> a full queue delays by 40 ms.

Three trials per configuration, judged by their median as `vnetbench show`
does: on this 2-core VM a single trial can find the link idling for moments
(one CI trial carried 88% of the rate where runs carry 93-95%), and one such
trial must not decide a physics check.
"""

import numpy as np
import pytest

from vnetbench.store.db import Store
from helpers import cli, run_id_of

pytestmark = pytest.mark.lab

BOTTLENECK_MBPS = 100.0
QUEUE_MS = 500_000 * 8 / 100e6 * 1e3  # 40 ms


@pytest.fixture(scope="module")
def congestion_run(tmp_path_factory):
    db = tmp_path_factory.mktemp("congestion") / "r.db"
    proc = cli("run", "congestion", "--db", str(db), "--no-progress",
               "--set", "ratios=[0.6, 2.0, 4.0]", "--set", "duration=3s", "--set", "workload.stream.omit=1s",
               "--set", "repetitions=3", "--set", "repeat.warmup=false",
               # the 1 ms ping probe's timer: on a kernel without a cpuidle driver a halting core wakes it late
               # (3.5 Mbit/s of probe where the thesis' 1 ms interval sends 11)
               "--set", "lab.idle_cores=poll")
    run_id = run_id_of(proc)
    store = Store(db)
    by_labels = {}
    for c in store.configurations(run_id):
        by_labels[(c["labels"]["ratio"], c["labels"]["proto"])] = (c, store.values(run_id).get(c["key"], {}))
    yield store, run_id, by_labels, proc
    store.close()


def median(values, metric):
    return float(np.median(values[metric]))


def test_every_trial_ok_and_table_printed(congestion_run, no_leftovers):
    store, run_id, by_labels, proc = congestion_run
    trials = store.trials(run_id)
    assert len(trials) == 18 and all(t["status"] == "ok" for t in trials), [t["reason"] for t in trials]
    assert "throughput" in proc.stdout and "theory" in proc.stdout and "0.500" in proc.stdout
    assert store.run(run_id)["status"] == "completed"


def test_received_throughput_never_above_the_bottleneck(congestion_run):
    _, _, by_labels, _ = congestion_run
    for (ratio, proto), (_, values) in by_labels.items():
        assert values["throughput.rx_mbps"].max() <= BOTTLENECK_MBPS * 1.05, (ratio, proto)


def test_udp_loss_follows_one_minus_one_over_ratio(congestion_run):
    _, _, by_labels, _ = congestion_run
    assert median(by_labels[(0.6, "udp")][1], "udp.loss_ratio") < 0.01
    for ratio in (2.0, 4.0):
        # The 1450 B / 1 ms ping probe shares the link, so the loss sits 0.02-0.04 above the theory here.
        assert median(by_labels[(ratio, "udp")][1], "udp.loss_ratio") == pytest.approx(1 - 1 / ratio, abs=0.05)
    # The theory is stored alongside for reports.
    assert by_labels[(4.0, "udp")][0]["expected"]["udp.loss_ratio"] == pytest.approx(0.75)


def test_rtt_under_udp_saturation_is_buffer_over_rate(congestion_run):
    _, _, by_labels, _ = congestion_run
    for ratio in (2.0, 4.0):
        assert median(by_labels[(ratio, "udp")][1], "rtt.p50_ms") == pytest.approx(QUEUE_MS, rel=0.15), ratio
    # Below saturation the queue stays (nearly) empty.
    assert median(by_labels[(0.6, "udp")][1], "rtt.p50_ms") < 0.1 * QUEUE_MS


def test_tcp_fills_the_bottleneck_when_oversubscribed(congestion_run):
    store, run_id, by_labels, _ = congestion_run
    config, values = by_labels[(2.0, "tcp")]
    # TCP never lets the link starve: cubic backs off by 30% from a full buffer, so a standing queue
    # of 70-100% of it remains (p50 30-35 ms seen); half the buffer is the floor.
    assert median(values, "rtt.p50_ms") >= 0.5 * QUEUE_MS
    # So the link is full: at least 90% of it carries TCP and the 1 ms ping probe (1450 B + 42 B of
    # headers per packet, its delivered packets counted), which share the bottleneck as in the thesis
    # (measured here: 88.5 Mbit/s of TCP goodput + 11 Mbit/s of probe).
    fills = []
    for trial in (t for t in store.trials(run_id) if t["config_key"] == config["key"]):
        rtt = next(s for s in store.series(trial["id"]) if s.name == "rtt_ms")
        fills.append(len(rtt.v) * (1450 + 8 + 20 + 14) * 8 / (rtt.t.max() - rtt.t.min()) / 1e6)
    probe_mbps = float(np.median(fills))
    assert median(values, "throughput.rx_mbps") + probe_mbps >= 0.9 * BOTTLENECK_MBPS
    # Below saturation TCP gets exactly what it asked for (2 x 30 Mbit/s).
    assert median(by_labels[(0.6, "tcp")][1], "throughput.rx_mbps") == pytest.approx(60, rel=0.03)


def test_applied_qdisc_is_read_back_and_stored(congestion_run):
    store, run_id, by_labels, _ = congestion_run
    state = by_labels[(2.0, "udp")][0]["lab_state"]["qdiscs"]
    tbf = [q for q in state if q["kind"] == "tbf"]
    assert len(tbf) == 1 and tbf[0]["dev"] == "r" and tbf[0]["netns"].endswith("-sw")
    assert tbf[0]["rate_bps"] == pytest.approx(100e6) and tbf[0]["limit_bytes"] == 500_000
    fp = store.run(run_id)["fingerprint"]
    assert fp["kernel"] and "iperf" in fp["tools"]["iperf3"] and "net.ipv4.tcp_congestion_control" in fp["sysctls"]
    params = by_labels[(2.0, "tcp")][0]["params"]
    assert params["congestion_control"] == "cubic" and params["senders"] == 2
    # What the senders' kernel ran, as iperf3 reported it, is kept with each TCP trial.
    tcp_keys = {c["key"] for (_, proto), (c, _) in by_labels.items() if proto == "tcp"}
    used = [t["raw"]["congestion_control_used"] for t in store.trials(run_id, with_raw=True)
            if t["config_key"] in tcp_keys]
    assert len(used) == 9 and all(set(u.values()) == {"cubic"} and len(u) >= 2 for u in used), used


def test_series_are_stored(congestion_run):
    store, run_id, by_labels, _ = congestion_run
    key = by_labels[(2.0, "tcp")][0]["key"]
    trial = next(t for t in store.trials(run_id) if t["config_key"] == key)
    names = {s.name for s in store.series(trial["id"])}
    assert {"rtt_ms", "throughput_mbps/s1", "throughput_mbps/s2", "cwnd_bytes/s1", "srtt_ms/s1"} <= names
    rtt = next(s for s in store.series(trial["id"]) if s.name == "rtt_ms")
    # Replies from the end of the 1 s omit period on. ping is asked for one every 1 ms, but iputils sends
    # every 2 ms here with no queue and every 4 ms behind this 40 ms one (measured: 968-983 and 456-514 replies
    # in the 2 s window): at least 100 a second says the series is every reply, not a summary.
    assert len(rtt.v) >= 200 and rtt.t.min() >= 0.9


def test_export_one_record_per_sample(congestion_run, tmp_path):
    store, run_id, _, _ = congestion_run
    out = tmp_path / "x.csv"
    cli("export", run_id, "--db", str(store.path), "--format", "csv", "-o", str(out))
    lines = out.read_text().splitlines()
    n_samples = sum(len(v) for per in store.values(run_id).values() for v in per.values())
    assert len(lines) == n_samples + 1
    assert lines[0].startswith("run_id,config_key,labels,trial_id,repetition,metric,value,unit,direction")
    assert "label.proto" in lines[0] and "label.ratio" in lines[0]
