"""`vnetbench clean` and the temp directory: what a killed run left there (its work directory, the SSH
control directory of a vnetbench that is gone) is found and removed; what is in use, or not ours, is not."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest

from vnetbench.lab import clean


@pytest.fixture
def tmp(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_leftover_directories_are_told_from_those_in_use(tmp):
    killed = tmp / "vnetbench-vnb-abc123-k2j3"  # a killed run's work directory
    measuring = tmp / "vnetbench-vnb-live00-x9"  # the run measuring now
    gone = tmp / f"vnb-ssh-{dead_pid()}-q1"  # a killed vnetbench's ssh control directory
    in_use = tmp / f"vnb-ssh-{os.getpid()}-q2"  # this process's
    for d in (killed, measuring, gone, in_use):
        d.mkdir()
    (gone / "socket-left").write_text("")
    planted = tmp / "vnetbench-vnb-zzz999-p"  # a symlink someone planted: never followed, never removed
    planted.symlink_to(tmp / "elsewhere")
    (tmp / "elsewhere").mkdir()
    (tmp / "vnetbench-other").mkdir()  # not a run's
    assert clean.file_leftovers(skip=("vnb-live00-",)) == sorted([killed, gone])
    assert clean.file_leftovers(prefix="vnb-abc123-") == [killed]  # one run: its work directory only
    assert clean.file_leftovers(prefix="vnb-live00-", skip=()) == [measuring]


def test_clean_removes_them_and_says_so(tmp):
    killed = tmp / "vnetbench-vnb-abc123-k2j3"
    (killed / "p0-r0").mkdir(parents=True)
    (killed / "p0-r0" / "stream.out").write_text("{}")
    # Only this run's prefix: a clean of everything would also take the namespaces of any lab up beside the
    # unit tests (a lab test's fixture, another run), and did, killing their tools mid-trial.
    report = clean.clean(prefix="vnb-abc123-", dry_run=True)
    assert report.files == [str(killed)] and killed.exists()
    report = clean.clean(prefix="vnb-abc123-")
    assert report.files == [str(killed)] and not killed.exists() and not report.errors


def test_a_file_that_goes_while_a_directory_is_removed_is_no_error():
    """An ssh master removes its socket as it exits, while clean removes its directory."""
    from vnetbench.lab.clean import _gone_is_fine

    gone = FileNotFoundError(2, "No such file or directory")
    assert _gone_is_fine(os.unlink, "/tmp/x", (FileNotFoundError, gone, None)) is None
    with pytest.raises(PermissionError):
        _gone_is_fine(os.unlink, "/tmp/x", (PermissionError, PermissionError(13, "denied"), None))


@pytest.mark.skipif(os.geteuid() != 0, reason="makes a network namespace: run as root")
def test_a_live_processs_probe_namespace_is_not_a_leftover_a_dead_ones_is():
    """`doctor` and a run's capability check probe qdiscs in a namespace named with their pid for a moment:
    `clean` must neither report it (`clean --check` failed beside a running doctor) nor remove it under them."""
    from vnetbench.lab import netns

    owner = subprocess.Popen(["sleep", "60"])
    name = f"{netns.PREFIX}probe-{owner.pid}"
    netns.create(name)
    try:
        assert netns.transient_owner(name) == owner.pid and netns.transient_owner("vnb-abcdef-s1") is None
        assert name not in clean.leftovers()
        owner.kill()
        owner.wait()
        assert name in clean.leftovers()  # its process is gone: a leftover like any other
    finally:
        owner.kill()
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
