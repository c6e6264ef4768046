"""A real dockerd for tests and benchmarks, started and stopped by them, touching nothing of the machine's.

It runs in a network namespace of its own (so its bridges, veths and iptables rules live and die there),
with its data, its runtime state and its socket in a directory of its own (so a system dockerd, if any, is
not disturbed). ``nsenter --net``, not ``ip netns exec``: the latter remounts /sys, hiding the cgroup
hierarchies dockerd needs.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

NETNS_PREFIX = "vnbtest-dockerd-"  # not vnb-*: `vnetbench clean` must never take it for a run's
START_TIMEOUT_S = 60


def missing() -> str | None:
    """Why a test dockerd cannot be started here (None: it can)."""
    for tool in ("dockerd", "containerd", "runc", "docker"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install docker.io; make setup does)"
    if os.geteuid() != 0:
        return "dockerd needs root"
    return None


@contextmanager
def dockerd() -> Iterator[str]:
    """Start dockerd; yield its DOCKER_HOST url; stop it and remove everything it had."""
    why = missing()
    if why:
        raise RuntimeError(why)
    home = Path(tempfile.mkdtemp(prefix="vnbtest-dockerd-"))
    sock = home / "docker.sock"
    url = f"unix://{sock}"
    _remove_dead_ones()
    netns = f"{NETNS_PREFIX}{os.getpid()}"  # one per process: a test and a benchmark may each have one
    subprocess.run(["ip", "netns", "add", netns], check=True)
    subprocess.run(["ip", "-n", netns, "link", "set", "lo", "up"], check=True)
    log = open(home / "dockerd.log", "wb")
    proc = subprocess.Popen(["nsenter", f"--net=/run/netns/{netns}", "dockerd", "--data-root", str(home / "data"),
                             "--exec-root", str(home / "exec"), "--pidfile", str(home / "dockerd.pid"), "-H", url,
                             "--storage-driver", "overlay2"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while subprocess.run(["docker", "-H", url, "info"], capture_output=True).returncode != 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dockerd did not start: {(home / 'dockerd.log').read_text()[-2000:]}")
            time.sleep(0.2)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)  # dockerd stops its containerd itself
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        log.close()
        # What a dockerd killed hard may have left mounted under its directory.
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
                  if line.split()[1].startswith(str(home))]
        for m in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "-l", m], capture_output=True)
        subprocess.run(["ip", "netns", "del", netns], capture_output=True)
        shutil.rmtree(home, ignore_errors=True)


def _remove_dead_ones() -> None:
    """The namespaces of test dockerds whose process was killed before it could stop them."""
    for name in os.listdir("/run/netns") if os.path.isdir("/run/netns") else []:
        if name.startswith(NETNS_PREFIX) and not os.path.exists(f"/proc/{name[len(NETNS_PREFIX):]}"):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
