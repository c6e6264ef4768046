"""Does the order of configurations change what they measure? Each built-in, trimmed, run four times on the
same machine, counterbalanced (A B B A: one order, the other twice, the first again). Interleaved, every trial
changes the lab's state (links, backends, offloads, environments); sequential, each configuration's repetitions
run in a row (one change per configuration). `vnetbench compare` judges, per configuration, the headline
metrics of:

- the four pairs of different orders (each A run against each B run): an order effect changes a metric the same
  way in all four;
- the two pairs of the same order (A1 vs A2, B1 vs B2), the controls: how many metrics two runs of identical
  settings call changed on this machine with nothing changed. That is the machine's own drift between runs,
  which the trials of one run do not show. On the 2-core VM, two latency-rr runs of one order disagreed on 9 and
  11 of 96 metrics, and one run can sit in another mode than the next (bare TCP 16 KiB RR: 20-25 us in one
  sequential run, 40-45 us in the other three), so fewer runs cannot tell order from drift.

A metric changed the same way in all four different-order pairs is an order effect; the script exits 1 when there
is one. A B B A puts both orders at the same mean position in time.

Run as root:  .venv/bin/python bench/order.py [--only quick,latency-rr] [--repetitions 6] [--first sequential]
              [--dockerd] [--podman] [--against REV] [--set KEY=VALUE ...]

--against REV asks the same of two versions instead of two orders: A is vnetbench as of git revision REV (a
worktree of it, made and removed here, with this checkout's emulator), B this checkout, both interleaved (or
--first), A B B A. A change of the lab's mechanism that must not change what it measures (issue 31's dumbbell
through the graph builder) is checked so: a metric changed the same way in all four pairs is the change's effect.
Each --set is added to every run's overrides: the trims below keep every axis (an order can matter on any), and a
version check can keep fewer (the environment-heavy built-ins take hours at 6 repetitions: virt-compare 577 trials
a run, docker-vs-kvm 217).

--dockerd and --podman start engines of the benchmark's own (tests/engine_daemon.py) for the four runs, so the
built-ins' docker and podman configurations (left out where no engine listens) are checked too.

Issue 35's acceptance check; several hours for every built-in on the 2-core VM (the trims below keep each run to
minutes).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VNETBENCH = [sys.executable, "-m", "vnetbench"]

# Per built-in: the overrides that keep it to minutes here, every matrix axis kept. (cni-cost runs on a
# Kubernetes cluster, --kube, where nothing between its configurations changes state: not checked here.)
TRIMS: dict[str, list[str]] = {
    "quick": [],
    "congestion": ["duration=3s", "workload.stream.omit=1s"],
    "latency-rr": ["duration=2s"],
    "overlay-latency": ["duration=2s", "workload.stream.omit=0s"],
    "engine-vs-model": ["duration=2s"],
    "web-workers": ["duration=2s"],
    # Its message length is iperf3's --length, no lab state: one length of its two (36 configurations, every
    # delay, rate, protocol and IP version kept).
    "static-congestion": ["duration=2s", "omit=0s", "length=[1400]"],
    "dynamic-congestion": [],
    "docker-vs-kvm": ["duration=2s"],
    # Its load axis changes no lab state (the same links, environment and offloads carry every load): one TCP
    # stream and one UDP flood stand for its eight loads, so four runs fit in about an hour and every change of
    # environment and offload between neighbours is still made.
    "virt-compare": ["duration=2s", 'load=[{proto="tcp",parallel=1},{proto="udp",offered="unlimited"}]'],
}


RUN_TEARDOWN_S = 120  # a stopped run's teardown: guests, containers and namespaces (seconds at most, here)


def run(scenario: str, db: Path, overrides: list[str], checkout: Path | None = None) -> str:
    """`vnetbench run` of `scenario` into `db`, by this checkout or by the one at `checkout` (its sources first
    on the path, this checkout's emulator); the run's id."""
    argv = [*VNETBENCH, "run", scenario, "--db", str(db), "--no-progress"]
    for o in overrides:
        argv += ["--set", o]
    env = None
    if checkout is not None:
        from vnetbench.impair.backend import BINARY_IN_TREE

        env = {**os.environ, "PYTHONPATH": str(checkout / "src"), "VNB_LINK": str(BINARY_IN_TREE)}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, text=True, cwd=checkout or ROOT, env=env)
        try:
            proc.wait()
        except BaseException:
            # Stopped (Ctrl-C, SIGTERM): the run is told as a user would tell it, and tears its lab down (guests,
            # containers, namespaces) before this script goes on; subprocess.run's SIGKILL would leave all of it.
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=RUN_TEARDOWN_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode != 0:
        raise SystemExit(f"vnetbench {' '.join(argv[3:])} exited {proc.returncode}: {stderr[-2000:]}")
    return stdout.strip().splitlines()[-1].split()[1]


def verdicts(db: Path, a: str, b: str) -> dict[tuple[str, str], tuple[str, str]]:
    """compare's verdict per (configuration, metric) for runs a (reference) and b, with the medians' change."""
    proc = subprocess.run([*VNETBENCH, "compare", a, b, "--db", str(db), "--json"], capture_output=True, text=True,
                          cwd=ROOT)
    doc = json.loads(proc.stdout)
    return {(pair["config"], r["metric"]): (r["verdict"], f"{r['median_a']:.4g} -> {r['median_b']:.4g}")
            for pair in doc["configurations"] for r in pair["results"]}


def changed(v: dict[tuple[str, str], tuple[str, str]]) -> set[tuple[str, str]]:
    return {k for k, (verdict, _) in v.items() if verdict in ("improved", "regressed")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated built-ins (default: all)")
    # Fewer than 6 cannot find a change: compare judges the headline metrics together (Holm), and 4 trials a
    # side reach p = 0.029 at best, 0.14 over 5 metrics; 6 reach 0.0022, 0.011 over 5.
    ap.add_argument("--repetitions", type=int, default=6, help="per configuration (at least 6, see above)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--first", choices=("interleaved", "sequential"), default="interleaved",
                    help="the order of the first and the last run (the middle two take the other)")
    ap.add_argument("--dockerd", action="store_true", help="start a dockerd of this benchmark's own for the runs")
    ap.add_argument("--podman", action="store_true", help="start a Podman API service of this benchmark's own")
    ap.add_argument("--against", metavar="REV", help="compare vnetbench at git revision REV with this checkout "
                    "(one order) instead of two orders")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an override for every run after the built-in's trims (repeatable), e.g. to keep a version "
                         "check to the axes its change touches")
    args = ap.parse_args()
    if args.repetitions < 6:
        ap.error("--repetitions below 6 cannot find a change (4 trials a side reach p = 0.14 over 5 metrics)")
    # SIGTERM (kill, a CI timeout) unwinds like Ctrl-C, so the engines below are stopped and their files removed
    signal.signal(signal.SIGTERM, interrupted)
    sys.path.insert(0, str(ROOT / "tests"))
    import engine_daemon
    from vnetbench.lab import engines

    with contextlib.ExitStack() as own:
        for kind, wanted in (("docker", args.dockerd), ("podman", args.podman)):
            if wanted:  # the runs are subprocesses: they find the engine through the environment
                os.environ[engines.URL_VARIABLES[kind]] = own.enter_context(engine_daemon.engine(kind))
        if args.against:
            return check(args, own.enter_context(worktree(args.against)))
        return check(args)


@contextlib.contextmanager
def worktree(rev: str):
    """A git worktree of `rev`, removed after."""
    path = Path(tempfile.mkdtemp(prefix="vnb-against-")) / "checkout"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(path), rev], check=True)
    try:
        yield path
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)], check=False)


def interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def check(args: argparse.Namespace, before: Path | None = None) -> int:
    """A B B A per built-in: two orders, or (`before`: a checkout) two versions in one order."""
    names = args.only.split(",") if args.only else list(TRIMS)
    other = "sequential" if args.first == "interleaved" else "interleaved"
    if before is not None:
        other = args.first
    a_is, b_is = ((f"{args.against}", "this checkout") if before is not None else (args.first, other))
    what = "versions" if before is not None else "orders"
    tmp = Path(tempfile.mkdtemp(prefix="vnb-order-"))
    failed = False
    for name in names:
        db = tmp / f"{name}.db"
        common = [*TRIMS[name], *args.set, f"repetitions={args.repetitions}", f"repeat.seed={args.seed}"]
        a1 = run(name, db, [*common, f"repeat.order={args.first}"], before)
        b1 = run(name, db, [*common, f"repeat.order={other}"])
        b2 = run(name, db, [*common, f"repeat.order={other}"])
        a2 = run(name, db, [*common, f"repeat.order={args.first}"], before)
        cross = [verdicts(db, b, a) for b in (b1, b2) for a in (a1, a2)]
        controls = [verdicts(db, a1, a2), verdicts(db, b1, b2)]
        # the same way in every different-order pair
        effect = sorted(k for k in set.intersection(*map(changed, cross)) if len({v[k][0] for v in cross}) == 1)
        status = subprocess.run([*VNETBENCH, "runs", "--db", str(db)], capture_output=True, text=True,
                                cwd=ROOT).stdout
        print(f"{name}: {a_is} {a1} and {a2}, {b_is} {b1} and {b2}; {len(cross[0])} metric verdicts a pair")
        print("  " + "\n  ".join(line for line in status.splitlines() if any(r in line for r in (a1, b1, b2, a2))))
        print(f"  changed between {what}: {', '.join(str(len(changed(v))) for v in cross)}; between runs of one "
              f"{what[:-1]} (the controls): {', '.join(str(len(changed(v))) for v in controls)}")
        for k in effect:
            print(f"  {what[:-1].upper()} EFFECT {k[0]} {k[1]}: {cross[0][k][0]} ({'; '.join(v[k][1] for v in cross)})")
        failed |= bool(effect)
    print(f"databases in {tmp}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
