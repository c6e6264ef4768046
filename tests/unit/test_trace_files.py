"""Trace files (issue 33, item 9): a scenario may name any path as its trace, and vnetbench reads it as root. What
is read must be a regular file of plausible size, read without blocking and within a time; no message quotes
what the file holds (a 0600 secret and /proc/self/environ leaked 40 characters); `plan` says so in one line,
quickly, and changes nothing."""

from __future__ import annotations

import os
import time

import pytest

from helpers import cli, tree_state
from vnetbench import userfiles
from vnetbench.impair import trace as T

BASE = ('name = "trace"\n[lab]\nsenders = 1\nbottleneck = "100Mbit"\nbottleneck_schedule = "trace:{}"\n'
        '[workload.stream]\ntool = "iperf3"\nduration = "2s"\n')
SECRET = "API_TOKEN=hunter2-0123456789abcdef"


def _cases(tmp_path):
    secret = tmp_path / "secret.env"
    secret.write_text(SECRET + "\n")
    secret.chmod(0o600)
    os.mkfifo(tmp_path / "fifo")  # would block a reader for ever
    (tmp_path / "environ-link").symlink_to("/proc/self/environ")
    (tmp_path / "kmsg-link").symlink_to("/proc/kmsg")
    (tmp_path / "dir").mkdir()
    (tmp_path / "empty").touch()
    return [
        (secret, "line 1 is not one whole number of milliseconds"),
        ("/proc/self/environ", "is under /proc, a kernel or device file"),
        ("/proc/kmsg", "is under /proc, a kernel or device file"),  # regular, says it is empty, blocks
        (tmp_path / "environ-link", "is under /proc, a kernel or device file"),
        (tmp_path / "kmsg-link", "is under /proc, a kernel or device file"),
        ("/dev/zero", "is under /dev, a kernel or device file"),
        ("/sys/kernel/notes", "is under /sys, a kernel or device file"),
        (tmp_path / "fifo", "is not a regular file"),
        (tmp_path / "dir", "is not a regular file"),
        (tmp_path / "empty", "is empty"),
    ]


def test_plan_refuses_what_is_no_trace_quickly_and_quotes_nothing_of_it(tmp_path):
    cases = _cases(tmp_path)
    environ = open("/proc/self/environ", "rb").read().decode(errors="replace").split("\0")
    values = [v.split("=", 1)[1] for v in environ if "=" in v]
    secrets = [SECRET, "hunter2", *(v for v in values if len(v) >= 12 and "/" not in v)]  # paths may be said
    for i, (path, _) in enumerate(cases):
        (tmp_path / f"s{i}.toml").write_text(BASE.format(path))
    before = tree_state(tmp_path)
    for i, (path, needle) in enumerate(cases):
        started = time.monotonic()
        proc = cli("plan", str(tmp_path / f"s{i}.toml"), check=False, timeout=120)
        assert proc.returncode == 2 and needle in proc.stderr and "Traceback" not in proc.stderr, (path, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) <= 2, proc.stderr  # the file's line and its one problem
        for s in secrets:
            assert s not in proc.stderr + proc.stdout, (path, "quoted what the file holds")
        assert time.monotonic() - started < 60, path
    assert tree_state(tmp_path) == before  # nothing read was changed, no FIFO opened and left waiting


def test_a_trace_is_read_within_a_time(tmp_path, monkeypatch):
    trace = tmp_path / "t.trace"
    trace.write_text("".join(f"{i}\n" for i in range(1, 100)))
    T._parsed.clear()
    monkeypatch.setattr(userfiles, "READ_TIMEOUT_S", -1.0)  # as if the disk had stopped answering
    with pytest.raises(ValueError, match=r"could not be read within -1 s .*copy it to a local disk"):
        T.read_mahimahi(trace)
    monkeypatch.setattr(userfiles, "READ_TIMEOUT_S", 30.0)
    assert T.read_mahimahi(trace).opportunities == 99


def test_a_fifo_swapped_in_after_the_check_does_not_block(tmp_path, monkeypatch):
    """The path is checked, then opened: a FIFO put there in between opens without a writer (O_NONBLOCK) and
    is refused as it was opened."""
    path = tmp_path / "t.trace"
    path.write_text("1\n")
    real = os.path.realpath

    def swap(p, *a, **k):  # the check's own look at the path, then the swap
        out = real(p, *a, **k)
        if str(p) == str(path) and path.is_file():
            path.unlink()
            os.mkfifo(path)
        return out

    monkeypatch.setattr(os.path, "realpath", swap)
    started = time.monotonic()
    with pytest.raises(ValueError, match="is not a regular file"):
        T.read_mahimahi(path)
    assert time.monotonic() - started < 5
