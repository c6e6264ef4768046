"""Teardown, interruption, resume, bad input and failing tools, on real labs."""

import ipaddress
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import ROOT, cli, full_queue_delay_bounds, run_id_of, saturated_udp_loss_bounds
from vnetbench.lab import netns
from vnetbench.lab.clean import leftovers
from vnetbench.lab.netns import run_prefix
from vnetbench.runner.bench import DumbbellBench
from vnetbench.scenario import load, plan
from vnetbench.store.db import Store

pytestmark = pytest.mark.lab

SHORT = ["--set", "duration=2s", "--set", "workload.stream.omit=0s", "--set", "repeat.warmup=false"]


def start_run(db: Path, *extra: str, calibrate: bool = False) -> subprocess.Popen:
    """`vnetbench run quick` in the background; without the calibration unless asked, so that the first
    namespaces of the run are its lab's (a stop during a calibration: tests/integration/test_calibration.py)."""
    calibration = [] if calibrate else ["--no-calibration"]
    return subprocess.Popen([sys.executable, "-m", "vnetbench", "run", "quick", "--db", str(db), "--no-progress",
                             *SHORT, *calibration, *extra], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def wait_for(predicate, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def ok_trials(db: Path) -> int:
    if not db.exists():
        return 0
    with sqlite3.connect(db) as c:
        try:
            return c.execute("SELECT COUNT(*) FROM trials").fetchone()[0]
        except sqlite3.OperationalError:
            return 0


def run_namespaces(db: Path) -> list[str]:
    """Namespaces of the run stored in `db` (other runs, e.g. a parallel session's, are not ours to judge)."""
    if not db.exists():
        return []
    with sqlite3.connect(db) as c:
        try:
            row = c.execute("SELECT id FROM runs ORDER BY started DESC LIMIT 1").fetchone()
        except sqlite3.OperationalError:
            return []
    return leftovers(f"vnb-{row[0][:6]}-") if row else []


def our_processes() -> list[str]:
    out = subprocess.run(["pgrep", "-a", "-f", "iperf3 --server|ping -4 -D|vnb-link idle-poll"], capture_output=True,
                         text=True).stdout
    return [l for l in out.splitlines() if l.strip()]


@pytest.mark.parametrize("signals", [pytest.param(1, id="ctrl-c", marks=pytest.mark.quick),
                                     pytest.param(2, id="ctrl-c twice")])
def test_interrupt_tears_everything_down(tmp_path, signals, no_leftovers):
    db = tmp_path / "r.db"
    proc = start_run(db)
    wait_for(lambda: run_namespaces(db) and ok_trials(db) >= 1, what="the lab and a first trial")
    for _ in range(signals):
        proc.send_signal(signal.SIGINT)
        time.sleep(0.05)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "--resume" in err
    assert run_namespaces(db) == []
    assert not our_processes()
    store = Store(db)
    run = store.runs()[-1]
    assert run["status"] == "interrupted" and run["trials_ok"] >= 1


def test_sigterm_too(tmp_path, no_leftovers):
    db = tmp_path / "r.db"
    proc = start_run(db)
    wait_for(lambda: run_namespaces(db), what="the lab")
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert run_namespaces(db) == [] and not our_processes()


def test_killed_run_is_cleaned_and_resumed(tmp_path, no_leftovers):
    db = tmp_path / "r.db"
    proc = start_run(db, "--set", "repetitions=2")
    wait_for(lambda: ok_trials(db) >= 2, timeout=60, what="two stored trials")
    proc.kill()  # SIGKILL: no teardown at all
    proc.communicate(timeout=10)
    assert run_namespaces(db), "a SIGKILLed run should have left its namespaces"
    done_before = ok_trials(db)
    run_id = Store(db).runs()[-1]["id"]
    listed = cli("runs", "--db", str(db)).stdout
    assert "interrupted" in listed and f"vnetbench run --resume {run_id}" in listed  # not "running" for ever

    cleaned = cli("clean", "--run", run_id)
    assert "removed 4 namespaces" in cleaned.stdout
    assert run_namespaces(db) == [] and not our_processes()

    resumed = cli("run", "--resume", run_id[:6], "--db", str(db), "--no-progress")
    assert run_id_of(resumed) == run_id
    store = Store(db)
    trials = store.trials(run_id)
    slots = [(t["config_key"], t["repetition"]) for t in trials]
    assert len(slots) == 4 * 2 and len(set(slots)) == len(slots)  # every planned trial once, none twice
    assert len(trials) - done_before >= 1
    assert store.run(run_id)["status"] == "completed"


def test_clean_touches_only_our_prefix(no_leftovers):
    foreign = f"vnbtest{os.getpid()}"  # no dash after "vnb": not ours
    netns.create(foreign)
    try:
        cli("clean")
        assert netns.exists(foreign)
    finally:
        netns.remove(foreign)
    assert cli("clean", "--check").returncode == 0


def test_not_root_is_one_clear_message(tmp_path):
    db = tmp_path / "r.db"
    proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m",
                           "vnetbench", "run", "quick", "--db", str(db)], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert proc.returncode == 2
    assert "needs root" in proc.stderr and "sudo" in proc.stderr and "Traceback" not in proc.stderr
    assert not db.exists()


def test_missing_tool_is_named_with_its_package(tmp_path, no_leftovers):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("ip", "ss", "taskset", "ping"):  # everything but iperf3
        (bin_dir / tool).symlink_to(subprocess.run(["which", tool], capture_output=True, text=True).stdout.strip())
    proc = cli("run", "quick", "--db", str(tmp_path / "r.db"), check=False, env={**os.environ, "PATH": str(bin_dir)})
    assert proc.returncode == 2
    assert "missing tool: iperf3" in proc.stderr and "apt-get install iperf3" in proc.stderr


def test_bad_scenario_builds_nothing(tmp_path, no_leftovers):
    proc = cli("run", "quick", "--db", str(tmp_path / "r.db"), "--set", "buffer=100B", check=False)
    assert proc.returncode == 2 and "lab.buffer = '100B'" in proc.stderr
    assert not (tmp_path / "r.db").exists()  # checked before the store or the lab is touched


def _bench_and_config(*overrides):
    loaded = load.load("quick", ["ratios=[0.6]", "protos=[tcp]", "duration=1s", "workload.stream.omit=0s",
                                 *overrides])
    config = plan.expand(loaded)[0]
    bench = DumbbellBench(f"vnb-t{os.getpid() % 100000}", senders=2)
    return bench, config


@pytest.mark.quick
def test_failing_tool_is_recorded_and_the_run_goes_on(no_leftovers):
    bench, config = _bench_and_config()
    bench.setup()
    try:
        bench.prepare(config)
        for proc in bench._servers.values():
            proc.kill()
            proc.wait()
        failed = bench.run_trial(config, "t1")
        assert failed.status == "failed" and "Connection refused" in failed.reason
        assert failed.raw["workloads"]["stream"]["s1"]  # the tool's own output is kept
        ok = bench.run_trial(config, "t2")  # servers were restarted
        assert ok.status == "ok", ok.reason
    finally:
        bench.teardown()


@pytest.mark.quick
def test_hanging_tool_times_out(no_leftovers):
    bench, config = _bench_and_config("workload.stream.timeout=3s")
    bench.setup()
    try:
        bench.prepare(config)
        for proc in bench._servers.values():
            os.kill(proc.pid, signal.SIGSTOP)  # the server accepts nothing: clients hang
        t0 = time.monotonic()
        outcome = bench.run_trial(config, "t1")
        assert outcome.status == "timeout" and "per-trial timeout" in outcome.reason
        assert 2.5 < time.monotonic() - t0 < 10
        assert bench.run_trial(config, "t2").status == "ok"
    finally:
        bench.teardown()


@pytest.mark.parametrize("variant", [pytest.param(["lab.ip_version=6"], id="ipv6"),
                                     pytest.param(["lab.qdisc=htb"], id="htb", marks=pytest.mark.quick)])
def test_ipv6_and_htb_saturate_like_ipv4_tbf(tmp_path, variant, no_leftovers):
    proc = cli("run", "quick", "--db", str(tmp_path / "r.db"), "--no-progress", *SHORT, "--set", "ratios=[2.0]",
               "--set", "protos=[udp]", "--set", "repetitions=1", *[a for v in variant for a in ("--set", v)])
    store = Store(tmp_path / "r.db")
    run_id = run_id_of(proc)
    values = next(iter(store.values(run_id).values()))
    low, high = saturated_udp_loss_bounds(2.0)  # one 2 s trial at ratio 2
    assert low <= values["udp.loss_ratio"][0] <= high
    assert values["throughput.rx_mbps"][0] <= 105
    low, high = full_queue_delay_bounds(40)  # 500 kB at 100 Mbit/s
    assert low <= values["rtt.p50_ms"][0] <= high
    qdiscs = store.configurations(run_id)[0]["lab_state"]["qdiscs"]
    assert {q["kind"] for q in qdiscs} == ({"htb", "bfifo"} if "htb" in variant[0] else {"tbf"})
    # The endpoint -> node mapping is stored with the run: each endpoint's namespace, addresses on the
    # benchmarking ranges, interface and pinned CPU; `show` gives it.
    endpoints = store.run(run_id)["fingerprint"]["endpoints"]
    prefix = run_prefix(run_id)
    assert list(endpoints) == ["bare"] and set(endpoints["bare"]) == {"r", "s1", "s2"}
    network = ipaddress.ip_network("2001:2::/48" if "ip_version=6" in variant[0] else "198.18.0.0/15")
    for name, where in endpoints["bare"].items():
        assert where["node"] == f"namespace {prefix}-{name}", where
        assert any(ipaddress.ip_address(a) in network for a in where["addresses"]), where
        assert where["interface"] and isinstance(where["cpu"], int), where
    shown = " ".join(cli("show", run_id, "--db", str(tmp_path / "r.db")).stdout.split())
    assert f"endpoints: r = namespace {prefix}-r (" in shown
    # Idle cores as the kernel keeps them for a 0 us PM QoS request: no pollers unless the scenario asks
    # (lab.idle_cores = "poll"); where the kernel has no cpuidle driver, the record says they halted, and what
    # a wake-up then cost
    from vnetbench.lab import idle

    fingerprint = store.run(run_id)["fingerprint"]
    held = fingerprint["cpu_wake_latency"]
    if idle.cpuidle_driver() is None:
        assert held.startswith("not held: the kernel has no cpuidle driver") and "halted" in held, held
        woke = fingerprint["cpu_wake_up"]
        assert woke is None or (woke["asleep_us"] == idle.WAKE_PROBE_ASLEEP_US and woke["wake_us_after_sleep"] > 0), woke
    else:
        assert held.startswith("held at 0 us"), held


def test_qdisc_probe_reports_what_the_kernel_accepts_and_leaves_nothing(no_leftovers):
    from vnetbench import doctor

    found = netns.probe_qdiscs(doctor.QDISCS, purpose="doctor")
    assert set(found) == set(doctor.QDISCS)
    # In every kernel vnetbench supports (and the reason the lab works at all): no error for these.
    assert {k: found[k] for k in ("tbf", "htb", "pfifo", "clsact")} == dict.fromkeys(("tbf", "htb", "pfifo", "clsact"))
    # Whatever the kernel refuses comes with its own words, not a blank.
    assert all(err is None or err.strip() for err in found.values())
    assert not [n for n in netns.list_names() if n.startswith(f"{netns.PREFIX}doctor-")]


def _our_iperf3_servers() -> list[int]:
    """PIDs of iperf3 servers running inside one of our namespaces."""
    found = subprocess.run(["pgrep", "-f", "^iperf3 --server"], capture_output=True, text=True).stdout.split()
    ours = []
    for pid in map(int, found):
        ns = subprocess.run(["ip", "netns", "identify", str(pid)], capture_output=True, text=True).stdout.strip()
        if ns.startswith(netns.PREFIX):
            ours.append(pid)
    return ours


def test_a_hung_trial_fails_and_the_run_goes_on_through_the_cli(tmp_path, no_leftovers):
    """A user's run in which a tool hangs: that trial is recorded as a timeout with its reason, the next
    trials run (servers restarted), the summary says how many failed, and the run still completes."""
    db = tmp_path / "r.db"
    run = subprocess.Popen([sys.executable, "-m", "vnetbench", "run", "quick", "--db", str(db), "--no-progress",
                            "--no-calibration",  # its iperf3 server would be frozen with the run's
                            "--set", "ratios=[0.6]", "--set", "protos=[udp]", "--set", "repetitions=3",
                            "--set", "workload.stream.timeout=6s", *SHORT],
                           cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    frozen: list[int] = []
    deadline = time.monotonic() + 60
    while not frozen and run.poll() is None and time.monotonic() < deadline:
        frozen = _our_iperf3_servers()
        time.sleep(0.05)
    assert frozen, "the run's iperf3 servers never appeared"
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)  # they accept and answer nothing: the trial in flight hangs
    out, err = run.communicate(timeout=120)
    assert run.returncode == 0, out + err
    run_id = run_id_of(subprocess.CompletedProcess(run.args, 0, out, err))
    with Store(db) as store:
        trials = store.trials(run_id)
        assert store.run(run_id)["status"] == "completed"
    bad = [t for t in trials if t["status"] != "ok"]
    assert len(trials) == 3 and len(bad) == 1, [(t["status"], t["reason"]) for t in trials]
    assert bad[0]["status"] == "timeout" and "per-trial timeout" in bad[0]["reason"]
    assert "1 of 3 trials failed" in " ".join(out.split())
    shown = cli("show", run_id, "--db", str(db)).stdout
    assert "timeout" in shown and "per-trial timeout" in " ".join(shown.split())


def test_a_second_run_is_refused_while_one_measures_and_runs_beside_it_when_allowed(tmp_path, no_leftovers):
    db = tmp_path / "r.db"
    first = start_run(db, "--set", "repetitions=3")
    wait_for(lambda: run_namespaces(db), what="the first run's lab")
    first_id = Store(db).runs()[-1]["id"]

    refused = cli("run", "quick", "--db", str(tmp_path / "second.db"), "--no-progress", *SHORT, check=False)
    assert refused.returncode == 2, refused.stderr
    assert f"run {first_id}" in refused.stderr and f"pid {first.pid}" in refused.stderr
    assert "--allow-concurrent" in refused.stderr
    assert Store(tmp_path / "second.db").runs() == []  # refused before anything was stored or built
    cleaned = cli("clean")  # a measuring run's lab is not a leftover
    assert f"left alone: the lab of run {first_id}" in cleaned.stdout and run_namespaces(db)

    report = tmp_path / "second.html"
    beside = cli("run", "quick", "--db", str(db), "--no-progress", *SHORT, "--set", "repetitions=1",
                 "--allow-concurrent", "--report", str(report))
    second_id = run_id_of(beside)
    assert "sharing the machine with run " + first_id in beside.stderr
    out, err = first.communicate(timeout=180)
    assert first.returncode == 0, err

    store = Store(db)  # one database, two runs: every planned trial of each once, none mixed up
    for run_id, reps in ((first_id, 3), (second_id, 1)):
        slots = [(t["config_key"], t["repetition"]) for t in store.trials(run_id)]
        assert len(slots) == 4 * reps and len(set(slots)) == len(slots)
        assert store.run(run_id)["status"] == "completed"
    fp_second = store.run(second_id)["fingerprint"]
    assert fp_second["allow_concurrent"] is True
    assert first_id in {r["run_id"] for r in fp_second["machine_load"][0]["concurrent_runs"]}
    # the first run saw the second one come and go (its monitor samples every few seconds)
    assert second_id in {r["run_id"] for r in store.run(first_id)["fingerprint"]["machine_load"][0]["concurrent_runs"]}
    assert "This run shared the machine" in report.read_text()
    assert "This run shared the machine" in cli("show", first_id, "--db", str(db)).stdout


def test_a_namespace_removed_under_a_run_fails_its_trials_with_the_reason(tmp_path, no_leftovers):
    """Hardening issue: a vanished namespace (someone's `ip netns del`, or a `vnetbench clean` from another
    shell) is one clear reason per trial, never a traceback, and the run goes on and ends; teardown then finds
    it gone without complaint. A sender's: every trial starts its clients there anew (a receiver's namespace
    outlives its name while its servers hold it)."""
    db = tmp_path / "r.db"
    proc = start_run(db, "--set", "repetitions=3")
    wait_for(lambda: ok_trials(db) >= 1, timeout=60, what="the first trial")
    sender = next(n for n in run_namespaces(db) if n.endswith("-s1"))
    subprocess.run(["ip", "netns", "del", sender], check=True)
    out, err = proc.communicate(timeout=180)
    assert "Traceback" not in err and "Traceback" not in out, err[-3000:]
    assert proc.returncode == 0, (proc.returncode, err[-2000:])
    with Store(db) as store:
        run = store.runs()[-1]
        trials = store.trials(run["id"])
    failed = [t for t in trials if t["status"] != "ok"]
    assert run["status"] == "completed" and len(trials) == 4 * 3 and failed, [t["status"] for t in trials]
    # every trial after the removal failed, each saying where
    assert all(sender in str(t["reason"]) for t in failed), [t["reason"] for t in failed][:3]
    assert trials[-1]["status"] != "ok"
    assert not run_namespaces(db) and not our_processes()
