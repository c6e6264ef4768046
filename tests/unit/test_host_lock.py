"""The hosts' run lock script (hosts/lock.py), run here with sh as a host's login shell would: one holder at
a time per network namespace, the others told who holds it, and nothing of the holder's left when it ends."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from vnetbench.hosts.lock import BUSY, LOCK_SCRIPT

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="makes a network namespace (root)")


def test_one_holder_per_network_namespace_and_the_others_told_who():
    # The holder in a namespace of its own, so that this machine's own lock is never touched.
    holder = subprocess.Popen(["unshare", "--net", "sh", "-c", LOCK_SCRIPT, "vnetbench-lock", "run A (scenario 'x')"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lock_file = None
    try:
        first = holder.stdout.readline().strip()
        assert first.startswith("locked ") and "/vnetbench-net" in first, (first, holder.stderr)
        lock_file = Path(first.split(" ", 1)[1])
        owner = Path(f"{lock_file}.owner-0")
        assert owner.read_text() == "run A (scenario 'x')\n"
        same_ns = ["nsenter", f"--net=/proc/{holder.pid}/ns/net", "sh", "-c", LOCK_SCRIPT, "vnetbench-lock"]
        busy = subprocess.run([*same_ns, "run B"], capture_output=True, text=True, timeout=10)
        assert busy.returncode == BUSY and busy.stdout.splitlines() == ["busy", "run A (scenario 'x')"]
        elsewhere = subprocess.Popen(["unshare", "--net", "sh", "-c", LOCK_SCRIPT, "vnetbench-lock", "run C"],
                                     stdout=subprocess.PIPE, text=True)
        other = elsewhere.stdout.readline().strip()
        elsewhere.send_signal(signal.SIGTERM)
        assert elsewhere.wait(10) == 0 and other.startswith("locked ") and other != first  # another host's
        Path(other.split(" ", 1)[1]).unlink()
        holder.send_signal(signal.SIGTERM)  # what the hosts' wrapper sends when the run's session goes
        assert holder.wait(10) == 0 and not owner.exists()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        if lock_file is not None:
            lock_file.unlink(missing_ok=True)
