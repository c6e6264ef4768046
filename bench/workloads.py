"""Per workload tool: what a trial costs beyond the seconds it measures, and the latency floor of bare veth.

Run as root:  .venv/bin/python bench/workloads.py [--trials 4] [--seconds 2]

One bare lab (a receiver and a sender on a switch, no shaping) and, for each
tool, the same trial slot a run executes (starting its clients, waiting,
parsing, committing samples and series to SQLite), `--trials` times:

1. overhead = wall time of the slot - the time the tool itself takes (its
   warm-up and measured seconds, as its driver's `timing` says: sockperf's
   fixed 2 s pause before it starts timing is the tool's, not vnetbench's)
   (target: under 0.3 s, as for iperf3); its median and maximum;
2. the round-trip floor each latency tool measures on the same veth path, side
   by side in this run: ping (ICMP), sockperf ping-pong (UDP and TCP) and irtt
   (UDP), medians of their per-trial medians, in microseconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from vnetbench.runner.bench import DumbbellBench  # noqa: E402
from vnetbench.scenario import load, plan  # noqa: E402
from vnetbench.store.db import Store, TrialRecord  # noqa: E402
from vnetbench.workloads import registry  # noqa: E402

TARGET_S = 0.3


WORKLOADS = {
    # name: (workload table, the floor metric and its scale to microseconds, or None)
    "iperf3 tcp": ('tool = "iperf3"\nproto = "tcp"\nomit = "0s"\nduration = "{s}s"', None),
    "ping 10ms": ('tool = "ping"\ninterval = "10ms"\nsize = 56\nduration = "{s}s"', ("rtt.p50_ms", 1e3)),
    "sockperf udp": ('tool = "sockperf"\nproto = "udp"\npayload = 64\nduration = "{s}s"', ("rr.p50_us", 1.0)),
    "sockperf tcp": ('tool = "sockperf"\nproto = "tcp"\npayload = 64\nduration = "{s}s"', ("rr.p50_us", 1.0)),
    "irtt 10ms": ('tool = "irtt"\ninterval = "10ms"\nlength = 60\nduration = "{s}s"', ("irtt.rtt_p50_ms", 1e3)),
    "wrk 1 conn": ('tool = "wrk"\nconnections = 1\nfile_size = "1KiB"\nduration = "{s}s"', ("http.latency_p50_ms", 1e3)),
    "ab 1 client, CRR": ('tool = "ab"\nconcurrency = 1\nfile_size = "1KiB"\nduration = "{s}s"',
                         ("ab.latency_p50_ms", 1e3)),
    "sysbench cpu": ('tool = "sysbench"\ntests = ["cpu"]\nduration = "{s}s"', None),
}


def local_bench(configs: list) -> DumbbellBench:
    return DumbbellBench.for_configs(f"vnb-bw{os.getpid() % 10000}", configs)


def measure(name: str, table: str, seconds: int, trials: int,
            make_bench: Callable[[list], DumbbellBench] = local_bench) -> tuple[list[float], list[float]]:
    """(overhead of each trial, its latency floor) for one tool on the bench `make_bench` gives (the lab's)."""
    text = (f'name = "bench-workloads"\n[lab]\nsenders = 1\nbottleneck = "unlimited"\n[repeat]\nwarmup = false\n'
            f'[workload.w]\n{table.format(s=seconds)}\n')
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.toml"
        path.write_text(text)
        configs = plan.expand(load.load(str(path)))
        config = configs[0]
        bench = make_bench(configs)
        store = Store(Path(tmp) / "b.db")
        store.create_run("bench", "w", "bench", text, "h", [], 1, {})
        store.add_configuration("bench", config.key, config.labels, config.params(), config.expected)
        # what the tool itself takes: its warm-up (sockperf's fixed 2 s pause included) and measured time
        options = config.scenario.workload["w"]
        asked = sum(registry.of(options).timing(options, config))
        overheads, floors = [], []
        bench.setup()
        try:
            for i in range(trials + 1):  # the first is a warm-up, as a run's
                t0 = time.perf_counter()
                bench.prepare(config)
                outcome = bench.run_trial(config, f"t{i}")
                store.record_trial("bench", TrialRecord(config.key, i, i, outcome.started, outcome.ended,
                                                        outcome.status, outcome.reason, outcome.raw,
                                                        outcome.measurement.samples, outcome.measurement.series))
                wall = time.perf_counter() - t0
                if outcome.status != "ok":
                    raise RuntimeError(f"{name}: {outcome.reason}")
                if i == 0:
                    continue
                overheads.append(wall - asked)
                metric = WORKLOADS[name][1]
                if metric:
                    value = next(s.value for s in outcome.measurement.samples if s.metric == metric[0])
                    floors.append(value * metric[1])
        finally:
            bench.teardown()
            store.close()
        return overheads, floors


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=4)
    ap.add_argument("--seconds", type=int, default=2)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench/workloads.py builds namespaces: run it as root", file=sys.stderr)
        return 2
    print(f"per tool: {args.trials} trials of {args.seconds} s on bare veth (load average "
          f"{os.getloadavg()[0]:.2f})")
    print(f"{'tool':<14} {'overhead median':>16} {'max':>7} {'target':>7}  {'RTT floor p50 (us)':>19}")
    ok = True
    for name, (table, _metric) in WORKLOADS.items():
        over, floors = measure(name, table, args.seconds, args.trials)
        med = statistics.median(over)
        ok &= med < TARGET_S
        floor = f"{statistics.median(floors):>19.1f}" if floors else f"{'-':>19}"
        print(f"{name:<14} {med:>15.3f}s {max(over):>6.3f}s {TARGET_S:>6.1f}s  {floor}   "
              f"{'ok' if med < TARGET_S else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
