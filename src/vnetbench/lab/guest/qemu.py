"""A QEMU guest in a host namespace: boot, reach over SSH, shut down.

::

    [ host ns ]                                             [ guest ]
      br0 ── tap0 ═══ -netdev tap ═══ NIC (virtio/e1000/...)  eth0 198.18.x.y, 2001:2::n
       │                                                       (the measured path)
      (uplink to the lab switch)
      mgmt0 198.19.0.1/30 ═══ -netdev tap ═══ virtio-net      mgmt0 198.19.0.2/30
                                                              dropbear (SSH) listens here only

Commands run in the guest over SSH, through the same connection class as real
hosts (:class:`vnetbench.hosts.ssh.SshConnection`): the OpenSSH client, run in
the host namespace, a connection per command (dropbear is not multiplexed on:
see that module), a key generated per guest,
the guest's host key pinned in a per-guest known_hosts and no setting of the
user's ~/.ssh/config. :meth:`Guest.command` returns an argv that behaves like
a local process, with the remote command's stdout, stderr and exit status;
its input is a pipe the caller holds (:func:`vnetbench.lab.nodes.run_holding_input`), and
when the local client ends the remote command ends too (``vnb-run`` in
:mod:`.initramfs`). The SSH channel has its own NIC on a link that is not
bridged anywhere, so control traffic never crosses the measured NIC, the
bridge or the lab switch, and every guest can use the same two addresses.

Accelerator: ``auto`` boots under KVM first and falls back to TCG when QEMU
fails to start or the guest does not answer within a short probe; which one
ran and why is in :meth:`Guest.facts`. The verdict is kept for the rest of the
process so later guests do not probe again.

Boot time is measured from starting QEMU to the first command that
succeeds over SSH. A guest that does not answer within its boot timeout
raises :class:`GuestBootError`; its serial console log is kept on disk.
What makes a TCG boot take ~4 s rather than ~10 s here (bench/environments_vm.py):
the kernel's ELF vmlinux booted through its PVH entry instead of the
self-decompressing bzImage, an uncompressed initramfs, no NIC option ROMs
(``romfile=``), a quiet console and no crypto self-tests.

The guest's clock starts from its RTC's whole second; :meth:`Guest.sync_clock`
steps it onto the host's (measured with ICMP timestamps, ±1-2 ms) so time
series recorded in the guest line up with the host's.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import struct
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from vnetbench.errors import EnvironmentProblem, EnvironmentUnavailable, LabError
from vnetbench.hosts.inventory import InventoryHost
from vnetbench.hosts.ssh import SshConnection
from vnetbench.lab import netns
from vnetbench.lab.guest import initramfs
from vnetbench.lab.nodes import Namespace, run_holding_input
from vnetbench.lab.teardown import Registry, atomic, start_process, stop_groups

QEMU = "qemu-system-x86_64"
NIC_DEVICES = {"virtio-net": "virtio-net-pci", "e1000": "e1000", "rtl8139": "rtl8139"}
ACCELS = ("auto", "kvm", "tcg")

# The management link: one point-to-point /30 per host namespace, never bridged, so every
# guest uses the same pair. 198.19.0.0/24 is outside the lab's subnet plan (subnets start at 1).
MGMT_HOST_IP = "198.19.0.1"
MGMT_GUEST_IP = "198.19.0.2"
MGMT_PREFIXLEN = 30
SSH_PORT = 22

# CPU models. Under TCG: every feature TCG emulates except fast string moves. With ERMS the
# guest kernel copies packet data with `rep movsb`, which TCG runs a byte at a time: measured
# here, virtio-net TCP fell from ~1500-2400 to ~800 Mbit/s and e1000 similarly (bench numbers
# in the issue note); boot time is unchanged.
CPU_TCG = "max,-erms,-fsrm"
CPU_KVM = "host"

# Kernel command line: serial console, quiet (a TCG UART costs seconds when the kernel
# talks), no crypto self-tests (boot only; nothing measured uses them), and no reboot
# loop after a panic (-no-reboot then makes QEMU exit with the console log kept).
BASE_APPEND = "console=ttyS0 quiet panic=-1 cryptomgr.notests"

# Verdict of the first KVM probe in this process: (usable, why). None: not probed yet.
_KVM_VERDICT: tuple[bool, str] | None = None
_KVM_LOCK = threading.Lock()
# A KVM that cannot boot a guest is only known by waiting kvm_probe_timeout for it, in every run that boots guests.
# So the failure is kept until the machine reboots (a file on /run, root's only), for the same host kernel, QEMU
# and guest kernel: a later run starts its guests under TCG at once, and says when KVM was found unusable. A
# change of any of them, or a reboot, probes again. Only failures are kept: a KVM that works needs no waiting,
# and a run that finds it works still probes, so it can still fall back.
KVM_FAILURE_FILE = Path("/run/vnetbench/kvm-failure.json")


class GuestBootError(EnvironmentUnavailable):
    """The guest did not come up; the message names the console log that shows why."""

    def __init__(self, message: str, console_log: Path | None = None):
        super().__init__(message, [console_log] if console_log else [])
        self.console_log = console_log


@dataclass(frozen=True)
class GuestConfig:
    nic: str = "virtio-net"  # virtio-net | e1000 | rtl8139
    vcpus: int = 1
    memory_mib: int = 256
    mtu: int = 1500
    offload: bool | None = None  # None: the drivers' defaults
    boot_timeout: float = 60.0  # seconds from starting QEMU to the first command over SSH
    accel: str = "auto"  # auto | kvm | tcg
    machine: str = "q35"
    kvm_probe_timeout: float = 15.0  # auto: how long a KVM boot may take before TCG is used
    kernel_version: str | None = None  # None: the newest installed
    compress_initramfs: bool = False  # measured: an uncompressed cpio boots faster under TCG

    def __post_init__(self) -> None:
        if self.nic not in NIC_DEVICES:
            raise LabError(f"nic = {self.nic!r}: choose one of {', '.join(NIC_DEVICES)}")
        if self.accel not in ACCELS:
            raise LabError(f"accel = {self.accel!r}: choose one of {', '.join(ACCELS)}")
        if not 1 <= self.vcpus <= 64:
            raise LabError(f"vcpus = {self.vcpus}: between 1 and 64")
        if not 192 <= self.memory_mib <= 65536:
            # Measured: 128 MiB panics (the 27 MiB initramfs and its unpacked copy do not fit), 192 boots.
            raise LabError(f"memory = {self.memory_mib} MiB: between 192 MiB and 64 GiB (the guest's root file "
                           "system lives in RAM)")
        if self.boot_timeout <= 0:
            raise LabError(f"boot_timeout = {self.boot_timeout}: must be positive")


@dataclass
class _Attempt:
    accel: str
    proc: subprocess.Popen
    started: float  # time.monotonic() just before QEMU was started
    stderr_path: Path
    probe: bool  # auto's KVM probe: on failure, TCG is tried


@dataclass
class Guest:
    """One QEMU guest attached to ``tap`` (lab side) and ``mgmt_tap`` (SSH) in namespace ``ns``."""

    name: str
    ns: Namespace
    tap: str
    mgmt_tap: str
    ipv4: str  # with prefix length, e.g. 198.18.0.3/16
    ipv6: str  # e.g. 2001:2::3/64
    number: int  # unique in the lab: MAC addresses derive from it
    config: GuestConfig
    workdir: Path  # keys, per-guest initrd, QEMU's stderr (removed with the lab)
    log_dir: Path  # the console log (kept)
    registry: Registry
    cpu: int | None = None  # the endpoint's host CPU: QEMU's pinning starts there (see host_cpus)
    # Filled as the guest comes up:
    accel: str | None = None
    accel_reason: str = ""
    kvm_probe_seconds: float | None = None
    boot_seconds: float | None = None
    clock_offset: float | None = None  # ms, guest - host, after sync_clock()
    _attempt: _Attempt | None = None
    _registered: bool = False
    _ready: bool = False
    _closed: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _boot: dict[str, Any] = field(default_factory=dict)
    conn: SshConnection | None = None  # the command channel: made by the first command, closed by stop()

    # ------------------------------------------------------------ addresses

    @property
    def mac(self) -> str:
        return _mac(0x525400, self.number)

    @property
    def mgmt_mac(self) -> str:
        return _mac(0x525500, self.number)

    @property
    def console_log(self) -> Path:
        return self.log_dir / f"{self.ns.name}.console.log"

    @property
    def ssh_dir(self) -> Path:
        return self.workdir / "ssh"

    # ------------------------------------------------------------ lifecycle

    def prepare(self) -> None:
        """Image, kernel and keys; everything that does not need QEMU yet."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        kernel = initramfs.find_kernel(self.config.kernel_version)
        image = initramfs.build(kernel, compress=self.config.compress_initramfs)
        boot = initramfs.boot_kernel(kernel)
        ssh = self.ssh_dir
        ssh.mkdir(mode=0o700, parents=True, exist_ok=True)
        key, host_key = ssh / "id_ed25519", ssh / "host_key"
        for path in (key, key.with_name(f"{key.name}.pub"), host_key):
            path.unlink(missing_ok=True)
        # The client's key for OpenSSH, the guest's host key for its dropbear (each in its own format).
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"vnetbench guest {self.name}", "-f", str(key)],
             "generating an SSH key", "openssh-client")
        _run(["dropbearkey", "-t", "ed25519", "-f", str(host_key)], "generating an SSH host key", "dropbear-bin")
        client_pub = " ".join(key.with_name(f"{key.name}.pub").read_text().split()[:2])
        known_hosts = ssh / "known_hosts"
        known_hosts.write_text(f"{MGMT_GUEST_IP} {_public_key(host_key)}\n")
        # Nothing of the user's ~/.ssh/config applies to a guest (a `Host *` ProxyJump, agent keys offered
        # first): the guest is reached with this file, its key and its known_hosts only.
        (ssh / "config").write_text("IdentitiesOnly yes\nIdentityAgent none\n")
        initrd = initramfs.guest_initrd(image, initramfs.overlay(client_pub, host_key.read_bytes()),
                                        self.workdir / "initrd")
        self._boot = {"kernel": kernel, "image": image, "boot_kernel": boot, "initrd": initrd, "key": key,
                      "known_hosts": known_hosts}

    def start(self) -> None:
        """Start QEMU (the first accelerator to try); :meth:`wait_ready` waits and falls back."""
        if not self._boot:
            self.prepare()
        self._launch(self._first_accel())

    def wait_ready(self) -> float:
        """Block until a command succeeds over SSH; returns the boot time in seconds."""
        self._boot_until(settled_only=False)
        assert self.boot_seconds is not None
        return self.boot_seconds

    def settle_accelerator(self) -> str:
        """Block only until it is known which accelerator the guest runs under: at once unless
        ``auto`` is probing KVM, else until KVM boots it or has failed (and TCG was started)."""
        self._boot_until(settled_only=True)
        assert self.accel is not None
        return self.accel

    def _boot_until(self, settled_only: bool) -> None:
        if self._attempt is None:
            self.start()
        while True:
            attempt = self._attempt
            assert attempt is not None
            probing = attempt.probe
            if settled_only and not probing:
                return
            timeout = min(self.config.kvm_probe_timeout, self.config.boot_timeout) if probing \
                else self.config.boot_timeout
            problem = self._wait(attempt, timeout)
            if problem is None:
                self.boot_seconds = time.monotonic() - attempt.started
                self._ready = True
                if attempt.accel == "kvm":
                    _set_kvm_verdict(True, "a guest booted under KVM")
                    self.accel_reason = self.accel_reason or "KVM works: the guest booted under it"
                return
            if probing:
                # KVM is unusable here: keep its console next to the real one, then boot under TCG.
                self.kvm_probe_seconds = time.monotonic() - attempt.started
                self._stop_process(attempt.proc, grace=0.5)
                if self.console_log.exists():
                    os.replace(self.console_log, self.console_log.with_suffix(".kvm-probe.log"))
                reason = f"KVM probe failed: {problem}"
                _set_kvm_verdict(False, reason)
                keep_kvm_failure(self.kvm_key(), reason)
                self.accel_reason = f"{reason}; fell back to TCG (software emulation)"
                self._launch("tcg")
                continue
            self._stop_process(attempt.proc, grace=0.5)
            raise GuestBootError(
                f"guest {self.name} ({self.config.nic}, {attempt.accel}) {problem}; console log kept at "
                f"{self.console_log}{_tail(self.console_log)}", self.console_log)

    def cancel_boot(self) -> None:
        """Make a wait_ready() in another thread give up now (the run is being interrupted)."""
        self._closed = True

    def stop(self) -> None:
        """Power the guest off (clean when it is up), make sure QEMU is gone, close the SSH connection."""
        with self._lock:
            self._closed = True
            attempt = self._attempt
        try:
            if attempt is not None and attempt.proc.poll() is None:
                self._power_off(attempt)
        finally:
            if self.conn is not None:
                self.conn.close()

    def _power_off(self, attempt: _Attempt) -> None:
        if self._ready:
            # The kernel powers off through ACPI (devices shut down) and QEMU exits. -f skips
            # init's kill-everything-and-sleep round (2 s): the guest has no disk to sync.
            # The SSH client is not waited for: its connection dies with the machine.
            ssh = None
            try:
                ssh = subprocess.Popen(self.command(["poweroff", "-f"], remote_wrapper=False),
                                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                attempt.proc.wait(timeout=3)
            except (subprocess.TimeoutExpired, OSError):
                pass
            finally:
                if ssh is not None:
                    ssh.kill()
                    ssh.wait()
        self._stop_process(attempt.proc, grace=2.0)

    @property
    def pid(self) -> int | None:
        return self._attempt.proc.pid if self._attempt else None

    # ------------------------------------------------------------ commands

    def command(self, argv: Sequence[str], cpus: str | None = None, remote_wrapper: bool = True,
                timed: bool = False) -> list[str]:
        """An argv that runs `argv` in the guest, for subprocess: the remote command's output and exit status.
        Through vnb-run (``remote_wrapper``) the command ends when the local process's input closes, as when
        that process ends: give it a pipe held open meanwhile (:func:`vnetbench.lab.nodes.run_holding_input`).
        `timed`: vnb-run says the command's CPU time after it (nodes.exec_wrapper's -t)."""
        words = [str(a) for a in argv]
        if remote_wrapper:
            words = ["/bin/vnb-run", *(["-t"] if timed else []), *(["-c", cpus] if cpus is not None else []), *words]
        return self._connection().command(words)

    def _connection(self) -> SshConnection:
        """The guest's SSH connection settings, made by its first command, after QEMU has started and stop() is
        registered to close it."""
        if self.conn is None:
            if not self._boot:
                raise LabError(f"guest {self.name}: a command before the guest was prepared")
            ssh = self.ssh_dir
            self.conn = SshConnection(
                InventoryHost(f"guest {self.name}", MGMT_GUEST_IP, user="root", port=SSH_PORT,
                              private_key_file=str(self._boot["key"])),
                known_hosts_file=self._boot["known_hosts"], config_file=ssh / "config", connect_timeout=10,
                via=["ip", "netns", "exec", self.ns.name], multiplex=False)  # why: hosts/ssh.py
        return self.conn

    def run(self, argv: Sequence[str], timeout: float = 10.0) -> subprocess.CompletedProcess:
        return run_holding_input(self.command(argv), timeout)

    def check(self, argv: Sequence[str], timeout: float = 30.0) -> str:
        """Run `argv` in the guest and return its stdout; LabError when it fails or hangs."""
        try:
            out = self.run(argv, timeout)
        except subprocess.TimeoutExpired:
            raise LabError(f"guest {self.name}: `{shlex.join(map(str, argv))}` did not finish within {timeout:g} s "
                           f"(console log: {self.console_log})") from None
        if out.returncode != 0:
            raise LabError(f"guest {self.name}: `{shlex.join(map(str, argv))}` exited {out.returncode}: "
                           f"{(out.stderr or out.stdout).strip()[-300:]}")
        return out.stdout

    # ------------------------------------------------------------ record

    def facts(self) -> dict[str, Any]:
        boot = self._boot
        kernel = boot.get("kernel")
        image = boot.get("image")
        bk = boot.get("boot_kernel")
        return {
            "accelerator": self.accel,
            "accelerator_reason": self.accel_reason,
            "kvm_probe_s": None if self.kvm_probe_seconds is None else round(self.kvm_probe_seconds, 3),
            "boot_s": None if self.boot_seconds is None else round(self.boot_seconds, 3),
            "nic": self.config.nic,
            "nic_device": NIC_DEVICES[self.config.nic],
            "vcpus": self.config.vcpus,
            "memory_mib": self.config.memory_mib,
            "machine": self.config.machine,
            "cpu_model": CPU_KVM if self.accel == "kvm" else CPU_TCG,
            "qemu": qemu_version(),
            "kernel": kernel.version if kernel else None,
            "kernel_boot": f"{bk.method} {bk.path}" if bk else None,
            "initramfs": str(image.path) if image else None,
            "initramfs_packages": image.manifest.get("packages") if image else None,
            "append": self._append(),
            "mac": self.mac,
            "host_cpus": self.host_cpus(),
            "console_log": str(self.console_log),
            "clock_offset_ms": None if self.clock_offset is None else round(self.clock_offset, 1),
            "channel": f"ssh (the OpenSSH client; dropbear in the guest) to {MGMT_GUEST_IP} "
                       f"on a separate virtio-net management link",
            "vhost": False,
        }

    # ------------------------------------------------------------ internals

    def _first_accel(self) -> str:
        if self.config.accel in ("kvm", "tcg"):
            self.accel_reason = f"accel = {self.config.accel} was asked for"
            return self.config.accel
        usable, why = kvm_available()
        if not usable:
            self.accel_reason = f"{why}; using TCG (software emulation)"
            return "tcg"
        verdict = _KVM_VERDICT
        if verdict is None and (kept := kept_kvm_failure(self.kvm_key())) is not None:
            _set_kvm_verdict(False, kept)
            verdict = _KVM_VERDICT
        if verdict is not None:
            ok, reason = verdict
            if not ok:
                when = "" if reason.endswith(KEPT) else " (probed earlier in this run)"
                self.accel_reason = f"{reason}{when}; using TCG (software emulation)"
                return "tcg"
            self.accel_reason = f"KVM works: {reason} earlier in this run"
        return "kvm"

    def kvm_key(self) -> dict[str, str | None]:
        """What a KVM verdict holds for: this boot of this machine, its kernel, QEMU, the guest's kernel."""
        kernel = self._boot.get("kernel")
        try:
            boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        except OSError:
            boot_id = None
        return {"boot_id": boot_id, "host_kernel": os.uname().release, "qemu": qemu_version(),
                "guest_kernel": kernel.version if kernel is not None else self.config.kernel_version}

    def _append(self) -> str:
        c = self.config
        parts = [BASE_APPEND, f"vnb.nic={c.nic}", f"vnb.mac={self.mac}", f"vnb.ip={self.ipv4}",
                 f"vnb.ip6={self.ipv6}", f"vnb.mtu={c.mtu}", f"vnb.mgmt_mac={self.mgmt_mac}",
                 f"vnb.mgmt_ip={MGMT_GUEST_IP}/{MGMT_PREFIXLEN}", f"vnb.hostname={self.name}"]
        if c.offload is not None:
            parts.append(f"vnb.offload={'on' if c.offload else 'off'}")
        return " ".join(parts)

    def qemu_argv(self, accel: str) -> list[str]:
        c = self.config
        boot = self._boot
        argv = [QEMU, "-name", f"{self.ns.name},debug-threads=on", "-nodefaults", "-no-user-config", "-nographic",
                "-machine", c.machine, "-accel", accel, "-cpu", CPU_KVM if accel == "kvm" else CPU_TCG,
                "-m", str(c.memory_mib), "-smp", str(c.vcpus),
                "-kernel", str(boot["boot_kernel"].path), "-initrd", str(boot["initrd"]), "-append", self._append(),
                "-serial", f"file:{self.console_log}", "-monitor", "none", "-no-reboot",
                "-netdev", f"tap,id=lab,ifname={self.tap},script=no,downscript=no,vhost=off",
                # romfile=: no iPXE option ROM; the kernel is loaded directly, and SeaBIOS
                # initialising a NIC's ROM under TCG costs seconds (e1000's most).
                "-device", f"{NIC_DEVICES[c.nic]},netdev=lab,mac={self.mac},romfile=",
                "-netdev", f"tap,id=mgmt,ifname={self.mgmt_tap},script=no,downscript=no,vhost=off",
                "-device", f"virtio-net-pci,netdev=mgmt,mac={self.mgmt_mac},romfile="]
        return argv

    def host_cpus(self) -> list[int] | None:
        """The host CPUs QEMU's threads may use: one per vCPU from the endpoint's CPU on, wrapping around
        (fewer when the machine has fewer), so a 4-vCPU guest can run 4 streams at once rather than
        time-sharing one core; None when the endpoint is not pinned."""
        if self.cpu is None:
            return None
        ncpu = os.cpu_count() or 1
        return sorted({(self.cpu + i) % ncpu for i in range(min(self.config.vcpus, ncpu))})

    def _launch(self, accel: str) -> None:
        argv = ["ip", "netns", "exec", self.ns.name]
        cpus = self.host_cpus()
        if cpus is not None:
            argv += ["taskset", "-c", ",".join(map(str, cpus))]
        argv += self.qemu_argv(accel)
        stderr_path = self.workdir / f"qemu-{accel}.err"
        self.console_log.unlink(missing_ok=True)
        with self._lock, atomic():
            if self._closed:
                raise GuestBootError(f"guest {self.name} was stopped while it booted")
            if not self._registered:
                # Registered before QEMU exists: stop() copes with no process, and an
                # interruption cannot fall between the process starting and teardown knowing.
                self.registry.add(f"guest {self.name} (QEMU in {self.ns.name})", self.stop)
                self._registered = True
            with open(stderr_path, "wb") as err:
                started = time.monotonic()
                proc = start_process(argv, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                     start_new_session=True)
            probe = accel == "kvm" and self.config.accel == "auto" and _KVM_VERDICT is None
            self._attempt = _Attempt(accel, proc, started, stderr_path, probe)
            self.accel = accel
            self._ready = False

    def _wait(self, attempt: _Attempt, timeout: float) -> str | None:
        """None when a command ran over SSH; otherwise what went wrong."""
        deadline = attempt.started + timeout
        while True:
            if self._closed:
                return "was stopped while it booted"
            rc = attempt.proc.poll()
            if rc is not None:
                err = attempt.stderr_path.read_text(errors="replace").strip()
                lines = [ln for ln in err.splitlines() if ln.strip() and "terminating on signal" not in ln]
                return f"QEMU exited with status {rc} before the guest answered" + \
                    (f": {lines[0].strip()[:300]}" if lines else "")
            left = deadline - time.monotonic()
            if left <= 0:
                return f"did not answer over SSH within {timeout:g} s"
            if self._port_open(min(0.3, left)):
                try:
                    out = subprocess.run(self.command(["true"], remote_wrapper=False), capture_output=True,
                                         text=True, timeout=max(1.0, min(10.0, deadline - time.monotonic())),
                                         stdin=subprocess.DEVNULL)
                    if out.returncode == 0:
                        return None
                except subprocess.TimeoutExpired:
                    pass
            time.sleep(0.05)

    # ------------------------------------------------------------ clock

    def clock_offset_ms(self, samples: int = 7) -> float | None:
        """Guest clock minus host clock, in ms (±1 ms), from ICMP timestamp requests (RFC 792)
        over the management link; the sample with the shortest round trip counts."""
        with netns.inside(self.ns.name):
            sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
        best: tuple[float, float] | None = None
        try:
            sock.settimeout(0.5)
            ident = os.getpid() & 0xFFFF
            for seq in range(samples):
                t1 = _ms_of_day()
                body = struct.pack("!BBHHHIII", 13, 0, 0, ident, seq, int(t1) % DAY_MS, 0, 0)
                sock.sendto(struct.pack("!BBHHHIII", 13, 0, _checksum(body), ident, seq, int(t1) % DAY_MS, 0, 0),
                            (MGMT_GUEST_IP, 0))
                while True:
                    try:
                        data = sock.recv(256)
                    except socket.timeout:
                        break
                    t4 = _ms_of_day()
                    icmp = data[(data[0] & 0x0F) * 4:]
                    if len(icmp) < 20:
                        continue
                    typ, _code, _ck, rid, rseq, orig, recv, xmit = struct.unpack("!BBHHHIII", icmp[:20])
                    if typ != 14 or rid != ident or rseq != seq:
                        continue
                    rtt = (t4 - t1) - (xmit - recv)
                    # θ = ((T2 - T1) + (T3 - T4)) / 2, wrapped to ±12 h (ms since midnight UTC)
                    theta = ((recv - t1 % DAY_MS) + (xmit - t4 % DAY_MS)) / 2
                    theta = (theta + DAY_MS / 2) % DAY_MS - DAY_MS / 2
                    if best is None or rtt < best[0]:
                        best = (rtt, theta)
                    break
        finally:
            sock.close()
        return None if best is None else best[1]

    def sync_clock(self, tolerance_ms: float = 2.0, rounds: int = 3, lag_s: float = 0.004) -> float | None:
        """Step the guest's clock onto the host's: the guest boots with its RTC's whole second, up to
        1 s off, which would misplace its time series (ping -D stamps) against the host's.

        The offset is measured from the host (ICMP timestamps, kernel to kernel, ±1 ms) and
        the guest steps its own clock by it, relative to its own reading (GNU ``date -s "now
        -0.565 seconds"``), so how long the command takes to get there does not matter. What
        does is the few ms date spends between reading and setting the clock under TCG (measured
        4-5 ms): it is added to the step, and re-estimated from what each round leaves.
        Returns the final offset in ms (also in facts())."""
        offset = self.clock_offset_ms()
        lag = lag_s
        for _ in range(rounds):
            if offset is None or abs(offset) <= tolerance_ms:
                break
            try:
                out = self.run(["date", "-s", f"now {-offset / 1e3 + lag:+.6f} seconds"], timeout=30)
            except subprocess.TimeoutExpired:
                break
            if out.returncode != 0:
                break
            new = self.clock_offset_ms()
            if new is None:
                break
            # new = offset + step - true lag, with step = -offset + lag
            lag -= new / 1e3
            offset = new
        self.clock_offset = offset
        return offset

    def _port_open(self, timeout: float) -> bool:
        """Does dropbear answer (an SSH banner) on the guest's management address?"""
        with netns.inside(self.ns.name):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.settimeout(timeout)
            s.connect((MGMT_GUEST_IP, SSH_PORT))
            return s.recv(4).startswith(b"SSH-")
        except OSError:
            return False
        finally:
            s.close()

    @staticmethod
    def _stop_process(proc: subprocess.Popen, grace: float) -> None:
        stop_groups([proc], grace)


# ---------------------------------------------------------------- helpers


def _mac(oui: int, number: int) -> str:
    if not 0 <= number < 1 << 24:
        raise LabError(f"host number {number} does not fit a MAC address")
    value = (oui << 24) | number
    return ":".join(f"{(value >> s) & 0xFF:02x}" for s in range(40, -1, -8))


def _run(argv: list[str], what: str, package: str = "dropbear-bin") -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise EnvironmentProblem(f"{argv[0]} is missing ({what}): apt-get install {package}") from None
    if out.returncode != 0:
        raise LabError(f"{what}: {' '.join(argv)} exited {out.returncode}: {out.stderr.strip()}")
    return out.stdout


def _public_key(private: Path) -> str:
    out = _run(["dropbearkey", "-y", "-f", str(private)], "reading an SSH public key")
    for line in out.splitlines():
        if line.startswith("ssh-"):
            return " ".join(line.split()[:2])
    raise LabError(f"dropbearkey -y printed no public key for {private}")


DAY_MS = 86_400_000


def _ms_of_day() -> float:
    return (time.time() % 86_400) * 1e3


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1bc")


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = ANSI.sub("", path.read_text(errors="replace"))
    except OSError:
        return " (no console output)"
    last = [ln.rstrip() for ln in text.splitlines() if ln.strip()][-lines:]
    if not last:
        return " (the console stayed empty)"
    return "; its last lines:\n    " + "\n    ".join(last)


def kvm_available() -> tuple[bool, str]:
    dev = Path("/dev/kvm")
    if not dev.exists():
        return False, "/dev/kvm is absent"
    try:
        os.close(os.open(dev, os.O_RDWR))
    except OSError as e:
        return False, f"/dev/kvm cannot be opened ({e.strerror})"
    return True, "/dev/kvm opens"


_QUICK_PROBE: tuple[bool, str] | None = None


def kvm_quick_probe(wait: float = 1.0) -> tuple[bool, str]:
    """Does QEMU even start under KVM here? (For `vnetbench doctor`: a stopped machine, no guest;
    whether a guest really boots is only known by booting one, which a run does.)"""
    global _QUICK_PROBE
    if _QUICK_PROBE is not None:
        return _QUICK_PROBE
    usable, why = kvm_available()
    if not usable or shutil.which(QEMU) is None:
        _QUICK_PROBE = (False, why if not usable else f"{QEMU} is missing")
        return _QUICK_PROBE
    proc = subprocess.Popen([QEMU, "-accel", "kvm", "-cpu", "host", "-machine", "q35", "-nodefaults",
                             "-no-user-config", "-display", "none", "-monitor", "none", "-serial", "none", "-S"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=wait)
        lines = [ln.strip() for ln in err.splitlines() if ln.strip()]
        _QUICK_PROBE = (False, f"QEMU exits at once under KVM (status {proc.returncode})"
                        + (f": {lines[0][:200]}" if lines else ""))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        _QUICK_PROBE = (True, "QEMU starts under KVM")
    return _QUICK_PROBE


def _set_kvm_verdict(ok: bool, reason: str) -> None:
    global _KVM_VERDICT
    with _KVM_LOCK:
        if _KVM_VERDICT is None or not ok:
            _KVM_VERDICT = (ok, reason)


KEPT = f"; kept in {KVM_FAILURE_FILE} until the machine reboots, delete it to probe again)"


def keep_kvm_failure(key: dict[str, str | None], reason: str) -> None:
    """Keep a failed KVM probe for later runs on this boot of the machine (best effort: a run without it probes)."""
    if key.get("boot_id") is None:
        return
    try:
        KVM_FAILURE_FILE.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = KVM_FAILURE_FILE.with_name(f"{KVM_FAILURE_FILE.name}.{os.getpid()}")
        tmp.write_text(json.dumps({"key": key, "reason": reason, "at": time.time()}))
        os.replace(tmp, KVM_FAILURE_FILE)
    except OSError:
        pass


def kept_kvm_failure(key: dict[str, str | None]) -> str | None:
    """Why KVM failed earlier on this boot of the machine, for the same `key`; None: not known to fail."""
    try:
        doc = json.loads(KVM_FAILURE_FILE.read_text())
        if doc.get("key") != key or key.get("boot_id") is None:
            return None
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(doc["at"])))
        return f"{doc['reason']} (a run on this machine found it at {at}{KEPT}"
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


_QEMU_VERSION: str | None = None


def qemu_version() -> str | None:
    global _QEMU_VERSION
    if _QEMU_VERSION is None and shutil.which(QEMU):
        out = subprocess.run([QEMU, "--version"], capture_output=True, text=True)
        _QEMU_VERSION = (out.stdout.strip().splitlines() or [""])[0]
    return _QEMU_VERSION
