"""Environments side by side: how long each takes to come up, and what it costs in throughput.

Run as root:  .venv/bin/python bench/environments.py [--repeat 5] [--trials 3] [--duration 3] [--no-vm]
                  [--dockerd] [--podman]

1. Bring-up: for each environment alone (a switch plus a receiver and a sender
   in that environment), the median wall time to attach both endpoints and
   join them, and to tear the lab down. Targets (issue 6): a container
   endpoint under 0.3 s; a guest booting under TCG in under 15 s (its boot
   time as the guest reports it is printed too); (issue 15) a Docker or
   Podman endpoint under 1 s once the tools image is in the engine (the
   image's own build or lookup is timed apart, first).
2. Throughput: one lab with every environment on the same switch, single
   stream TCP (iperf3, offloads as deployed), trials interleaved in a seeded
   random order so drift of the machine spreads evenly; the median of each
   environment, and its ratio to bare measured in this same run.

Guests are included when the machine can run them (see `vnetbench doctor`), Docker when an engine
answers at DOCKER_HOST (or the default socket), Podman when its API service answers at CONTAINER_HOST
(or /run/podman/podman.sock); `--dockerd` and `--podman` start engines of the benchmark's own for the
run, each in a namespace of its own, as the tests do.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from vnetbench.lab import environments  # noqa: E402
from vnetbench.lab.environments import Variant  # noqa: E402
from vnetbench.lab.topology import build_dumbbell  # noqa: E402
from vnetbench.runner.bench import DumbbellBench  # noqa: E402
from vnetbench.scenario import load, plan  # noqa: E402

ENVS = [
    ("bare", Variant("bare")),
    ("container", Variant("container")),
    ("container (cgroup limits)", Variant("container", cpu_quota=1.0, memory_limit=512 * 2**20)),
    ("docker", Variant("docker")),
    ("docker, host network", Variant("docker", network="host")),
    ("podman", Variant("podman")),
    ("overlay vxlan", Variant("overlay", overlay="vxlan")),
    ("overlay routed", Variant("overlay", overlay="routed")),
    ("vm virtio-net", Variant("vm", nic="virtio-net")),
    ("vm e1000", Variant("vm", nic="e1000")),
]
TARGETS = {"container": 0.3, "container (cgroup limits)": 0.3, "docker": 1.0, "docker, host network": 1.0,
           "podman": 1.0}  # seconds per endpoint


def bringup(variant: Variant, repeat: int) -> dict:
    ups, downs, boots = [], [], []
    for i in range(repeat):
        prefix = f"vnb-be{os.getpid() % 1000}{i}"
        lab = build_dumbbell(prefix, 1, variants=[(variant, 1)])  # tears itself down if it fails
        try:
            ups.append(lab.bringup_s[variant])
            if variant.env == "vm":
                facts = lab.groups[variant].env.facts()
                boots.extend(v for v in facts["boot_s"].values() if v is not None)
                accel = facts.get("accelerator")
        finally:
            t0 = time.perf_counter()
            errors = lab.teardown()
        downs.append(time.perf_counter() - t0)
        if errors:
            raise RuntimeError(errors)
    out = {"up": statistics.median(ups), "down": statistics.median(downs), "n": repeat}
    if boots:
        out["boot"] = statistics.median(boots)
        out["accel"] = accel
    return out


def throughput(variants: list[tuple[str, Variant]], trials: int, duration: int
               ) -> dict[str, dict[str, list[float]]]:
    """{environment: {metric: per-trial values}}: the stream's throughput and what it cost in CPU."""
    env_axis = "[" + ",".join(_table(v) for _, v in variants) + "]"
    loaded = load.load("virt-compare", [f"env={env_axis}", 'load=[{proto="tcp",parallel=1}]', "offload=[on]",
                                        f"duration={duration}s", "workload.stream.omit=1s"])
    configs = plan.expand(loaded)
    names = {plan_variant(c): n for n, v in variants for c in configs if plan_variant(c) == v}
    bench = DumbbellBench.for_configs(f"vnb-bt{os.getpid() % 10000}", configs)
    results: dict[str, dict[str, list[float]]] = {n: {} for n, _ in variants}
    rng = random.Random(1)
    try:
        bench.setup()
        order = list(configs)
        bench.prepare(order[0])
        bench.run_trial(order[0], "warmup")
        for r in range(trials):
            rng.shuffle(order)
            for c in order:
                bench.prepare(c)
                outcome = bench.run_trial(c, f"t{r}-{c.key}")
                if outcome.status != "ok":
                    print(f"  {names[plan_variant(c)]}: trial {r} {outcome.status}: {outcome.reason}", file=sys.stderr)
                    continue
                for s in outcome.measurement.samples:
                    if s.metric in COLUMNS:
                        results[names[plan_variant(c)]].setdefault(s.metric, []).append(s.value)
    finally:
        bench.teardown()
    return results


# The part of the machine's busy time an environment's own processes had, where it can tell: an engine's
# containers (their cgroups) and a guest's QEMU (its threads, from the host).
OWN = ("cpu.container_pct", "cpu.qemu_pct")
COLUMNS = ("throughput.rx_mbps", "cpu.util_pct", "cpu.us_per_kb", "cpu.softirq_pct", *OWN)


def plan_variant(config) -> Variant:
    return Variant.from_lab(config.scenario.lab)


def _table(v: Variant) -> str:
    items = [f'env="{v.env}"'] + [f'{k}="{val}"' if isinstance(val, str) else f"{k}={val}"
                                  for k, val in v.options.items()]
    return "{" + ",".join(items) + "}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5, help="bring-up cycles per environment (guests: 1)")
    ap.add_argument("--trials", type=int, default=3, help="throughput trials per environment")
    ap.add_argument("--duration", type=int, default=3, help="seconds per throughput trial (after 1 s omitted)")
    ap.add_argument("--no-vm", action="store_true", help="leave the guests out")
    ap.add_argument("--dockerd", action="store_true", help="start a dockerd of this benchmark's own for the docker rows")
    ap.add_argument("--podman", action="store_true", help="start a Podman API service of this benchmark's own")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("run as root: the lab is made of network namespaces", file=sys.stderr)
        return 2
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import engine_daemon
    from vnetbench.lab import engines

    with contextlib.ExitStack() as own:
        for kind, wanted in (("docker", args.dockerd), ("podman", args.podman)):
            if wanted:
                os.environ[engines.URL_VARIABLES[kind]] = own.enter_context(engine_daemon.engine(kind))
        return measure(args)


def measure(args: argparse.Namespace) -> int:
    envs = [(n, v) for n, v in ENVS if v.env != "vm" or not args.no_vm]
    skipped = [n for n, v in envs if environments.problems([v])]
    for n in skipped:
        print(f"skipping {n}: {'; '.join(environments.problems([dict(envs)[n]]))}")
    envs = [(n, v) for n, v in envs if n not in skipped]

    from vnetbench.lab import engines

    for kind in sorted({v.env for _, v in envs} & set(engines.DEFAULT_URLS)):
        t0 = time.perf_counter()
        image = engines.tools_image(engines.connect(kind))
        print(f"{kind} tools image {image.tag}: {'built and imported' if image.built else 'found in the engine'} "
              f"in {time.perf_counter() - t0:.2f} s")
    print(f"bring-up of a receiver + a sender per environment (median of {args.repeat}; guests once), "
          f"teardown, per-endpoint time")
    print(f"  {'environment':28} {'up (2 endpoints)':>17} {'per endpoint':>13} {'teardown':>9}  target")
    for name, v in envs:
        b = bringup(v, 1 if v.env == "vm" else args.repeat)
        per = b["up"] / 2
        target = TARGETS.get(name)
        verdict = ""
        if target:
            verdict = f"< {target:g} s {'ok' if per < target else 'MISSED'}"
        if "boot" in b:
            verdict = (f"guest boot {b['boot']:.1f} s under {', '.join(b['accel'] or ['?'])} "
                       f"(TCG target < 15 s: {'ok' if b['boot'] < 15 else 'MISSED'})")
        print(f"  {name:28} {b['up']:>15.3f} s {per:>11.3f} s {b['down']:>7.3f} s  {verdict}")

    tp_envs = [(n, v) for n, v in envs if n != "container (cgroup limits)"]
    print(f"\nsingle-stream TCP throughput, one lab, {args.trials} interleaved trials of {args.duration} s each")
    results = throughput(tp_envs, args.trials, args.duration)
    def median(name: str, metric: str) -> float:
        vals = (results.get(name) or {}).get(metric) or []
        return statistics.median(vals) if vals else float("nan")

    base, base_cost = median("bare", "throughput.rx_mbps"), median("bare", "cpu.us_per_kb")
    print("  CPU: the whole machine's busy time over the measured window (cores x 100), service demand in CPU us "
          "per KB received, its softirq part, and the part the environment's own processes had (an engine's "
          "containers, a guest's QEMU)")
    print(f"  {'environment':28} {'median Mbit/s':>14} {'min..max':>20} {'vs bare':>8} {'CPU %':>6} {'us/KB':>6} "
          f"{'vs bare':>8} {'softirq %':>9} {'own %':>6}")
    for name, _ in tp_envs:
        vals = (results.get(name) or {}).get("throughput.rx_mbps") or []
        if not vals:
            print(f"  {name:28} {'-':>14}")
            continue
        med, cost = statistics.median(vals), median(name, "cpu.us_per_kb")
        own = next((median(name, m) for m in OWN if (results.get(name) or {}).get(m)), None)
        print(f"  {name:28} {med:>14.0f} {min(vals):>9.0f}..{max(vals):<9.0f} {med / base:>7.2f}x "
              f"{median(name, 'cpu.util_pct'):>6.0f} {cost:>6.2f} {cost / base_cost:>7.2f}x "
              f"{median(name, 'cpu.softirq_pct'):>9.0f} {'-' if own is None else f'{own:.0f}':>6}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
