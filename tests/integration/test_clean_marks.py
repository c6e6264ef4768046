"""`vnetbench clean` removes only what vnetbench made (issue 33, item 8): a vnb-* namespace or cgroup without
vnetbench's mark is someone else's and is left alone with its processes; the machine's own namespace under a
name vnetbench gave it never has its processes signalled; what a killed run made is removed with its marks."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from vnetbench.errors import EnvironmentProblem
from vnetbench.lab import cgroups, clean, marks, netns
from helpers import cli

pytestmark = pytest.mark.lab
RUN = "vnb-c1ea00"  # a run's shape of name, of no run


def _sleeper_in(ns: str) -> subprocess.Popen:
    return subprocess.Popen(["ip", "netns", "exec", ns, "sleep", "300"], start_new_session=True)


def _alive(proc: subprocess.Popen) -> bool:
    return proc.poll() is None


def test_a_namespace_vnetbench_did_not_make_is_left_alone_with_its_processes():
    name = f"{RUN}-theirs"
    subprocess.run(["ip", "netns", "add", name], check=True)  # named like ours, made by someone else
    proc = _sleeper_in(name)
    try:
        time.sleep(0.2)
        out = cli("clean").stdout
        assert netns.exists(name) and _alive(proc)
        assert f"left alone: namespace {name}, which vnetbench did not make" in out
        check = cli("clean", "--check")
        assert check.returncode == 0 and f"not vnetbench's (no mark, left alone): namespace {name}" in check.stdout
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        subprocess.run(["ip", "netns", "del", name], check=True)


def test_a_users_vnb_cgroup_and_its_process_are_left_alone():
    mount = cgroups.mount_for("cpu")
    if mount is None:
        pytest.skip("no cpu cgroup controller here")
    path = cgroups._parent_dir(mount, "cpu") / "vnb-nightly.service"  # a user's unit running a campaign
    path.mkdir()
    proc = subprocess.Popen(["sleep", "300"])
    try:
        (path / "cgroup.procs").write_text(str(proc.pid))
        out = cli("clean").stdout
        assert path.exists() and _alive(proc)
        assert "vnb-nightly.service" in out and "did not make" in out
    finally:
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 5
        while True:
            try:
                path.rmdir()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


def test_the_machines_own_namespace_under_a_name_we_gave_is_only_unnamed():
    name = f"{RUN}-own"  # not *.foreign: the guard must hold for any name
    netns.attach(name, os.getpid())  # the machine's own namespace, as a system dockerd's would be
    try:
        assert netns.is_hosts_own(name)
        dry = clean.clean(prefix=f"{RUN}-", dry_run=True)
        assert dry.namespaces == [name] and dry.processes == []  # never every process of the machine
        cli("clean", "--run", RUN[4:])
        assert not netns.exists(name) and not marks.is_marked("netns", name)
    finally:
        netns.remove(name)


def test_what_a_killed_run_made_goes_with_its_marks_and_stale_marks_are_swept():
    made = f"{RUN}-left"
    netns.create(made)  # as a run's lab does, then killed: the namespace and its mark stay
    marks.mark("netns", f"{RUN}-gone")  # a mark whose namespace someone removed with ip netns del
    assert marks.is_marked("netns", made)
    cli("clean")
    assert not netns.exists(made)
    assert not marks.is_marked("netns", made) and not marks.is_marked("netns", f"{RUN}-gone")


def test_the_marks_directory_must_be_roots_and_closed(tmp_path, monkeypatch):
    monkeypatch.setattr(marks, "MARKS_DIR", tmp_path / "vnetbench" / "made")
    marks.mark("netns", "vnb-abc123-x")
    assert marks.marked("netns") == ["vnb-abc123-x"]
    (tmp_path / "vnetbench" / "made").chmod(0o777)
    with pytest.raises(EnvironmentProblem, match=r"made can be written by others \(mode 777\).*rm -rf"):
        marks.mark("netns", "vnb-abc123-y")
    (tmp_path / "vnetbench" / "made").chmod(0o700)
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    os.rename(tmp_path / "vnetbench" / "made" / "netns", tmp_path / "netns-moved")
    (tmp_path / "vnetbench" / "made" / "netns").symlink_to(target)
    with pytest.raises(EnvironmentProblem, match="is not a directory"):
        marks.mark("netns", "vnb-abc123-z")
    assert list(target.iterdir()) == []
    with pytest.raises(ValueError, match="not a plain name"):
        marks.mark("cgroup", "../../etc/x")
    assert Path(tmp_path / "vnetbench").stat().st_mode & 0o022 == 0
