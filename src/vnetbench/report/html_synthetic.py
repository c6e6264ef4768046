"""Synthetic runs for the report's tests, benchmark and demos, written through the Store API.

The numbers follow the physics the built-in ``congestion`` scenario measures
(seed 001, chapter 4), with seeded noise: a bottleneck of ``bottleneck_mbps``
with a drop-tail buffer of ``buffer_ms``; UDP delivers min(ratio, 1) of the
bottleneck and loses 1 - 1/ratio above saturation; TCP fills the link; the
ping RTT sits near the base RTT below saturation and near the full-buffer
delay above it. Labels other than ``ratio`` and ``proto`` shift the numbers a
little (``env=container`` costs 7% throughput, a ``delay`` label adds twice
its value to the RTT) so comparisons have something to find.

Nothing here is statistics; it only makes data.
"""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

import numpy as np

from vnetbench import units
from vnetbench.metrics import METRICS
from vnetbench.scenario.plan import config_key
from vnetbench.store.db import SampleRecord, SeriesRecord, Store, TrialRecord


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(str(v))


def scenario_text(name: str, description: str, matrix: dict[str, list[Any]], duration_s: float,
                  ping_interval_s: float, repetitions: int, bottleneck_mbps: float, buffer_ms: float) -> str:
    lines = [f"name = {_toml_value(name)}", f"description = {_toml_value(description)}", "", "[lab]",
             'topology = "dumbbell"', 'senders = "auto"', f'bottleneck = "{bottleneck_mbps:g}Mbit"',
             f'buffer = "{buffer_ms:g}ms"', 'qdisc = "tbf"', "", "[matrix]"]
    for k, vals in matrix.items():
        key = k if k.replace("_", "").isalnum() else json.dumps(k)
        lines.append(f"{key} = {_toml_value(vals)}")
    lines += ["", "[workload.stream]", 'tool = "iperf3"', f'duration = "{duration_s:g}s"', 'omit = "1s"',
              'offered = "ratio * bottleneck / senders"', "", "[workload.probe]", 'tool = "ping"',
              f'interval = "{ping_interval_s * 1e3:g}ms"', "size = 1450", 'during = "stream"', "", "[repeat]",
              f"repetitions = {repetitions}", "seed = 1"]
    return "\n".join(lines) + "\n"


def _delay_ms(labels: dict[str, Any]) -> float:
    v = labels.get("delay")
    if v is None:
        return 0.0
    try:
        return units.parse_duration(v) * 1e3 if isinstance(v, str) else float(v)
    except (units.UnitError, ValueError):
        return 0.0


def make_run(store: Store, run_id: str, *, matrix: dict[str, list[Any]] | None = None, repetitions: int = 5,
             duration_s: float = 10.0, ping_interval_s: float = 0.01, seed: int = 0, name: str = "congestion",
             description: str = "Synthetic over-subscribed bottleneck: UDP loss, queueing delay, TCP sharing",
             bottleneck_mbps: float = 100.0, buffer_ms: float = 40.0, scale: dict[str, float] | None = None,
             fail_every: int = 0, fingerprint: dict[str, Any] | None = None, series: bool = True,
             lab_state: bool = True) -> str:
    """Write one synthetic run; returns its id.

    ``scale`` multiplies metrics of every trial (e.g. ``{"throughput.rx_mbps": 0.9}``
    for a run 10% slower); ``fail_every=k`` makes every k-th trial fail.
    """
    matrix = matrix if matrix is not None else {"ratio": [0.4, 0.8, 1.0, 1.2, 2.0, 4.0], "proto": ["udp", "tcp"]}
    scale = scale or {}
    rng = np.random.default_rng(seed)
    text = scenario_text(name, description, matrix, duration_s, ping_interval_s, repetitions, bottleneck_mbps,
                         buffer_ms)
    fp = {
        "kernel": "6.12.48-amd64", "kernel_version": "#1 SMP PREEMPT_DYNAMIC Debian 6.12.48-1", "machine": "x86_64",
        "hostname": "lab1", "cpu_model": "Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz", "cpus": 16,
        "memory_bytes": 67_108_864_000, "python": "3.11.2", "vnetbench_version": "0.1.0",
        "vnetbench_git": "0123456789ab", "tools": {"iperf3": "iperf 3.12", "ping": "ping from iputils 20240905"},
        "sysctls": {"net.core.default_qdisc": "fq_codel", "net.ipv4.tcp_congestion_control": "cubic",
                    "net.ipv4.tcp_rmem": "4096\t131072\t6291456"},
    }
    fp.update(fingerprint or {})
    store.create_run(run_id, name, "builtin:congestion" if name == "congestion" else f"{name}.toml", text,
                     f"{abs(hash(text)) & 0xFFFFFFFFFFFF:012x}", [], seed, fp)
    axes = list(matrix.items())
    configs = []
    b_bps = bottleneck_mbps * 1e6
    buffer_bytes = buffer_ms * 1e-3 * b_bps / 8
    full_ms = buffer_bytes * 8 / b_bps * 1e3
    for values in itertools.product(*(v for _, v in axes)):
        labels = dict(zip((k for k, _ in axes), values))
        ratio = float(labels.get("ratio", 1.0))
        proto = str(labels.get("proto", "tcp"))
        senders = 2 if ratio <= 2 else (3 if ratio <= 3 else 4)
        expected = {"throughput.offered_mbps": ratio * bottleneck_mbps,
                    "throughput.rx_mbps": min(ratio, 1.0) * bottleneck_mbps,
                    "queue.full_delay_ms": full_ms}
        if proto == "udp":
            expected["udp.loss_ratio"] = max(0.0, 1 - 1 / ratio)
        params = {"topology": "dumbbell", "bottleneck_bps": b_bps, "buffer_bytes": buffer_bytes, "qdisc": "tbf",
                  "shape": "forward", "ip_version": 4, "mtu": 1500, "senders": senders, "proto": proto,
                  "ratio": ratio, "offered_bps_per_sender": ratio * b_bps / senders, "duration_s": duration_s}
        key = config_key(labels)
        store.add_configuration(run_id, key, labels, params, expected)
        if lab_state:
            store.set_lab_state(run_id, key, {"qdiscs": [
                {"netns": f"vnb-{run_id[:6]}-sw", "dev": "sw-r", "kind": "tbf", "handle": "1:", "parent": "root",
                 "rate_bps": b_bps, "limit_bytes": int(buffer_bytes), "burst_bytes": 15140,
                 "drops": int(rng.integers(0, 5000))}]})
        configs.append((key, labels, ratio, proto, senders))

    slots = [(c, r) for r in range(repetitions) for c in configs]
    order = rng.permutation(len(slots))
    t0 = time.time() - len(slots) * (duration_s + 2)
    for position, i in enumerate(order):
        (key, labels, ratio, proto, senders), rep = slots[i]
        started = t0 + position * (duration_s + 2)
        failed = fail_every and (position + 1) % fail_every == 0
        if failed:
            status = "timeout" if (position // fail_every) % 2 else "failed"
            reason = ("iperf3 on s2 did not finish within 35 s (timeout)" if status == "timeout" else
                      "iperf3 on s1 exited 1: unable to connect to server: Connection refused")
            store.record_trial(run_id, TrialRecord(key, rep, position, started, started + duration_s, status, reason,
                                                   {"stream": {"s1": "iperf3: error"}}, [], []))
            continue
        samples, ser = _trial_numbers(rng, labels, ratio, proto, senders, bottleneck_mbps, full_ms, duration_s,
                                      ping_interval_s, scale, series)
        store.record_trial(run_id, TrialRecord(key, rep, position, started, started + duration_s + 1, "ok", None,
                                               {"stream": {}}, samples, ser))
    store.finish_run(run_id, "completed")
    return run_id


def _trial_numbers(rng: np.random.Generator, labels: dict[str, Any], ratio: float, proto: str, senders: int,
                   b: float, full_ms: float, duration: float, ping_interval: float, scale: dict[str, float],
                   with_series: bool) -> tuple[list[SampleRecord], list[SeriesRecord]]:
    env_factor = 0.93 if str(labels.get("env", "bare")) not in ("bare", "None") else 1.0
    base_rtt = 0.08 + 2 * _delay_ms(labels) + (0.05 if env_factor < 1 else 0.0)
    offered = ratio * b
    m: dict[str, float] = {"throughput.offered_mbps": offered}
    saturated = ratio > 1.0
    if proto == "udp":
        rx = min(offered, b) * env_factor * (1 - abs(rng.normal(0, 0.004)))
        if ratio >= 0.8 and not saturated:
            rx *= 1 - abs(rng.normal(0.01, 0.005))  # iperf3's bursts overflow the queue a little
        m["throughput.tx_mbps"] = offered * (1 + rng.normal(0, 0.002))
        m["throughput.rx_mbps"] = rx
        loss = max(0.0, 1 - rx / m["throughput.tx_mbps"])
        m["udp.loss_ratio"] = loss
        sent = m["throughput.tx_mbps"] * 1e6 * duration / (1470 * 8)
        m["udp.sent_packets"] = round(sent)
        m["udp.lost_packets"] = round(sent * loss)
        m["udp.jitter_rfc3550_ms"] = abs(rng.normal(0.02 if not saturated else 0.2, 0.01))
        if saturated:
            queue = full_ms * (1 - abs(rng.normal(0, 0.01)))
        else:
            queue = full_ms * max(0.0, ratio - 0.75) * rng.uniform(0.5, 1.5)
    else:
        rx = min(offered, b * 0.957) * env_factor * (1 + rng.normal(0, 0.006))
        m["throughput.tx_mbps"] = rx * (1 + abs(rng.normal(0.002, 0.001)))
        m["throughput.rx_mbps"] = rx
        m["tcp.retransmits"] = round(abs(rng.normal(120 * ratio if saturated else 2, 20)))
        queue = full_ms * rng.uniform(0.6, 0.95) if saturated else rng.uniform(0.0, 2.0)
        m["tcp.mean_srtt_ms"] = base_rtt + queue * rng.uniform(0.9, 1.1) + 0.2
    shares = rng.dirichlet(np.full(senders, 60.0))
    m["flows.jain_fairness"] = float(shares.sum() ** 2 / (senders * (shares ** 2).sum()))

    n_ping = max(10, int((duration - 1.5) / ping_interval))
    rtt = base_rtt + queue * np.clip(rng.normal(1.0, 0.25, n_ping), 0, None) + rng.exponential(0.03, n_ping)
    spikes = rng.random(n_ping) < 0.002
    rtt[spikes] += rng.uniform(1, 6, spikes.sum())
    m["rtt.min_ms"] = float(rtt.min())
    m["rtt.avg_ms"] = float(rtt.mean())
    m["rtt.max_ms"] = float(rtt.max())
    m["rtt.stdev_ms"] = float(rtt.std())
    for q, name in ((50, "rtt.p50_ms"), (90, "rtt.p90_ms"), (99, "rtt.p99_ms"), (99.9, "rtt.p999_ms")):
        m[name] = float(np.percentile(rtt, q))
    m["rtt.ipdv_ms"] = float(np.abs(np.diff(rtt)).mean())
    m["rtt.loss_ratio"] = float(max(0.0, rng.normal(0.01 if saturated and proto == "udp" else 0.0, 0.002)))
    for k, f in scale.items():
        if k in m:
            m[k] *= f
    samples = [SampleRecord(k, float(v), METRICS[k].unit, METRICS[k].direction) for k, v in m.items()]
    ser: list[SeriesRecord] = []
    if with_series:
        secs = np.arange(1, int(duration) + 1, dtype=float)
        per_flow = m["throughput.rx_mbps"] * shares
        for i in range(senders):
            host = f"s{i + 1}"
            v = per_flow[i] * (1 + rng.normal(0, 0.04, secs.size))
            ser.append(SeriesRecord(f"throughput_mbps/{host}", "Mbit/s", secs, np.clip(v, 0, None)))
            if proto == "tcp":
                cwnd = 20_000 + (full_ms * b * 125 / senders) * np.abs(np.sin(secs / 3 + i)) * rng.uniform(0.8, 1.2)
                ser.append(SeriesRecord(f"cwnd_bytes/{host}", "bytes", secs, cwnd))
                ser.append(SeriesRecord(f"srtt_ms/{host}", "ms", secs,
                                        m["tcp.mean_srtt_ms"] * (1 + rng.normal(0, 0.05, secs.size))))
        t = 1.0 + np.arange(n_ping) * ping_interval
        ser.append(SeriesRecord("rtt_ms", "ms", t, rtt))
    return samples, ser
