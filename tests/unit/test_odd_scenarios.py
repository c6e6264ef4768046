"""Odd scenarios end in one clear line and exit 2 (outside review, item 3), through the CLI as a user runs it.

Each class the review found: numbers (non-finite, beyond a float or an int's digits, zero rates, seeds beyond
SQLite), structure (a table where a value belongs, nesting, encodings, paths), size and time (long
schedules, devices as traces, steps under a millisecond) and translation to tools (iperf3's whole seconds
and limits, the kernel's 32-bit rates and buffers, IPv6's minimum MTU, a guest's memory). `plan` checks
them all without root; `run` refuses the same before it builds or stores anything.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from helpers import ROOT

BASE = 'name = "odd"\n[lab]\nsenders = 1\nbottleneck = "100Mbit"\n[workload.stream]\ntool = "iperf3"\nduration = "2s"\n'

# (--set items, what the one line must say)
BY_SET = [
    (["bottleneck=nan"], "nan is not a finite rate"),
    (["bottleneck=1e400"], "not a finite rate"),
    (["offered=1e400"], "is not a finite rate"),
    (["offered=0"], "a rate must be more than 0; for no limit write 'unlimited'"),
    (["workload.stream.offered=" + " + ".join(["1Mbit"] * 100)], "write offered in at most 200"),
    (["repeat.seed=9223372036854775808"], "repeat.seed"),
    (["repeat.seed=" + "9" * 5000], "Exceeds the limit (4300 digits)"),
    (["buffer={}"], "a buffer is either bytes or seconds"),
    (["matrix.x=" + "[" * 900 + "]" * 900], "nested too deep"),
    (["bottleneck_schedule=1Mbit/1s" + "," * 2000 + "x"], "is not RATE/TIME"),
    (["bottleneck_schedule=trace:/dev/zero"], "is under /dev, a kernel or device file"),
    (["bottleneck_schedule=100Mbit/0.1ms 20Mbit/5s"], "a step lasts at least 1ms"),
    (["duration=1e6s"], "iperf3 runs its flows in whole seconds, 1s to 86400s"),
    (["duration=2.5s"], "in whole seconds"),
    (["workload.stream.omit=0.5s"], "iperf3 omits whole seconds"),
    (["workload.stream.window=1GiB"], "1 KiB to 512 MiB"),
    (["bottleneck=40Gbit"], "a link's rate is at most 34.3597Gbit"),
    (["buffer=5GiB"], "a queue holds at most 4 GiB"),
    (["delay=1e30s"], "a delay or jitter is at most 60s"),
    (["ip_version=6", "mtu=1000"], "IPv6 needs links of at least 1280 bytes"),
    (["env=vm", "memory=500kB"], "a guest gets 64 MiB to 64 GiB"),
    (["description=title\x1b]0;pwned\x07"], "description: contains the control character U+001B"),
    (["name=evil\u202etxt.toml"], "name: contains the control character U+202E"),
]


def _vnetbench(*args: str, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vnetbench", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=600)


def _one_clear_line(proc: subprocess.CompletedProcess, needle: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr and proc.stdout == "", proc.stderr[-2000:]
    assert needle in proc.stderr, proc.stderr[-2000:]
    # one message: a first line, and at most the problem lines under it, none of them a wall of text
    assert all(len(line) <= 400 for line in proc.stderr.splitlines()), proc.stderr[:2000]


def test_each_class_through_plan(tmp_path):
    base = tmp_path / "base.toml"
    base.write_text(BASE)

    def one(case):
        sets, needle = case
        return case, _vnetbench("plan", str(base), *[a for s in sets for a in ("--set", s)])

    with ThreadPoolExecutor(max_workers=2) as pool:  # each is a fresh interpreter: two at a time
        for (sets, needle), proc in pool.map(one, BY_SET):
            _one_clear_line(proc, needle)


@pytest.mark.parametrize("content, needle", [
    (b'name = "x"\n[lab]\nbottleneck = "100Mbit"\n# caf\xe9\n', "line 4 is not UTF-8 (byte 0xe9)"),
    (('name = "x"\n[repeat]\nseed = ' + "9" * 5000 + "\n").encode(), "Exceeds the limit (4300 digits)"),
    (('name = "x"\n[matrix]\nz = ' + "[" * 500 + "]" * 500 + "\n").encode(), "nested too deep"),
])
def test_file_classes_through_plan(tmp_path, content, needle):
    path = tmp_path / "odd.toml"
    path.write_bytes(content)
    _one_clear_line(_vnetbench("plan", str(path)), needle)


# Issue 33, item 11: the six places where a held-out corpus of 590 files found a value of the wrong type or size
# reaching code that assumed the right one (a traceback each).
LINK = BASE + "[lab.link.bottleneck]\n"
WRONG_TYPES = [
    (LINK + 'schedule = {cycle = "10Mbit/1s 20Mbit/1s", direction = {a = 1}}\n', [],  # unhashable dict
     "lab.link.bottleneck.schedule: direction = {'a': 1}: a schedule applies in one of forward, reverse, both"),
    (BASE, ["loss=1" + "0" * 400], "(401 characters) is not a probability"),  # int too large for a float
    (LINK + 'both = {rate = "10Mbit"}\nforward = "x"\n', [],  # str is not a mapping
     "forward = 'x' must be a table of link conditions, as both is"),
    ('workload = "x"\n' + BASE.split("[workload")[0], ["duration=5s"], "workload is a string, not a table"),
    ("matrix = 5\n" + BASE, ["foo=1"], "matrix is an integer, not a table"),
    (BASE.replace('tool = "iperf3"', "tool = {}"), ["name=x"], "workload.stream.tool = '{}': not one vnetbench knows"),
]


@pytest.mark.parametrize("text, sets, needle", WRONG_TYPES)
def test_a_value_of_the_wrong_type_at_each_boundary_is_one_line(tmp_path, text, sets, needle):
    path = tmp_path / "odd.toml"
    path.write_text(text)
    _one_clear_line(_vnetbench("plan", str(path), *[a for s in sets for a in ("--set", s)]), needle)
    assert os.listdir(tmp_path) == ["odd.toml"]


def test_a_path_too_long(tmp_path):
    _one_clear_line(_vnetbench("plan", str(tmp_path / ("a" * 5000 + ".toml"))), "File name too long")


@pytest.mark.skipif(os.geteuid() != 0, reason="run checks root before anything else")
def test_run_refuses_the_same_before_anything_is_built_or_stored(tmp_path):
    base = tmp_path / "base.toml"
    base.write_text(BASE)
    db = tmp_path / "r.db"
    for sets, needle in (BY_SET[0], BY_SET[12], BY_SET[16]):
        proc = _vnetbench("run", str(base), "--db", str(db), "--no-progress",
                          *[a for s in sets for a in ("--set", s)])
        _one_clear_line(proc, needle)
    big = tmp_path / "big.toml"
    big.write_text(BASE + "[matrix]\nmtu = [" + ", ".join(str(1000 + i) for i in range(120)) + "]\nratio = ["
                   + ", ".join(str(1 + i) for i in range(100)) + "]\n")
    _one_clear_line(_vnetbench("run", str(big), "--db", str(db), "--no-progress"), "12,000 configurations")
    if db.exists():
        with sqlite3.connect(db) as con:
            assert con.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 0


def test_compare_and_report_take_runs_of_hundreds_of_repetitions(tmp_path):
    # the review's class "analysis": 516 repetitions and more raised OverflowError (an exact bound computed
    # with a binomial coefficient as a float); 600 is an ordinary latency study
    from vnetbench.report.html_synthetic import make_run
    from vnetbench.store.db import Store

    db = tmp_path / "r.db"
    with Store(db) as store:
        make_run(store, "many00000001", matrix={"ratio": [2.0], "proto": ["udp"]}, repetitions=600, series=False)
        make_run(store, "many00000002", matrix={"ratio": [2.0], "proto": ["udp"]}, repetitions=600, series=False,
                 seed=2, scale={"throughput.rx_mbps": 0.9})
    proc = _vnetbench("compare", "many00000001", "many00000002", "--db", str(db))
    assert proc.returncode == 0 and "600 vs 600 trials" in " ".join(proc.stdout.split()), proc.stderr[-2000:]
    assert "regressed" in proc.stdout
    proc = _vnetbench("report", "many00000001", "many00000002", "--db", str(db), "-o", str(tmp_path / "r.html"))
    assert proc.returncode == 0 and (tmp_path / "r.html").stat().st_size > 0, proc.stderr[-2000:]
