"""Helpers for tests: run the CLI as a user would."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The lowest share of a 100 Mbit/s kernel bottleneck a saturated run's median received in CI on this
# 2-core machine, where senders, receiver and the qdisc's softirq share the cores and the link sometimes
# idles for moments (UDP 0.88 and TCP 0.87 of the nominal rate seen; 0.93-0.95 on a quiet machine).
# Received throughput is at most the bottleneck and at least this share of it; the same lull stretches
# a full queue's delay by at most 1 / BUSY_LINK_FILL.
BUSY_LINK_FILL = 0.8


def saturated_udp_loss_bounds(ratio: float) -> tuple[float, float]:
    """The UDP loss ratio a trial offering `ratio` times a kernel bottleneck must show, beside the 1450 B /
    1 ms ping probe: at least 1 - 1/ratio (the link carries no more than its rate), less 0.03 for packets
    counted at the edges of a short trial; at most what is left when headers (42 B per 1448 B datagram)
    and the probe's share take up to 6% of the link and a busy machine delivers only BUSY_LINK_FILL of it."""
    return 1 - 1 / ratio - 0.03, 1 - BUSY_LINK_FILL * 0.94 / ratio


def full_queue_delay_bounds(queue_ms: float) -> tuple[float, float]:
    """The median ping delay through a drop-tail bottleneck that saturating UDP keeps full, whose buffer
    holds `queue_ms` at the nominal rate: at least 90% of it (the queue stays full to within a few
    packets; 99.8% seen) and at most 1 / BUSY_LINK_FILL of it, the same queue drained by a link that
    idles for moments on a busy machine."""
    return 0.9 * queue_ms, queue_ms / BUSY_LINK_FILL


# The workloads check_unshaped_streams judges: a 2 s iperf3 stream with no warm-up, ping every 10 ms during it
# (a scenario adds its [matrix] load of proto = "tcp" and proto = "udp" offered at 50 Mbit/s).
UNSHAPED_STREAMS = """[workload.stream]
tool = "iperf3"
duration = "2s"
omit = "0s"
[workload.probe]
tool = "ping"
interval = "10ms"
during = "stream"
"""


# After a scenario's placement table: the loads check_unshaped_streams judges, a UDP RR, 2 trials each.
UNSHAPED_LOADS = f"""[matrix]
load = [{{proto = "tcp"}}, {{proto = "udp", offered = "50Mbit"}}]
{UNSHAPED_STREAMS}[workload.rr]
tool = "sockperf"
proto = "udp"
payload = 64
duration = "1s"
[repeat]
repetitions = 2
warmup = false
"""


def check_unshaped_streams(store, run_id: str, trials: int) -> tuple[dict, dict]:
    """Every one of the run's `trials` ok, and its two streams (labelled proto = "tcp" and "udp", UDP offered at
    50 Mbit/s, ping during them) as a path with no shaping carries them: all of the UDP arrives (iperf3 paces it
    at the offered rate: see :func:`check_udp_carried`), TCP above 500 Mbit/s (only the cores bound it), ping's
    median RTT under 2 ms. Returns the TCP and the UDP configuration's values."""
    stored = store.trials(run_id)
    assert len(stored) == trials and all(t["status"] == "ok" for t in stored), \
        [t["reason"] for t in stored if t["status"] != "ok"]
    values = store.values(run_id)
    configs = {c["labels"]["proto"]: c for c in store.configurations(run_id)}
    udp, tcp = values[configs["udp"]["key"]], values[configs["tcp"]["key"]]
    check_udp_carried(udp, offered_mbps=50)
    assert all(x > 500 for x in tcp["throughput.rx_mbps"]), tcp["throughput.rx_mbps"]
    assert all(0 < x < 2 for x in tcp["rtt.p50_ms"]), tcp["rtt.p50_ms"]
    return tcp, udp


def check_udp_carried(values: dict, offered_mbps: float) -> None:
    """A UDP stream over a path with no shaping, trial by trial: the sender put out its offered rate (iperf3 paces
    it: within 2 %), and nearly all of it arrived. The path loses nothing of its own; what goes missing is dropped
    at the receiver's full socket buffer (about 20 ms of 50 Mbit/s) while its process waits for a core: up to
    1.2 % of a trial in ten runs with one core kept busy here, 4.9 % once in CI beside a running cluster. A path
    that shapes, polices or misroutes loses far more than a tenth."""
    tx, rx = values["throughput.tx_mbps"], values["throughput.rx_mbps"]
    assert all(abs(x - offered_mbps) <= 0.02 * offered_mbps for x in tx), ("sent", tx)
    assert all(0.9 * s <= r <= 1.02 * offered_mbps for s, r in zip(tx, rx)), ("sent", tx, "received", rx)


def cli(*args: str, check: bool = True, timeout: float = 600, env: dict | None = None,
        calibrate: bool = False) -> subprocess.CompletedProcess:
    """`vnetbench ARGS` in a subprocess, like a user at a shell. A run skips the machine's calibration (about 6 s
    a run) unless `calibrate`: the tests that are about it ask for it."""
    if args and args[0] == "run" and not calibrate:
        args = (*args, "--no-calibration")
    proc = subprocess.run([sys.executable, "-m", "vnetbench", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)
    if check and proc.returncode != 0:
        raise AssertionError(f"vnetbench {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def run_id_of(proc: subprocess.CompletedProcess) -> str:
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("run: "), f"last stdout line is not 'run: ID': {last!r}"
    return last.split()[1]


def run_scenario(tmp_path: Path, text: str, *args: str) -> tuple[str, Path]:
    """`vnetbench run` of a scenario written from `text` into `tmp_path`, into a database there: (run id, db)."""
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(text)
    db = tmp_path / "r.db"
    return run_id_of(cli("run", str(scenario), "--db", str(db), "--no-progress", *args)), db


def stored_trials(db) -> int:
    """How many trials a `vnetbench run` in progress has stored in `db` (0 before it has any)."""
    import sqlite3

    if not Path(db).exists():
        return 0
    try:
        with sqlite3.connect(db) as c:
            return c.execute("SELECT COUNT(*) FROM trials").fetchone()[0]
    except sqlite3.Error:
        return 0


def stored_run_id(db) -> str | None:
    """The id of the run a `vnetbench run` in progress has stored in `db`, once it has (None before)."""
    import sqlite3

    try:
        with sqlite3.connect(db) as c:
            row = c.execute("SELECT id FROM runs").fetchone()
        return row[0] if row else None
    except sqlite3.Error:
        return None


def tree_state(root: Path) -> dict[str, tuple]:
    """Everything under `root` as it stands (name, type, mode, size, mtime, and the bytes of regular files): two
    states compare equal only if nothing under `root` was created, removed, written or re-permissioned."""
    state = {}
    for path in sorted([root, *root.rglob("*")]):
        st = path.lstat()
        content = path.read_bytes() if path.is_file() and not path.is_symlink() else None
        link = str(path.readlink()) if path.is_symlink() else None
        state[str(path.relative_to(root))] = (st.st_mode, st.st_size, st.st_mtime_ns, content, link)
    return state


def hostile_names():
    """A hypothesis strategy of names an attacker or an accident would choose: path pieces ("/", "..", "../"),
    NUL, line breaks and tabs, shell and glob characters, options ("-"), unicode letters and look-alikes,
    bidirectional overrides, long names; with plain letters in between, so that some of them are names."""
    from hypothesis import strategies as st

    pieces = st.sampled_from(["/", ".", "..", "../", "\0", "\n", "\r", "\t", " ", "-", "a", "Z", "9", "_", "é",
                              "\u202e", "\u0430", ":", "*", "$(x)", "`", "'", '"', "\\", "~", "%C", "x" * 90,
                              "etc", "cron.daily"])
    return st.lists(pieces, min_size=1, max_size=8).map("".join) | st.text(min_size=1, max_size=300)


# A chain of two routers between a sender and a receiver (the linear template, two hops): l1 the bottleneck at
# 30 Mbit/s forward with a 100 kB buffer, l2 5 ms each way; ping, then a TCP stream, 2 trials a configuration.
# A test gives its name and what it sweeps or sets (`extra`: TOML tables).
TWO_HOP_CHAIN = """[topology]
template = "linear"
hops = 2
node = "router"
[lab.link.l1]
forward = {rate = "30Mbit", buffer = "100kB"}
[lab.link.l2]
both = {delay = "5ms"}
[workload.probe]
tool = "ping"
interval = "20ms"
duration = "2s"
[workload.stream]
tool = "iperf3"
duration = "3s"
omit = "1s"
[repeat]
repetitions = 2
warmup = 0
"""


def two_hop_chain(name: str, extra: str) -> str:
    return f'name = "{name}"\n{extra}' + TWO_HOP_CHAIN
