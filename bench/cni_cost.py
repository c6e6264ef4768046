"""What the test cluster's pod network costs: the built-in `cni-cost` on each of its two backends, side by side.

Run as root, after `make kube`:  .venv/bin/python bench/cni_cost.py [--repetitions 6] [--db FILE]
                                     [--backends vxlan,host-gw]

Starts the tests' Kubernetes cluster (tests/kubecluster.py: one control plane and two nodes on this machine),
runs `vnetbench run cni-cost --kube` once with pod traffic between the nodes carried by flannel's VXLAN
backend, once by its host-gw backend (routes through the nodes' own addresses, nothing encapsulated, the
pods' MTU the fabric's 1500 instead of 1450), and prints the medians of every configuration of both runs in
one table, then `vnetbench compare` of the two (the facts that differ: the encapsulation and the MTUs). The
runs stay in the database (a temporary one, printed, unless --db names one) for `show`, `compare` and
`report`.

Every node is a network namespace on one kernel: what the pod network costs here is veth, bridge, VXLAN and
the Service proxy's rules in CPU, not a real fabric's. The numbers say what vnetbench reads on a cluster, not
what a CNI costs on yours; run `vnetbench run cni-cost --kube` there for that.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

import kubecluster  # noqa: E402
from vnetbench.store.db import Store  # noqa: E402

# (metric, heading, scale): what the table shows of each configuration, as medians of its trials
COLUMNS = [
    ("throughput.rx_mbps", "TCP Gbit/s", 1e-3),
    ("rr.p50_us", "RR p50 us", 1.0),
    ("rr.p99_us", "RR p99 us", 1.0),
    ("irtt.rtt_p50_ms", "voice p50 us", 1e3),
    ("irtt.jitter_rfc3550_ms", "jitter us", 1e3),
    ("cpu.us_per_kb", "us/KB", 1.0),
]
AXES = ("kube.network", "kube.placement", "kube.path")


def vnetbench(k8s: kubecluster.KubeCluster, *args: str) -> subprocess.CompletedProcess:
    """vnetbench ARGS in the control plane's network, where the API is; its output passed through."""
    proc = subprocess.run([*k8s.enter(), sys.executable, "-W", "ignore", "-m", "vnetbench", *args],
                          capture_output=True, text=True, cwd=ROOT)
    sys.stderr.write(proc.stderr[-4000:] if proc.returncode else "")
    return proc


def run_once(k8s: kubecluster.KubeCluster, db: str, repetitions: int) -> str:
    proc = vnetbench(k8s, "run", "cni-cost", "--kube", "--kubeconfig", str(k8s.kubeconfig), "--db", db,
                     "--no-progress", "--set", f"repetitions={repetitions}")
    if proc.returncode:
        raise SystemExit(f"cni-cost on the {k8s.backend} backend exited {proc.returncode}:\n{proc.stdout[-3000:]}")
    return next(line.split()[-1] for line in reversed(proc.stdout.splitlines()) if line.startswith("run:"))


def rows(db: str, run_id: str) -> dict[tuple[str, ...], dict[str, float]]:
    """Per configuration (its network, placement and path): each column's median over the run's trials."""
    with Store(db) as store:
        values = store.values(run_id)
        out = {}
        for config in store.configurations(run_id):
            key = tuple(str(config["labels"].get(axis, "")) for axis in AXES)
            got = values.get(config["key"], {})
            out[key] = {metric: statistics.median(got[metric]) * scale
                        for metric, _, scale in COLUMNS if len(got.get(metric, ()))}
        return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repetitions", type=int, default=6, help="trials of each configuration (the built-in's 6)")
    ap.add_argument("--db", help="results database (default: a temporary one, printed)")
    ap.add_argument("--backends", default="vxlan,host-gw",
                    help=f"the cluster's backends to run on, in order (of {', '.join(kubecluster.BACKENDS)})")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("run as root: the cluster is made of network namespaces", file=sys.stderr)
        return 2
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = [b for b in backends if b not in kubecluster.BACKENDS]
    if unknown or not backends:
        print(f"--backends {args.backends!r}: the test cluster offers {', '.join(kubecluster.BACKENDS)}",
              file=sys.stderr)
        return 2
    why = kubecluster.missing()
    if why:
        print(f"no test cluster: {why}", file=sys.stderr)
        return 2
    db = args.db or str(Path(tempfile.mkdtemp(prefix="vnb-cni-cost-")) / "cni-cost.db")
    runs: dict[str, str] = {}
    with kubecluster.cluster(backend=backends[0]) as k8s:
        for backend in backends:
            with k8s.using_backend(backend):
                runs[backend] = run_once(k8s, db, args.repetitions)
                print(f"{backend}: run {runs[backend]}", flush=True)
        tables = {backend: rows(db, run_id) for backend, run_id in runs.items()}
        print(f"\ncni-cost on the test cluster, medians of {args.repetitions} trials ({db})")
        heading = ["backend", "network", "placement", "path"] + [h for _, h, _ in COLUMNS]
        print("  ".join(f"{h:>12}" for h in heading))
        for backend, table in tables.items():
            for key in sorted(table):
                cells = [f"{table[key][m]:12.2f}" if m in table[key] else f"{'-':>12}" for m, _, _ in COLUMNS]
                print("  ".join([f"{backend:>12}", *(f"{k:>12}" for k in key), *cells]))
        print()
        for backend, run_id in runs.items():
            print(f"$ vnetbench compare {run_id} --by kube.network --ref host   ({backend})")
            print(vnetbench(k8s, "compare", run_id, "--by", "kube.network", "--ref", "host", "--db", db).stdout)
        if len(runs) == 2:
            a, b = runs.values()
            print(f"$ vnetbench compare {a} {b}   ({' against '.join(runs)})")
            print(vnetbench(k8s, "compare", a, b, "--db", db).stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
