"""Every program vnetbench runs, declared once: its command, the Debian package that provides it, and how its
version is read.

Preflight (`run`, `plan`), `doctor`, the hosts' checks, the guest and container images and the fingerprint
take their tools from here; the Makefile's package list is checked against :data:`ALL` and
:data:`SUPPORT_PACKAGES` by a test (tests/unit/test_tools.py), so a tool cannot be used without the set-up
installing it, nor a package installed that nothing uses.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from vnetbench.errors import EnvironmentProblem


@dataclass(frozen=True)
class Tool:
    command: str
    package: str  # the Debian package that provides it
    version_args: tuple[str, ...] = ("--version",)  # empty: the tool has no version flag (its package's is used)

    def path(self) -> str | None:
        return shutil.which(self.command)

    def version(self) -> str | None:
        exe = self.path()
        if exe is None:
            return None
        if not self.version_args:
            return self._package_version()
        try:
            out = subprocess.run([exe, *self.version_args], capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            return None
        text = (out.stdout or out.stderr).strip().splitlines()
        return text[0].strip() if text else None

    def _package_version(self) -> str | None:
        try:
            out = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", self.package], capture_output=True,
                                 text=True, timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return f"{self.command} {out.stdout.strip()} (Debian package {self.package})" if out.returncode == 0 \
            and out.stdout.strip() else None


# The lab's own and every endpoint's.
IP = Tool("ip", "iproute2", ("-V",))
TC = Tool("tc", "iproute2", ("-V",))
SS = Tool("ss", "iproute2", ("-V",))
TASKSET = Tool("taskset", "util-linux", ("--version",))
FLOCK = Tool("flock", "util-linux", ("--version",))
ETHTOOL = Tool("ethtool", "ethtool", ("--version",))
NFT = Tool("nft", "nftables", ("--version",))  # containers' NAT and published ports
# The workloads' (each workload module names the ones it needs).
IPERF3 = Tool("iperf3", "iperf3")
PING = Tool("ping", "iputils-ping", ("-V",))
SOCKPERF = Tool("sockperf", "sockperf", ("--version",))
WRK = Tool("wrk", "wrk", ("--version",))
AB = Tool("ab", "apache2-utils", ("-V",))
NGINX = Tool("nginx", "nginx-light", ("-v",))
SYSBENCH = Tool("sysbench", "sysbench", ("--version",))
MBW = Tool("mbw", "mbw", ())  # mbw has no version flag; -h prints its usage
IRTT = Tool("irtt", "irtt", ("version",))
# The guests': their emulator, their command channel, and what their image is made of.
QEMU = Tool("qemu-system-x86_64", "qemu-system-x86", ("--version",))
DROPBEAR = Tool("dropbear", "dropbear-bin", ("-V",))
DROPBEARKEY = Tool("dropbearkey", "dropbear-bin", ())
SSH = Tool("ssh", "openssh-client", ("-V",))  # the controller's: to guests and to real hosts
SSH_KEYGEN = Tool("ssh-keygen", "openssh-client", ())
BUSYBOX = Tool("busybox", "busybox-static", ())
DATE = Tool("date", "coreutils")  # GNU date: steps a guest's clock by a fractional offset (busybox's: whole seconds)
# For the user's own looking at the wire; doctor reports it.
TCPDUMP = Tool("tcpdump", "tcpdump", ("--version",))
SKOPEO = Tool("skopeo", "skopeo", ("--version",))  # the tools image to a cluster's registry (kube.registry)

ALL: tuple[Tool, ...] = (IP, TC, SS, TASKSET, FLOCK, ETHTOOL, NFT, IPERF3, PING, SOCKPERF, WRK, AB, NGINX, SYSBENCH,
                         MBW, IRTT, QEMU, DROPBEAR, DROPBEARKEY, SSH, SSH_KEYGEN, BUSYBOX, DATE, TCPDUMP,
                         SKOPEO)

# Packages the set-up installs that provide no tool of the table, and why.
SUPPORT_PACKAGES: dict[str, str] = {
    "procps": "pgrep/pkill and /proc readers the lab's scripts use",
    "kmod": "modprobe: kernel modules of qdiscs and guest NICs",
    "linux-image-amd64": "the guests' kernel and its modules",
    "zstd": "the guest kernel's compressed modules",
    "openssh-server": "the tests' real SSH hosts (tests/sshlab.py)",
    "docker.io": "env = \"docker\"",
    "podman": "env = \"podman\"",
    "catatonit": "podman's init inside its containers",
    "chromium": "the HTML report's browser tests",
    "python3-venv": "the Python environment of make setup",
    "tmux": "the terminal output's tests in a real terminal",
    "containerd": "the test Kubernetes cluster's nodes (tests/kubecluster.py)",
    "containernetworking-plugins": "the test Kubernetes cluster's pod network (bridge, host-local)",
    "gcc": "the test Kubernetes cluster's pause program (static)",
    "openssl": "the test Kubernetes cluster's certificates",
    "libc6-dev": "the static libc the pause program links",
}


def require(tools: list[Tool]) -> None:
    """Fail before anything is built if a tool is missing, naming its package."""
    missing = [t for t in tools if t.path() is None]
    if missing:
        pkgs = sorted({t.package for t in missing})
        names = ", ".join(t.command for t in missing)
        raise EnvironmentProblem(
            f"missing tool{'s' if len(missing) > 1 else ''}: {names}; install with: apt-get install {' '.join(pkgs)}"
        )
