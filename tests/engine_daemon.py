"""Real container engines for tests and benchmarks (a dockerd, a Podman API service), started and stopped by
them, touching nothing of the machine's.

Each runs in a network namespace of its own (so its bridges, veths and iptables rules live and die there),
with its data, its runtime state and its socket in a directory of its own (so a system engine, if any, is
not disturbed). ``nsenter --net``, not ``ip netns exec``: the latter remounts /sys, hiding the cgroup
hierarchies the engines need.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from vnetbench.lab import engines

NETNS_PREFIX = "vnbtest-dockerd-"  # not vnb-*: `vnetbench clean` must never take it for a run's
PODMAN_NETNS_PREFIX = "vnbtest-podman-"
START_TIMEOUT_S = 60
PROGRAMS = {"docker": ("dockerd", "containerd", "runc", "docker"), "podman": ("podman", "conmon", "runc")}
PACKAGES = {"docker": "docker.io", "podman": "podman catatonit"}


def missing(kind: str = "docker") -> str | None:
    """Why a test engine of this kind cannot be started here (None: it can)."""
    for tool in PROGRAMS[kind]:
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install {PACKAGES[kind]}; make setup does)"
    if kind == "podman" and not os.path.exists("/usr/libexec/podman/catatonit"):
        return "catatonit (the init of Podman's containers) is not installed (apt-get install catatonit; make setup does)"
    if os.geteuid() != 0:
        return f"{kind} needs root"
    return None


@contextmanager
def engine(kind: str, *daemon_args: str) -> Iterator[str]:
    """A test engine of this kind; yields the url its clients take (DOCKER_HOST or CONTAINER_HOST)."""
    with (dockerd(*daemon_args) if kind == "docker" else podman_service()) as url:
        yield url


@contextmanager
def dockerd(*daemon_args: str) -> Iterator[str]:
    """Start dockerd (with `daemon_args`, e.g. --userland-proxy=false); yield its DOCKER_HOST url; stop it and
    remove everything it had."""
    why = missing()
    if why:
        raise RuntimeError(why)
    home = Path(tempfile.mkdtemp(prefix="vnbtest-dockerd-"))
    sock = home / "docker.sock"
    url = f"unix://{sock}"
    _remove_dead_ones()
    netns = _netns_name(NETNS_PREFIX)
    subprocess.run(["ip", "netns", "add", netns], check=True)
    subprocess.run(["ip", "-n", netns, "link", "set", "lo", "up"], check=True)
    log = open(home / "dockerd.log", "wb")
    proc = subprocess.Popen(["nsenter", f"--net=/run/netns/{netns}", "dockerd", "--data-root", str(home / "data"),
                             "--exec-root", str(home / "exec"), "--pidfile", str(home / "dockerd.pid"), "-H", url,
                             "--storage-driver", "overlay2", *daemon_args],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while subprocess.run(["docker", "-H", url, "info"], capture_output=True).returncode != 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dockerd did not start: {(home / 'dockerd.log').read_text()[-2000:]}")
            time.sleep(0.2)
        yield url
    finally:
        _stop(proc, home, netns)  # dockerd stops its containerd itself
        log.close()


@contextmanager
def podman_service() -> Iterator[str]:
    """Start Podman's API service (`podman system service`) with storage, runtime state and network
    configuration of its own; yield its CONTAINER_HOST url; stop it, with every container it ran."""
    why = missing("podman")
    if why:
        raise RuntimeError(why)
    home = Path(tempfile.mkdtemp(prefix="vnbtest-podman-"))
    url = f"unix://{home / 'podman.sock'}"
    _remove_dead_ones()
    netns = _netns_name(PODMAN_NETNS_PREFIX)
    subprocess.run(["ip", "netns", "add", netns], check=True)
    subprocess.run(["ip", "-n", netns, "link", "set", "lo", "up"], check=True)
    # Every place Podman keeps state, under `home`: the same flags reach conmon's clean-up command.
    flags = ["--root", str(home / "root"), "--runroot", str(home / "run"), "--tmpdir", str(home / "tmp"),
             "--network-config-dir", str(home / "net"), "--events-backend", "file"]
    log = open(home / "podman.log", "wb")
    proc = subprocess.Popen(["nsenter", f"--net=/run/netns/{netns}", "podman", *flags, "system", "service",
                             "--time=0", url], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    remote = ["podman", "--remote", "--url", url]
    cni_before = set(engines.cni_state(""))
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while subprocess.run([*remote, "info"], capture_output=True).returncode != 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"podman system service did not start: {(home / 'podman.log').read_text()[-2000:]}")
            time.sleep(0.2)
        yield url
    finally:
        # Podman's containers outlive its API service (conmon holds each): they go first, with the networks.
        subprocess.run([*remote, "rm", "--all", "--force", "--time", "0"], capture_output=True, timeout=120)
        networks = subprocess.run([*remote, "network", "ls", "--format", "{{.Name}}"], capture_output=True,
                                  text=True).stdout.split()
        for name in networks:
            if name != "podman":
                subprocess.run([*remote, "network", "rm", "--force", name], capture_output=True)
        for state in set(engines.cni_state("")) - cni_before:  # this engine's networks', removed by whoever made them
            engines.forget_cni_state(state.name)
        _stop(proc, home, netns)
        log.close()


def _stop(proc: subprocess.Popen, home: Path, netns: str) -> None:
    """Stop an engine (SIGTERM, SIGKILL to its session after 30 s), then remove its directory and namespace,
    with whatever an engine killed hard left mounted there."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    # Podman keeps a conmon for each exec session 300 s after it ends (--exit-delay, so that its exit code can be
    # inspected), then runs `podman container cleanup` with this engine's --root, which mounts the storage again
    # in a directory already removed. So what is left of them goes now (a cleanup under way gets 2 s to finish),
    # before the storage is unmounted and removed; nothing of this engine may outlive it.
    deadline = time.monotonic() + 2
    while (left := processes_naming(home)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in processes_naming(home):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    unmount_under(home)
    subprocess.run(["ip", "netns", "del", netns], capture_output=True)
    shutil.rmtree(home, ignore_errors=True)
    if home.exists() or mounted_under(home):
        raise RuntimeError(f"test engine left {home} behind (mounts: {mounted_under(home)}, processes: {left})")


def processes_naming(home: Path) -> list[int]:
    """Processes whose command line names `home` (the engine's own helpers: conmon, podman cleanup)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if str(home).encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def mounted_under(home: Path) -> list[str]:
    return [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
            if line.split()[1].startswith(str(home))]


def unmount_under(home: Path) -> None:
    for m in sorted(mounted_under(home), key=len, reverse=True):
        subprocess.run(["umount", "-l", m], capture_output=True)


_started = itertools.count(1)


def _netns_name(prefix: str) -> str:
    """<prefix><pid>-<n>: a test and a benchmark may each have engines, and one test process several at once."""
    return f"{prefix}{os.getpid()}-{next(_started)}"


def _remove_dead_ones() -> None:
    """The namespaces of test engines whose process was killed before it could stop them."""
    for name in os.listdir("/run/netns") if os.path.isdir("/run/netns") else []:
        for prefix in (NETNS_PREFIX, PODMAN_NETNS_PREFIX):
            pid = name[len(prefix):].partition("-")[0]
            if name.startswith(prefix) and not os.path.exists(f"/proc/{pid}"):
                subprocess.run(["ip", "netns", "del", name], capture_output=True)
