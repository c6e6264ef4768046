"""Lab bring-up and teardown time, next to Mininet's, plus per-trial overhead.

Run as root:  .venv/bin/python bench/lab_setup.py [--sizes 2 32 128] [--repeat 3]

1. For N hosts on one switch (vnetbench: N namespaces with veth pairs into a
   bridge in a switch namespace, IPv4+IPv6 addressed; Mininet:
   `mn --topo single,N --switch lxbr --controller none --test none`), the
   median wall time of bring-up + teardown, measured side by side in this run.
   Mininet is measured only if `mn` is installed (Debian package `mininet`).
   A lab also measures what a CPU wake-up costs while it is up (lab/idle.py's
   wake probe, a fixed few tenths of a second that Mininet has no counterpart
   of): it is timed on its own in the same run, shown, and left out of the
   ratio and the target, which are the network's.
2. Shapes (``--shapes``): a star of N hosts on one switch (Mininet: ``--topo single,N``) and trees of
   about 10, 100 and 1,000 nodes (Mininet: ``--topo tree,depth=D,fanout=F``, switches), built from the
   topology graph (vnetbench.lab.graph_lab) and torn down; the same trees with routers (every host its own
   subnet, routes computed: Mininet has no such shape). Mininet's hosts get one IPv4 address each;
   vnetbench's get an IPv4 and an IPv6 address, and hosts behind routers their routes.
3. Per-trial overhead: wall time of a whole trial slot (re-shaping, starting
   the flows and the probe, waiting, parsing, committing to SQLite) minus the
   time the tools were asked to measure (omit + duration).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from vnetbench.lab import idle  # noqa: E402
from vnetbench.lab.graph_lab import build_graph  # noqa: E402
from vnetbench.lab.topology import build_dumbbell  # noqa: E402
from vnetbench.topology import templates  # noqa: E402
from vnetbench.runner.bench import DumbbellBench  # noqa: E402
from vnetbench.scenario import load, plan  # noqa: E402
from vnetbench.store.db import Store, TrialRecord  # noqa: E402

TARGETS = {2: 0.3, 32: 1.2, 128: 4.0}  # seconds, from the issue (Mininet here: 0.47, 1.62, 5.58)


def vnetbench_cycle(hosts: int) -> tuple[float, float]:
    """(bring-up + teardown without the wake-up probe, the probe's own time)."""
    probe = idle.probe_wake_up
    spent: list[float] = []

    def timed_probe(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return probe(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - t0)

    idle.probe_wake_up = timed_probe  # held() calls it by its module's name
    try:
        t0 = time.perf_counter()
        lab = build_dumbbell(f"vnb-bench{os.getpid() % 10000}", senders=hosts - 1)
        errors = lab.teardown()
        if errors:
            raise RuntimeError(errors)
        return time.perf_counter() - t0 - sum(spent), sum(spent)
    finally:
        idle.probe_wake_up = probe


def mininet_cycle(hosts: int) -> float | None:
    return mininet_topo_cycle(f"single,{hosts}")


# (label, vnetbench's graph, Mininet's --topo or None): about 10, 100 and 1,000 nodes of each shape
SHAPES = [
    ("star 10", lambda: templates.star(leaves=10, server=False), "single,10"),
    ("star 100", lambda: templates.star(leaves=100, server=False), "single,100"),
    ("star 1000", lambda: templates.star(leaves=1000, server=False), "single,1000"),
    ("tree 2x3", lambda: templates.tree(depth=2, fanout=3), "tree,depth=2,fanout=3"),
    ("tree 4x3", lambda: templates.tree(depth=4, fanout=3), "tree,depth=4,fanout=3"),
    ("tree 3x10", lambda: templates.tree(depth=3, fanout=10), "tree,depth=3,fanout=10"),
    ("routers 2x3", lambda: templates.tree(depth=2, fanout=3, node="router"), None),
    ("routers 4x3", lambda: templates.tree(depth=4, fanout=3, node="router"), None),
    ("routers 3x10", lambda: templates.tree(depth=3, fanout=10, node="router"), None),
]
SHAPE_TARGET_S = 10.0  # issue 31: a 1,000-node star or tree up and down in under 10 s, 5x faster than Mininet


def graph_cycle(make) -> tuple[int, float, float]:
    graph = make()
    t0 = time.perf_counter()
    lab = build_graph(f"vnb-bench{os.getpid() % 10000}", graph)
    up = time.perf_counter() - t0
    errors = lab.teardown()
    if errors:
        raise RuntimeError(errors)
    return len(graph.nodes) + len(graph.links), up, time.perf_counter() - t0


def mininet_topo_cycle(topo: str) -> float | None:
    if shutil.which("mn") is None:
        return None
    t0 = time.perf_counter()
    out = subprocess.run(["mn", "--topo", topo, "--switch", "lxbr", "--controller", "none", "--test", "none"],
                         capture_output=True, text=True, timeout=1800)
    elapsed = time.perf_counter() - t0
    if out.returncode != 0:
        print(f"  mininet failed: {out.stderr.strip()[-200:]}", file=sys.stderr)
        subprocess.run(["mn", "-c"], capture_output=True)
        return None
    return elapsed


def shapes(repeat: int) -> bool:
    print("\nshapes: bring-up + teardown, median of", repeat, "(seconds); per element = per node or link")
    print(f"{'shape':>13} {'elements':>8} {'up':>7} {'up+down':>8} {'ms/elem':>8} {'mininet':>8} {'ratio':>7}  verdict")
    all_ok = True
    for label, make, topo in SHAPES:
        runs = [graph_cycle(make) for _ in range(repeat)]
        elements = runs[0][0]
        up = statistics.median(r[1] for r in runs)
        cycle = statistics.median(r[2] for r in runs)
        theirs_ok = [t for t in (mininet_topo_cycle(topo) for _ in range(repeat)) if t is not None] if topo else []
        theirs = statistics.median(theirs_ok) if theirs_ok else None
        ratio = theirs / cycle if theirs else None
        ok = cycle < SHAPE_TARGET_S and (ratio is None or ratio >= 5)
        all_ok &= ok
        print(f"{label:>13} {elements:>8} {up:>7.2f} {cycle:>8.2f} {1000 * cycle / elements:>8.2f} "
              f"{theirs if theirs is not None else float('nan'):>8.2f} "
              f"{f'{ratio:6.1f}x' if ratio else '    n/a':>7}  {'ok' if ok else 'MISSED'}")
    return all_ok


def trial_overhead(trials: int) -> list[float]:
    loaded = load.load("quick", ["ratios=[0.6]", "protos=[udp,tcp]", "duration=1s", "workload.stream.omit=0s"])
    configs = plan.expand(loaded)
    bench = DumbbellBench(f"vnb-bo{os.getpid() % 10000}", senders=2)
    overheads = []
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "b.db")
        store.create_run("bench", "quick", "bench", "", "h", [], 1, {})
        for c in configs:
            store.add_configuration("bench", c.key, c.labels, c.params(), c.expected)
        bench.setup()
        try:
            for i in range(trials):
                config = configs[i % len(configs)]  # alternate: re-shaping is part of the cost
                t0 = time.perf_counter()
                bench.prepare(config)
                outcome = bench.run_trial(config, f"t{i}")
                store.record_trial("bench", TrialRecord(config.key, i, i, outcome.started, outcome.ended,
                                                        outcome.status, outcome.reason, outcome.raw,
                                                        outcome.measurement.samples, outcome.measurement.series))
                wall = time.perf_counter() - t0
                if outcome.status != "ok":
                    raise RuntimeError(outcome.reason)
                overheads.append(wall - (config.stream.omit + config.stream.duration))
        finally:
            bench.teardown()
            store.close()
    return overheads


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[2, 32, 128])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--shapes", action="store_true", help="only the shapes' bring-up, beside Mininet's")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench/lab_setup.py builds namespaces: run it as root", file=sys.stderr)
        return 2
    if args.shapes:
        return 0 if shapes(args.repeat) else 1
    print("bring-up + teardown, median of", args.repeat, "(seconds; vnetbench's without its wake-up probe, "
          "shown apart)")
    print(f"{'hosts':>6} {'vnetbench':>10} {'probe':>7} {'mininet':>9} {'ratio':>7} {'target':>7}  verdict")
    all_ok = True
    for n in args.sizes:
        cycles = [vnetbench_cycle(n) for _ in range(args.repeat)]
        ours = statistics.median(c[0] for c in cycles)
        probe = statistics.median(c[1] for c in cycles)
        theirs_runs = [mininet_cycle(n) for _ in range(args.repeat)]
        theirs_ok = [t for t in theirs_runs if t is not None]
        theirs = statistics.median(theirs_ok) if theirs_ok else None
        ratio = f"{theirs / ours:6.1f}x" if theirs else "    n/a"
        target = TARGETS.get(n)
        ok = (target is None or ours < target) and (theirs is None or ours < theirs)
        all_ok &= ok
        print(f"{n:>6} {ours:>10.3f} {probe:>7.3f} {theirs if theirs is not None else float('nan'):>9.3f} {ratio:>7} "
              f"{target if target else float('nan'):>7.2f}  {'ok' if ok else 'MISSED'}")
    over = trial_overhead(args.trials)
    med = statistics.median(over)
    print(f"\nper-trial overhead (wall - omit - duration) over {len(over)} trials: median {med:.3f} s, "
          f"max {max(over):.3f} s; target < 0.5 s: {'ok' if med < 0.5 else 'MISSED'}")
    return 0 if all_ok and med < 0.5 else 1


if __name__ == "__main__":
    sys.exit(main())
