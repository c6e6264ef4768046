"""Does the order of configurations change what they measure? Each built-in, trimmed, run twice on the same
machine: once interleaved (every trial changes the lab's state: links, backends, offloads, environments) and
once sequential (each configuration's repetitions in a row: one change per configuration), then
`vnetbench compare SEQUENTIAL INTERLEAVED` over the headline metrics: a configuration that improved or
regressed between the two measured what its neighbours left.

Run as root:  .venv/bin/python bench/order.py [--only quick,latency-rr] [--repetitions 6]

Prints per built-in: configurations, trials failed, and compare's verdicts (regressed / improved / unchanged /
inconclusive); exits 1 when a configuration changed. Issue 35's acceptance check; a campaign of an hour or more
for every built-in on the 2-core VM (the trims below keep each run to minutes).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VNETBENCH = [sys.executable, "-m", "vnetbench"]

# Per built-in: the overrides that keep it to minutes here, every matrix axis kept.
TRIMS: dict[str, list[str]] = {
    "quick": [],
    "congestion": ["duration=3s", "workload.stream.omit=1s"],
    "latency-rr": ["duration=2s"],
    "overlay-latency": ["duration=2s", "workload.stream.omit=0s"],
    "engine-vs-model": ["duration=2s"],
    "web-workers": ["duration=2s"],
    "static-congestion": ["duration=2s", "omit=0s"],
    "dynamic-congestion": [],
    "docker-vs-kvm": ["duration=2s"],
    "virt-compare": ["duration=2s"],
}


def run(scenario: str, db: Path, overrides: list[str]) -> str:
    argv = [*VNETBENCH, "run", scenario, "--db", str(db), "--no-progress"]
    for o in overrides:
        argv += ["--set", o]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"vnetbench {' '.join(argv[3:])} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return proc.stdout.strip().splitlines()[-1].split()[1]


def verdicts(db: Path, a: str, b: str) -> tuple[dict[str, int], list[str]]:
    """compare's verdict counts for runs a (reference) and b, and a line per metric that changed."""
    proc = subprocess.run([*VNETBENCH, "compare", a, b, "--db", str(db), "--json"], capture_output=True, text=True,
                          cwd=ROOT)
    doc = json.loads(proc.stdout)
    changed = [f"{pair['config']} {r['metric']}: {r['verdict']} ({r['median_a']:.4g} -> {r['median_b']:.4g})"
               for pair in doc["configurations"] for r in pair["results"] if r["verdict"] in ("regressed", "improved")]
    return doc["counts"], changed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated built-ins (default: all)")
    # Fewer than 6 cannot find a change: compare judges the headline metrics together (Holm), and 4 trials a
    # side reach p = 0.029 at best, 0.14 over 5 metrics; 6 reach 0.0022, 0.011 over 5.
    ap.add_argument("--repetitions", type=int, default=6, help="per configuration (at least 6, see above)")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    if args.repetitions < 6:
        ap.error("--repetitions below 6 cannot find a change (4 trials a side reach p = 0.14 over 5 metrics)")
    names = args.only.split(",") if args.only else list(TRIMS)
    tmp = Path(tempfile.mkdtemp(prefix="vnb-order-"))
    failed = False
    for name in names:
        db = tmp / f"{name}.db"
        common = [*TRIMS[name], f"repetitions={args.repetitions}", f"repeat.seed={args.seed}"]
        interleaved = run(name, db, [*common, "repeat.order=interleaved"])
        sequential = run(name, db, [*common, "repeat.order=sequential"])
        counts, changed = verdicts(db, sequential, interleaved)
        status = subprocess.run([*VNETBENCH, "runs", "--db", str(db)], capture_output=True, text=True,
                                cwd=ROOT).stdout
        print(f"{name}: interleaved {interleaved} vs sequential {sequential}: {counts}")
        print("  " + "\n  ".join(line for line in status.splitlines() if interleaved in line or sequential in line))
        for c in changed:
            print(f"  CHANGED {c}")
        failed |= bool(changed)
    print(f"databases in {tmp}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
