"""The workloads issue's built-in scenarios, in a short form, in every environment this machine provides.

Each runs through the CLI as a user would (`--set` shortens it): every trial
succeeds, every configuration measured its tool's metrics, and what the path
costs comes out in the order physics puts it (a guest's software-emulated NIC
adds to a request/response round trip; a container's NAT and bridge add less).
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers import cli, run_id_of
from vnetbench.lab import environments
from vnetbench.lab.environments import Variant
from vnetbench.store.db import Store

pytestmark = [pytest.mark.lab, pytest.mark.slow]


def _envs() -> list[str]:
    envs = ['{env="bare"}', '{env="container"}']
    if not environments.problems([Variant("vm", nic="virtio-net")]):
        envs.append('{env="vm",nic="virtio-net"}')
    return envs


def _run(tmp_path, scenario: str, *sets: str) -> tuple[Store, str, dict]:
    db = tmp_path / "r.db"
    args = [a for s in sets for a in ("--set", s)]
    proc = cli("run", scenario, "--db", str(db), "--no-progress", "--set", "repetitions=1",
               "--set", "repeat.warmup=false", *args, timeout=900)
    store = Store(db)
    run_id = run_id_of(proc)
    trials = store.trials(run_id)
    assert trials and all(t["status"] == "ok" for t in trials), [t["reason"] for t in trials if t["status"] != "ok"]
    labels = {c["key"]: c["labels"] for c in store.configurations(run_id)}
    values = {tuple(sorted((k, str(v)) for k, v in labels[key].items())): {m: float(np.median(v))
                                                                            for m, v in per.items()}
              for key, per in store.values(run_id).items()}
    return store, run_id, values


def _env_of(key: tuple) -> str:
    d = dict(key)
    return d["env"] + (f"-{d['nic']}" if "nic" in d else "")


def test_latency_rr_short(tmp_path, no_leftovers):
    envs = _envs()
    store, _, values = _run(tmp_path, "latency-rr", f"env=[{','.join(envs)}]", "proto=[tcp,udp]", "payload=[64]",
                            "duration=1s")
    assert len(values) == len(envs) * 2
    by_env = {}
    for key, got in values.items():
        assert {"rr.p50_us", "rr.p99_us", "rr.transactions_per_s"} <= set(got), key
        assert got["rr.p50_us"] <= got["rr.p99_us"]
        by_env.setdefault(_env_of(key), []).append(got["rr.p50_us"])
    bare = max(by_env["bare"])
    # a guest's NIC emulated in software costs more than a bridge and NAT in the kernel
    if "vm-virtio-net" in by_env:
        assert min(by_env["vm-virtio-net"]) > bare
    store.close()


def test_web_workers_short(tmp_path, no_leftovers):
    envs = _envs()
    store, _, values = _run(tmp_path, "web-workers", f"env=[{','.join(envs)}]", "offload=[on]",
                            'clients=[{connections=1,threads=1},{connections=4,threads=4}]', "duration=1s")
    assert len(values) == len(envs) * 2
    for key, got in values.items():
        assert got["http.requests_per_s"] > 0 and got["http.errors"] == 0 and got["http.timeouts"] == 0, key
    store.close()


def test_overlay_latency_short_measures_rr_and_the_voice_stream(tmp_path, no_leftovers):
    store, run_id, values = _run(tmp_path, "overlay-latency", "delay=[0ms,5ms]",
                                 'load=[{proto="udp",offered="1Mbit"}]', "duration=1s", "workload.stream.omit=0s",
                                 'env=[{env="bare"},{env="overlay",overlay="vxlan"}]')
    assert len(values) == 4
    for key, got in values.items():
        d = dict(key)
        delay_ms = 5.0 if d["delay"] == "5ms" else 0.0
        # the voice stream and the RR test each cross the delayed link twice per round trip
        assert got["irtt.rtt_p50_ms"] >= 2 * delay_ms and got["rr.p50_us"] >= 2 * delay_ms * 1e3, key
        assert got["irtt.loss_ratio"] == 0 and "irtt.jitter_rfc3550_ms" in got
    store.close()


def test_tcp_over_vxlan_crosses_the_emulated_link(tmp_path, no_leftovers):
    # The overlay's TCP leaves the hosts as VXLAN-tunnelled 64 KB frames, which the link emulator cannot take
    # whole: the ends that feed it segment them in the kernel (lab.splice.KERNEL_SEGMENTS). A 5 ms link with no
    # rate limit carries hundreds of Mbit/s of it; a path that drops those frames carries under 1 Mbit/s.
    store, _, values = _run(tmp_path, "overlay-latency", "delay=[5ms]", 'load=[{proto="tcp",parallel=1}]',
                            "duration=2s", "workload.stream.omit=0s", 'env=[{env="overlay",overlay="vxlan"}]')
    (got,) = values.values()
    assert got["throughput.rx_mbps"] > 100, got
    store.close()


def test_congestion_with_its_optional_tcp_crr(tmp_path, no_leftovers):
    # Over-subscribed TCP fills the bottleneck's queue (tens of ms): a connect crosses it once (the SYN; the
    # answer comes back unshaped), as ping's echo request does; a whole transaction crosses it twice (the SYN,
    # then the request), so it takes about two of ping's round trips.
    store, _, values = _run(tmp_path, "congestion", "workload.crr.enabled=true", "ratios=[1.4]", "protos=[tcp]",
                            "duration=3s", "workload.stream.omit=1s")
    (got,) = values.values()
    assert got["ab.requests_per_s"] > 0 and got["ab.failed_requests"] == 0 and got["throughput.rx_mbps"] > 50
    rtt = got["rtt.p50_ms"]
    assert rtt > 5, got  # the queue is there
    # ab gives connect times in whole ms: +-0.5 ms of rounding
    assert 0.6 * rtt - 0.5 <= got["ab.connect_p50_ms"] <= 1.4 * rtt + 0.5, got
    assert 1.4 * rtt <= got["ab.latency_p50_ms"] <= 2.6 * rtt, got
    store.close()


def test_docker_vs_kvm_short(tmp_path, no_leftovers):
    envs = _envs()
    tests = ['{workloads="cpu"}', '{workloads="mem"}', '{workloads="stream",proto="tcp"}',
             '{workloads="stream",proto="udp",offered="10Mbit"}', '{workloads="web",concurrency=50}']
    store, _, values = _run(tmp_path, "docker-vs-kvm", f"env=[{','.join(envs)}]", f"test=[{','.join(tests)}]",
                            "duration=1s", "workload.stream.omit=0s", "workload.mem.size=16MiB",
                            "workload.mem.loops=2")
    assert len(values) == len(envs) * len(tests)
    for key, got in values.items():
        d = dict(key)
        if d["workloads"] == "cpu":
            assert got["cpu.events_per_s"] > 0 and got["memory.write_mib_per_s"] > 0, key
        elif d["workloads"] == "mem":
            assert got["memory.mbw_memcpy_mib_per_s"] > 0, key
        elif d["workloads"] == "web":
            # the seed's clients: a new connection per request, none failed
            assert got["ab.requests_per_s"] > 0 and got["ab.failed_requests"] == 0, key
        elif d.get("proto") == "udp" and d["env"] != "vm":
            assert got["throughput.rx_mbps"] > 9 and got["udp.loss_ratio"] < 0.05, key
        else:  # TCP anywhere; UDP in a guest emulated in software (TCG) loses packets when the host is busy
            assert got["throughput.rx_mbps"] > 1, key
    store.close()
