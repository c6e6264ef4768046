"""The exec wrapper every command goes through on a node whose command channel does not stop a command when
the channel goes (SSH hosts, QEMU guests, containers): run here under the shells those nodes have (dash as a
Debian host's sh, busybox's as a guest's), with real processes."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from vnetbench.lab.guest.initramfs import RUN_WRAPPER
from vnetbench.lab.nodes import exec_wrapper, run_holding_input

BUSYBOX = shutil.which("busybox")
SHELLS = [pytest.param(["sh", "-c", exec_wrapper("", "on this host"), "vnb-exec"], id="host sh"),
          pytest.param([BUSYBOX or "busybox", "sh", "-c", RUN_WRAPPER, "vnb-run"], id="guest busybox sh",
                       marks=pytest.mark.skipif(BUSYBOX is None, reason="busybox-static is not installed"))]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("wrapper", SHELLS)
def test_output_and_exit_status_pass_through(wrapper):
    out = run_holding_input([*wrapper, "sh", "-c", "echo out; echo err >&2; exit 3"], timeout=10)
    assert (out.returncode, out.stdout, out.stderr) == (3, "out\n", "err\n")


@pytest.mark.parametrize("wrapper", SHELLS)
def test_a_missing_program_is_named(wrapper):
    out = run_holding_input([*wrapper, "vnb-no-such-tool"], timeout=10)
    assert out.returncode == 127 and "vnb-no-such-tool: command not found" in out.stderr


@pytest.mark.parametrize("wrapper", SHELLS)
def test_closing_its_input_ends_the_command_and_what_it_started(wrapper, tmp_path):
    """As when the local ssh client is killed: its channel closes, and the command's input with it."""
    pids = tmp_path / "pids"
    proc = subprocess.Popen([*wrapper, "sh", "-c", f'sleep 300 & echo $$ $! > {pids}; wait'],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not pids.exists() or len(pids.read_text().split()) < 2:
            assert time.monotonic() < deadline, "the command never started"
            time.sleep(0.02)
        started = [int(p) for p in pids.read_text().split()]
        assert all(alive(p) for p in started)
        proc.stdin.close()
        proc.wait(timeout=10)
        deadline = time.monotonic() + 5  # SIGTERM at once, SIGKILL 2 s later
        while any(alive(p) for p in started):
            assert time.monotonic() < deadline, f"outlived its input: {[p for p in started if alive(p)]}"
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("wrapper", SHELLS)
def test_cpu_pinning(wrapper):
    cpu = sorted(os.sched_getaffinity(0))[-1]
    out = run_holding_input([*wrapper, "-c", str(cpu), "grep", "Cpus_allowed_list", "/proc/self/status"], timeout=10)
    assert out.returncode == 0 and out.stdout.split()[-1] == str(cpu), out
