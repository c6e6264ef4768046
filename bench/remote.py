"""Per workload tool: what a trial costs beyond the seconds it measures when its endpoints are real hosts
reached over SSH (`run --hosts`), beside the same trial in the local lab, in one run.

Run as root:  .venv/bin/python bench/remote.py [--trials 4] [--seconds 2] [--spread-trials 10]

The hosts are the integration tests' (tests/sshlab.py, DataHosts): OpenSSH sshd servers in namespaces of their
own, each with a management link to this machine and a data link between the two, reached through one
multiplexed OpenSSH connection each, as `run --hosts` reaches a user's machines. Each trial is the slot a run
executes (starting the clients through ssh, waiting, parsing, committing to SQLite): overhead = its wall time
minus the time the tool itself takes (bench/workloads.py's measure). Issue 14's target: under 0.3 s per trial,
as in the lab.

Then the start spread of a trial's clients across 4 sender hosts (`vnetbench run --hosts`, one UDP iperf3 flow
from each to a fifth host): each trial's start.spread_ms, as the run stores it. Target: median under 5 ms.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "src"), str(HERE.parent / "tests"), str(HERE)]

import sshlab  # noqa: E402
from vnetbench.hosts import inventory  # noqa: E402
from vnetbench.hosts.ssh import HostAccess  # noqa: E402
from vnetbench.runner.hosts_bench import HostsBench, Placement  # noqa: E402
from vnetbench.store.db import Store  # noqa: E402
from workloads import TARGET_S, WORKLOADS, measure  # noqa: E402

TOOLS = ("iperf3 tcp", "ping 10ms", "sockperf udp", "irtt 10ms", "wrk 1 conn", "ab 1 client, CRR")
SPREAD_TARGET_MS = 5.0


def start_spread(hosts: sshlab.DataHosts, tmp: Path, trials: int) -> list[float]:
    """start.spread_ms of `trials` trials with 4 senders (client-1..4) to server-a, through the CLI."""
    senders = ["client-1", "client-2", *hosts.extra]
    addresses = {"server-a": hosts.SERVER_DATA, "client-1": hosts.CLIENT_DATA, "client-2": hosts.CLIENT2_DATA,
                 **{name: data for name, (_, data) in hosts.extra.items()}}
    scenario = tmp / "spread.toml"
    scenario.write_text(f"""name = "start-spread"
[lab]
bottleneck = "unlimited"
senders = {len(senders)}
[hosts]
receiver = "server-a"
senders = {senders!r}
addresses = {{ {", ".join(f'"{k}" = "{v}"' for k, v in addresses.items())} }}
[workload.stream]
tool = "iperf3"
proto = "udp"
offered = "20Mbit"
duration = "1s"
omit = "0s"
[repeat]
repetitions = {trials}
warmup = false
""".replace("'", '"'))
    db = tmp / "spread.db"
    subprocess.run([sys.executable, "-m", "vnetbench", "run", str(scenario), "--db", str(db), "--no-progress",
                    "--hosts", str(hosts.inventory), "--ssh-config", str(hosts.ssh_config)], check=True,
                   capture_output=True, cwd=HERE.parent)
    with Store(db) as store:
        run_id = store.resolve_run("last")
        return [v for per in store.values(run_id).values() for v in per.get("start.spread_ms", [])]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=4)
    ap.add_argument("--seconds", type=int, default=2)
    ap.add_argument("--spread-trials", type=int, default=10)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench/remote.py builds namespaces for its hosts: run it as root", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="vnb-bench-remote-"))
    os.chmod(tmp, 0o755)
    net = sshlab.SshLab(tmp)
    try:
        hosts = sshlab.DataHosts(tmp, net, extra_clients=2)
        inv = inventory.load(hosts.inventory)
        access = HostAccess(inv, ssh_config=str(hosts.ssh_config))
        place = Placement(inv.hosts["server-a"], [inv.hosts["client-1"]],
                          {"server-a": hosts.SERVER_DATA, "client-1": hosts.CLIENT_DATA})

        def remote_bench(configs: list) -> HostsBench:
            return HostsBench.for_hosts(f"vnb-br{os.getpid() % 10000}", configs, place, access.connect, {})

        print(f"per tool: {args.trials} trials of {args.seconds} s, in the lab and on two hosts over SSH "
              f"(load average {os.getloadavg()[0]:.2f})")
        print(f"{'tool':<17} {'lab overhead':>13} {'ssh overhead':>13} {'ssh max':>8} {'target':>7}  "
              f"{'RTT floor lab / ssh (us)':>25}")
        ok = True
        for name in TOOLS:
            table = WORKLOADS[name][0]
            lab, lab_floor = measure(name, table, args.seconds, args.trials)
            ssh, ssh_floor = measure(name, table, args.seconds, args.trials, make_bench=remote_bench)
            med = statistics.median(ssh)
            ok &= med < TARGET_S
            floors = (f"{statistics.median(lab_floor):>11.1f} / {statistics.median(ssh_floor):>11.1f}"
                      if lab_floor else f"{'-':>25}")
            print(f"{name:<17} {statistics.median(lab):>12.3f}s {med:>12.3f}s {max(ssh):>7.3f}s {TARGET_S:>6.1f}s  "
                  f"{floors}   {'ok' if med < TARGET_S else 'MISSED'}")
        spreads = start_spread(hosts, tmp, args.spread_trials)
        med = statistics.median(spreads)
        ok &= med < SPREAD_TARGET_MS
        print(f"\nstart spread of 4 senders' clients, {len(spreads)} trials: median {med:.2f} ms, max "
              f"{max(spreads):.2f} ms (target: median < {SPREAD_TARGET_MS:g} ms)   "
              f"{'ok' if med < SPREAD_TARGET_MS else 'MISSED'}")
        left = hosts.pids()
        if any(left.values()):
            print(f"processes left on the hosts: {left}")
            ok = False
        return 0 if ok else 1
    finally:
        net.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
