"""The files a run's tools write (issue 33, high): named by index, made new, inside the run's directory.

TrialContext.popen used to name a trial's output files after the workload or the inventory host (a label),
and the lab's popen opened them with open(): a workload called "../../../../etc/cron.daily/x" made root
create or truncate /etc/cron.daily/x.out. The names are now indices, and vnetbench.runfiles makes each file
new (O_EXCL | O_NOFOLLOW, 0600) in a directory that resolves inside the run's. Each attack aims at a "victim"
directory of the test's own (never the real /etc), and each test asserts that nothing there changed.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings

from helpers import hostile_names, tree_state
from vnetbench import runfiles
from vnetbench.errors import LabError
from vnetbench.lab.nodes import RunsCommands
from vnetbench.lab.teardown import Registry
from vnetbench.runner.bench import DumbbellBench
from vnetbench.workloads.base import TrialContext, TrialEndpoints


class LocalNode(RunsCommands):
    """A node that runs its commands here, as the lab's namespaces do (without a namespace)."""

    name = "r"

    def __init__(self) -> None:
        self.registry = Registry()

    def command(self, argv, pin=True, timed=False):
        return list(argv)


def _trial(tmp_path: Path) -> tuple[TrialContext, Path, Path]:
    """A run's work directory with a trial directory in it, as DumbbellBench.run_trial makes them, beside a
    victim directory (the attack climbs out of the trial directory to reach it)."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "x.out").write_text("precious\n")  # a file the attack would have truncated
    trial = tmp_path / "vnetbench-vnb-1234-abc" / "p0-r0"
    trial.mkdir(parents=True)
    ctx = TrialContext(config=None, endpoints=TrialEndpoints(LocalNode(), []), ip_version=4, tmp=trial, t0=0.0)
    return ctx, trial, victim


def _run(ctx: TrialContext, label: str) -> tuple[subprocess.Popen, Path]:
    proc, out = ctx.popen(ctx.endpoints.receiver, label, ["sh", "-c", "echo said; echo complained >&2"])
    proc.wait(timeout=10)
    return proc, out


# ------------------------------------------------------------------ the finding, as `run` would meet it


def test_a_workload_named_as_a_path_writes_only_in_its_trial_directory(tmp_path):
    ctx, trial, victim = _trial(tmp_path)
    before = tree_state(victim)
    depth = len(trial.parts) - 1  # enough "../" to reach "/" from the trial directory, as in the review
    proc, out = _run(ctx, "../" * depth + str(victim / "x").lstrip("/"))
    assert tree_state(victim) == before
    assert sorted(p.name for p in trial.iterdir()) == ["0.err", "0.out"] and out == trial / "0.out"
    assert out.read_text() == "said\n" and (trial / "0.err").read_text() == "complained\n"
    assert (out.stat().st_mode & 0o777) == 0o600
    assert ctx.labels == {"0": "../" * depth + str(victim / "x").lstrip("/")}  # the raw record's key


def test_each_process_of_a_trial_has_files_of_its_own(tmp_path):
    # Two clients with the same label (one workload on two senders) used to share, and truncate, one file.
    ctx, trial, _ = _trial(tmp_path)
    outs = [_run(ctx, "probe")[1] for _ in range(3)]
    assert [o.name for o in outs] == ["0.out", "1.out", "2.out"] and all(o.read_text() == "said\n" for o in outs)


# ------------------------------------------------------------------ the sink: new files, in the run's directory


def test_a_link_planted_at_an_output_name_is_replaced_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "passwd").write_text("root:x:0:0\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "0.out").symlink_to(victim / "passwd")
    os.mkfifo(run / "0.err")  # opened for writing, a FIFO would block the run until someone reads it
    before = tree_state(victim)
    for name in ("0.out", "0.err"):
        with runfiles.create(run / name) as f:
            f.write(b"output\n")
    assert tree_state(victim) == before
    assert not (run / "0.out").is_symlink() and (run / "0.out").read_text() == "output\n"
    assert (run / "0.err").is_file() and (run / "0.err").read_text() == "output\n"


def test_a_device_socket_or_directory_at_an_output_name_is_left_alone(tmp_path):
    """A caller that named /dev/null as a process's output had the device node removed and replaced by a
    regular file (every later `>/dev/null` on the machine then wrote to it, and tmux could not start): only an
    old output, a link or a FIFO is removed; anything else is refused and left as it was."""
    import socket
    import stat as st

    run = tmp_path / "run"
    run.mkdir()
    os.mknod(run / "null", 0o666 | st.S_IFCHR, os.makedev(1, 3))
    (run / "1.out").mkdir()
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(run / "2.out"))
    try:
        before = {p.name: os.lstat(p) for p in run.iterdir()}
        for name in ("null", "1.out", "2.out"):
            with pytest.raises(LabError, match="nothing was removed or written"):
                runfiles.create(run / name)
        after = {p.name: os.lstat(p) for p in run.iterdir()}
        assert {n: (s.st_ino, s.st_mode) for n, s in after.items()} == \
               {n: (s.st_ino, s.st_mode) for n, s in before.items()}
        assert st.S_ISCHR(os.lstat(run / "null").st_mode)
    finally:
        listener.close()


def test_a_directory_that_resolves_outside_the_run_is_refused(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    run = tmp_path / "run"
    run.mkdir()
    (run / "p0-r0").symlink_to(victim)  # a trial directory swapped for a link out
    with pytest.raises(LabError, match="outside the run's directory"):
        runfiles.create(run / "p0-r0" / "0.out", within=run)
    assert list(victim.iterdir()) == []


def test_a_trial_directory_swapped_for_a_link_out_is_refused(tmp_path):
    ctx, trial, victim = _trial(tmp_path)
    trial.rmdir()
    trial.symlink_to(victim)
    before = tree_state(victim)
    with pytest.raises(LabError, match="outside the run's directory"):
        _run(ctx, "probe")
    assert tree_state(victim) == before


@pytest.mark.parametrize("name", ["../x.out", "a/../../x.out", "x\n.out", ".hidden", "-x", "", "é.out"])
def test_only_names_vnetbench_makes_are_opened(tmp_path, name):
    with pytest.raises(LabError, match="not a file name vnetbench makes"):
        runfiles.create(tmp_path / "run" / name if name else tmp_path / "run" / "x" / "..")
    assert list(tmp_path.iterdir()) == []


def test_server_files_are_named_by_index_not_by_host(tmp_path):
    bench = DumbbellBench("vnb-test-", senders=1, workdir=tmp_path / "run")
    out, err = bench._server_files("../../victim/x:iperf3-5201")  # a host name as an inventory could write it
    assert (out.parent, out.name, err.name) == (tmp_path / "run", "server-0.out", "server-0.err")
    assert bench._server_files("client-1:iperf3-5201")[0].name == "server-1.out"
    assert bench._server_files("../../victim/x:iperf3-5201")[0].name == "server-0.out"  # the same server again


# ------------------------------------------------------------------ properties


@settings(max_examples=200, deadline=None)
@given(label=hostile_names())
def test_no_label_makes_a_file_outside_its_trial_directory(tmp_path_factory, label):
    tmp_path = tmp_path_factory.mktemp("trial")
    ctx, trial, victim = _trial(tmp_path)
    before = tree_state(tmp_path)
    _run(ctx, label)
    after = tree_state(tmp_path)
    made = {p for p in after if p not in before}
    assert made == {str((trial / n).relative_to(tmp_path)) for n in ("0.out", "0.err")}
    assert {p: s for p, s in after.items() if p in before and p != str(trial.relative_to(tmp_path))} \
        == {p: s for p, s in before.items() if p != str(trial.relative_to(tmp_path))}
