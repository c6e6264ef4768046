"""Request/response latency on the real lab obeys the path's physics (workloads issue).

sockperf ping-pong between two namespaces, through the link emulator with d ms
of one-way delay each way (``shape = "both"``) and with none: every round trip
crosses the delay twice, so the median round trip grows by 2d, and one message
in flight means transactions/s = 1 / mean round trip. Run through the CLI as a
user would, judged on the median of 3 trials like `vnetbench show`.

Through a delay, server and client each sleep until the message comes, and
their wake-up is the machine's: on metal microseconds, on a VM what the
hypervisor takes to hand a virtual CPU the wake-up (this scenario keeps idle
cores polling, lab.idle_cores = "poll", lab/idle.py: on the 2-core VM a round
trip through 5 ms each way came out 246 to 340 us above 10 ms plus the
zero-delay one, 400 to 580 us with the cores halting). That cost is the same
through any delay of milliseconds: the growth from one delay to another is
2 x their difference, within the issue's 0.3 ms, whatever the machine.

Not while other work holds the cores: a CI machine whose other processes or
hypervisor took them (the trials vnetbench marks, metrics.NOISE_MARKS) once gave
the 5 ms delay's median 1.4 ms above 10 ms, the 2 ms one's 0.09 above 4. A
bound missed by a run that marked its trials so (as `show` tells a user not to
trust them) skips the test, saying so; missed by one that did not, it fails.
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers import cli, run_id_of
from vnetbench.store.db import Store

pytestmark = pytest.mark.lab

DELAY_MS = 5.0
SHORT_DELAY_MS = 2.0
SCENARIO = f"""
name = "rr-physics"
[lab]
senders = 1
bottleneck = "unlimited"
shape = "both"
idle_cores = "poll"
[matrix]
delay = ["0ms", "{SHORT_DELAY_MS:g}ms", "{DELAY_MS:g}ms"]
proto = ["udp", "tcp"]
[workload.rr]
tool = "sockperf"
duration = "3s"
[repeat]
repetitions = 3
warmup = false
"""


@pytest.fixture(scope="module")
def rr_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rr")
    path = tmp / "rr.toml"
    path.write_text(SCENARIO)
    db = tmp / "r.db"
    proc = cli("run", str(path), "--db", str(db), "--no-progress", timeout=600)
    run_id = run_id_of(proc)
    store = Store(db)
    yield store, run_id
    store.close()


def _medians(store: Store, run_id: str) -> dict[tuple[str, str], dict[str, float]]:
    configs = {c["key"]: c["labels"] for c in store.configurations(run_id)}
    out = {}
    for key, per in store.values(run_id).items():
        labels = configs[key]
        out[(labels["delay"], labels["proto"])] = {m: float(np.median(v)) for m, v in per.items()}
    return out


def _marks(store: Store, run_id: str) -> list[str]:
    """Why the run's trials were marked (the machine busy with other work), each reason once."""
    return sorted({w for trials in store.marked_trials(run_id).values() for _, why in trials for w in why})


def _within(ok: bool, store: Store, run_id: str, said: object) -> None:
    """Assert a bound of the machine's precision; missed in a run that marked trials, skip saying why."""
    if not ok and (marks := _marks(store, run_id)):
        pytest.skip(f"missed {said} in a run whose trials ran while the machine was busy ({'; '.join(marks)})")
    assert ok, said


def test_every_trial_ran_through_the_emulator(rr_run):
    store, run_id = rr_run
    trials = store.trials(run_id)
    assert len(trials) == 18 and all(t["status"] == "ok" for t in trials), [t["reason"] for t in trials]
    for c in store.configurations(run_id):
        assert c["lab_state"]["links"]["bottleneck"]["backend"] in ("userspace", "netem"), c["lab_state"]
    # idle cores held: by the kernel's cpuidle driver, or where it has none by polling, as the scenario asks
    held = store.run(run_id)["fingerprint"]["cpu_wake_latency"]
    assert held.startswith(("held at 0 us", "held by polling")), held


@pytest.mark.parametrize("proto", ["udp", "tcp"])
def test_delay_adds_twice_itself_to_the_median_round_trip(rr_run, proto):
    store, run_id = rr_run
    m = _medians(store, run_id)
    floor_us = m[("0ms", proto)]["rr.p50_us"]
    short_us = m[(f"{SHORT_DELAY_MS:g}ms", proto)]["rr.p50_us"]
    delayed_us = m[(f"{DELAY_MS:g}ms", proto)]["rr.p50_us"]
    print(f"{proto}: floor {floor_us:.1f} us, {SHORT_DELAY_MS:g} ms: {short_us:.1f} us, {DELAY_MS:g} ms: "
          f"{delayed_us:.1f} us, wake-up {store.run(run_id)['fingerprint'].get('cpu_wake_up')}")
    # the bound: 3 ms more of delay each way adds 6 ms to the median round trip, within 0.3 ms
    _within(abs(delayed_us - short_us - 2 * (DELAY_MS - SHORT_DELAY_MS) * 1e3) <= 300, store, run_id,
            (proto, short_us, delayed_us))
    # and against none: never less than 2d, and more only by the machine's two wake-ups of a sleeping process
    # (under a millisecond with idle cores held)
    for d_ms, rtt_us in ((SHORT_DELAY_MS, short_us), (DELAY_MS, delayed_us)):
        assert 0 <= rtt_us - 2 * d_ms * 1e3 - floor_us, (proto, floor_us, d_ms, rtt_us)  # physics: never less
        _within(rtt_us - 2 * d_ms * 1e3 - floor_us <= 1000, store, run_id, (proto, floor_us, d_ms, rtt_us))
    # and the floor itself is a path through namespaces and the emulator: well under a millisecond
    assert 5 <= floor_us <= 1000, floor_us


@pytest.mark.parametrize("proto", ["udp", "tcp"])
def test_one_message_in_flight_gives_one_transaction_per_round_trip(rr_run, proto):
    store, run_id = rr_run
    got = _medians(store, run_id)[(f"{DELAY_MS:g}ms", proto)]
    per_round_trip = 1e6 / got["rr.mean_us"]
    # at most one transaction per mean round trip; at least 95% of it (the client's turnaround between an
    # answer and the next request is microseconds against a 10 ms round trip)
    assert 0.95 * per_round_trip <= got["rr.transactions_per_s"] <= 1.01 * per_round_trip, got
    assert got["rr.transactions_per_s"] <= 1e3 / (2 * DELAY_MS)


def test_the_round_trip_distribution_is_stored_for_the_report(rr_run):
    store, run_id = rr_run
    trial = store.trials(run_id)[0]
    (series,) = [s for s in store.series(trial["id"]) if s.name == "rr_rtt_us"]
    assert len(series.v) > 100 and np.all(series.v > 0)
