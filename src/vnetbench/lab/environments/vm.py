"""`vm`: the endpoint is a QEMU guest, bridged onto the lab like libvirt's bridge mode.

::

    [ guest ]                           [ host ns (the hypervisor) ]
      eth0 198.18.0.x ══ NIC model ══ tap0 ─┐
      (virtio-net | e1000 | rtl8139)        br0 ── eth0 (uplink) ──veth── [ switch: br0 ]
                                             │
      mgmt0 198.19.0.2 ══ virtio-net ══ mgmt0 198.19.0.1   (SSH only, not bridged)

The guest owns the endpoint's lab addresses; the host namespace has none on
the lab (its bridge just forwards). Workloads run in the guest over SSH
(:mod:`vnetbench.lab.guest.qemu`); the guest's kernel is the installed Debian
kernel and its root file system an initramfs built from this machine's
packages (:mod:`vnetbench.lab.guest.initramfs`).

Options (from the scenario's lab fields, see :class:`VmOptions`): ``nic``,
``vcpus``, ``memory``, ``mtu``, ``offload``; and, for the machine rather than
the experiment, ``boot_timeout`` and ``accel`` (``auto``: KVM when a guest
really boots under it, else TCG), which the environment variables
``VNETBENCH_VM_BOOT_TIMEOUT`` and ``VNETBENCH_VM_ACCEL`` override.

Pinning: QEMU (every thread: vCPUs, I/O) runs on as many host CPUs as the
guest has vCPUs, from the endpoint's own on (a one-vCPU guest on the
endpoint's CPU, as a bare endpoint's process would be). Inside the guest a
command is pinned only when it has more than one vCPU (to the last one).
"""

from __future__ import annotations

import ipaddress
import math
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Sequence

from pydantic import AfterValidator, Field

from vnetbench import quantities, tools, units
from vnetbench.errors import EnvironmentUnavailable, LabError
from vnetbench.lab import netns, offload
from vnetbench.lab.environments.base import Capability, EnvironmentOptions, EnvironmentType, register
from vnetbench.lab.guest import initramfs, qemu
from vnetbench.lab.guest.qemu import Guest, GuestBootError, GuestConfig
from vnetbench.lab.nodes import Interface, Namespace, RunsCommands, placement_entry
from vnetbench.lab.teardown import Registry

BRIDGE = "br0"
TAP = "tap0"
MGMT_TAP = "mgmt0"
DEFAULT_LOG_DIR = Path(os.environ.get("VNETBENCH_GUEST_LOGS", "/var/log/vnetbench/guests"))
NUD_PERMANENT = 0x80

# Default prefix lengths when attach_vm gets bare addresses (the lab's underlay plan).
try:
    from vnetbench.lab.environments.base import UNDERLAY_V4_PREFIXLEN, UNDERLAY_V6_PREFIXLEN
except ImportError:  # pragma: no cover - the environments package without its base module
    UNDERLAY_V4_PREFIXLEN, UNDERLAY_V6_PREFIXLEN = 16, 64


# What a guest's memory holds before any workload: the kernel, the initramfs unpacked in RAM (busybox, the
# tools and their libraries, tens of MiB) and page cache. A tool that needs more than the rest is refused
# before anything is built: in the guest it would fail with "Cannot allocate memory" or be OOM-killed.
GUEST_OWN_BYTES = 128 * 2**20


@dataclass(frozen=True)
class VmOptions:
    """How each guest is built. Experiment parameters first, machine ones after."""

    nic: str = "virtio-net"
    vcpus: int = 1
    memory_mib: int = 256
    offload: bool | None = None  # None: the drivers' defaults until set_offload()
    mtu: int = 1500
    boot_timeout: float = 60.0
    accel: str = "auto"
    kvm_probe_timeout: float = 15.0
    machine: str = "q35"
    log_dir: Path = DEFAULT_LOG_DIR

    def guest_config(self) -> GuestConfig:
        # Offload is set after boot (GuestNode.set_offload), once the drivers' defaults are known.
        return GuestConfig(nic=self.nic, vcpus=self.vcpus, memory_mib=self.memory_mib, mtu=self.mtu,
                           offload=None, boot_timeout=self.boot_timeout, accel=self.accel, machine=self.machine,
                           kvm_probe_timeout=self.kvm_probe_timeout)

    @classmethod
    def from_variant(cls, variant: Any, **overrides: Any) -> "VmOptions":
        """From a lab Variant (nic, vcpus, memory in bytes, mtu), the environment, then `overrides`."""
        values: dict[str, Any] = {}
        if getattr(variant, "nic", None):
            values["nic"] = variant.nic
        if getattr(variant, "vcpus", None):
            values["vcpus"] = int(variant.vcpus)
        if getattr(variant, "memory", None):
            values["memory_mib"] = max(1, int(round(float(variant.memory) / 2**20)))
        if getattr(variant, "mtu", None):
            values["mtu"] = int(variant.mtu)
        if getattr(variant, "offload", None) in ("on", "off"):
            values["offload"] = variant.offload == "on"
        if os.environ.get("VNETBENCH_VM_ACCEL"):
            values["accel"] = os.environ["VNETBENCH_VM_ACCEL"]
        if os.environ.get("VNETBENCH_VM_BOOT_TIMEOUT"):
            values["boot_timeout"] = float(os.environ["VNETBENCH_VM_BOOT_TIMEOUT"])
        values.update(overrides)
        return cls(**values)


@dataclass
class GuestNode(RunsCommands):
    """A guest as the lab sees a node: :class:`vnetbench.lab.nodes.NamespaceNode`'s interface, run over SSH."""

    stdin_of_started: ClassVar[int] = subprocess.PIPE  # the guest's commands end when their input closes
    pins_each_command: ClassVar[bool] = False  # QEMU's threads keep the cores they were started on
    timed_by_wrapper: ClassVar[bool] = True  # vnb-run in the guest says a timed command's CPU time

    name: str
    ns: Namespace  # the host namespace QEMU runs in
    registry: Registry
    guest: Guest
    ipv4: str = ""
    ipv6: str = ""
    cpu: int | None = None  # host CPU of QEMU
    iface: Interface | None = None  # the uplink in the host namespace (its egress: the guest's traffic out)
    bridge: Interface | None = None
    tap: Interface | None = None
    env_facts: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    options: VmOptions = field(default_factory=VmOptions)
    _host_offload: offload.OffloadControl | None = None
    _guest_defaults: dict[str, Any] | None = None

    # ------------------------------------------------------------ NamespaceNode's interface

    def address(self, ip_version: int) -> str:
        return self.ipv6 if ip_version == 6 else self.ipv4

    def service_address(self, ip_version: int) -> str:
        return self.address(ip_version)

    @property
    def offset_s(self) -> float:
        """How far the guest's clock is ahead of this machine's, as measured after it was set (0: not known)."""
        return (self.guest.clock_offset or 0.0) / 1000

    def command(self, argv: Sequence[str], pin: bool = True, timed: bool = False) -> list[str]:
        vcpus = self.guest.config.vcpus
        return self.guest.command(argv, cpus=str(vcpus - 1) if pin and vcpus > 1 else None, timed=timed)

    def facts(self) -> dict[str, Any]:
        return {**self.env_facts, **self.guest.facts()}

    def placement(self) -> dict[str, Any]:
        # the guest's interface is its eth0; the interface named is the one its traffic leaves the host by
        return placement_entry(f"QEMU guest {self.name} (QEMU in namespace {self.ns.name})", self.ipv4, self.ipv6,
                               self.iface.name if self.iface else None, self.cpu)

    def wait_ready(self) -> float:
        """Wait until the guest answers, then check what it got and set its clock (once);
        returns its boot time in seconds."""
        boot = self.guest.wait_ready()
        if not self.extra.get("checked"):
            check_guest(self, self.options)
            self.extra["checked"] = True
        return boot

    # ------------------------------------------------------------ the hypervisor side

    def host_command(self, argv: Sequence[str]) -> list[str]:
        """An argv that runs in the host namespace (tcpdump on tap0, ethtool on br0, ...)."""
        return ["ip", "netns", "exec", self.ns.name, *map(str, argv)]

    def host_interfaces(self) -> list[Interface]:
        return [i for i in (self.tap, self.bridge, self.iface) if i is not None]

    def set_offload(self, on: bool) -> list[dict[str, Any]]:
        """TSO, GSO, GRO, tx/rx checksum on the guest's eth0 and on tap0, br0 and the uplink; returns what
        each reports afterwards. As for every environment (:class:`vnetbench.lab.offload.OffloadControl`),
        "on" is each device's own default, read before the first change, and "off" is all five off."""
        if self._host_offload is None:
            # Both sides' defaults first: a virtio guest's change moves the TAP's offloads (QEMU follows it).
            self._host_offload = offload.OffloadControl(self.host_interfaces())
            self._host_offload.defaults = self._host_offload.read()
            self._guest_defaults = self.guest_offload()
        defaults = self._guest_defaults or {}
        wanted = {f: bool(defaults.get(f)) if on else False for f in offload.FEATURES if f in defaults}
        guest = self.guest_offload(wanted)
        return [guest, *self._host_offload.set(on)]

    def guest_offload(self, wanted: dict[str, bool] | None = None) -> dict[str, Any]:
        """Set features of the guest's eth0 by short name (one at a time: a fixed one must not stop the
        others), then read them back; wanted None: only read."""
        sets = " ".join(f"ethtool -K eth0 {f} {'on' if v else 'off'} >/dev/null 2>&1;" for f, v in
                        (wanted or {}).items())
        text = self.guest.check(["sh", "-c", f"{sets} ethtool -k eth0"], timeout=30)
        entry: dict[str, Any] = {"netns": f"guest:{self.name}", "dev": "eth0"}
        for line in text.splitlines():
            name, _, value = line.partition(":")
            for short, long in offload.FEATURES.items():
                if name.strip() == long:
                    entry[short] = value.strip().startswith("on")
        return entry

    def guest_mtu(self) -> int:
        return int(self.guest.check(["cat", "/sys/class/net/eth0/mtu"]).strip())


def attach_vm(lab: Any, registry: Registry, host_ns: Namespace, name: str, number: int, uplink: Interface,
              address_v4: str, address_v6: str, cpu: int | None, options: VmOptions | None = None,
              workdir: Path | None = None, wait: bool = True) -> GuestNode:
    """Make `host_ns` a hypervisor for one guest that owns the given addresses.

    Builds, in `host_ns`: bridge ``br0`` with `uplink` (an existing interface there,
    e.g. the veth end toward the lab switch; it should carry no addresses) and
    TAP ``tap0`` as ports, and the management TAP ``mgmt0``; then starts the
    guest on them. ``wait``: block until the guest answers over SSH (else call
    ``host.wait_ready()`` later: several guests may boot at once).
    ``lab`` may be a LabContext (its ``workdir`` is used) or None.
    """
    options = options or VmOptions()
    v4 = _with_prefix(address_v4, UNDERLAY_V4_PREFIXLEN)
    v6 = _with_prefix(address_v6, UNDERLAY_V6_PREFIXLEN)
    workdir = workdir or _workdir(lab, registry) / f"vm-{name}"
    ipr = host_ns.ipr

    ipr.link("add", ifname=BRIDGE, kind="bridge")
    br = Interface(host_ns, BRIDGE)
    tap = Interface(host_ns, TAP)
    mgmt = Interface(host_ns, MGMT_TAP)
    with netns.inside(host_ns.name):
        # A TAP is created by an ioctl on /dev/net/tun, in the namespace of the calling thread.
        for ifname in (TAP, MGMT_TAP):
            ipr.link("add", ifname=ifname, kind="tuntap", mode="tap")
    # All three live in host_ns and go with it: no undo of their own.
    for dev in (BRIDGE, TAP, uplink.name, MGMT_TAP):
        # The hypervisor needs no IPv6 on these; no router solicitations or MLD leak onto the lab.
        host_ns.sysctl(f"net.ipv6.conf.{dev}.disable_ipv6", "1")
    for iface in (br, tap, uplink):
        if options.mtu != 1500:
            iface.set_mtu(options.mtu)
    for port in (uplink, tap):
        ipr.link("set", index=port.index, master=br.index)
    for iface in (tap, uplink, br):
        iface.up()
    mgmt.add_address(f"{qemu.MGMT_HOST_IP}/{qemu.MGMT_PREFIXLEN}")
    mgmt.up()

    guest = Guest(name=name, ns=host_ns, tap=TAP, mgmt_tap=MGMT_TAP, ipv4=v4, ipv6=v6, number=number,
                  config=options.guest_config(), workdir=workdir, log_dir=options.log_dir, registry=registry,
                  cpu=cpu)
    # The guest's management MAC is known: no ARP round before the first SSH connection.
    ipr.neigh("add", dst=qemu.MGMT_GUEST_IP, lladdr=guest.mgmt_mac, ifindex=mgmt.index, state=NUD_PERMANENT)
    host = GuestNode(name=name, ns=host_ns, registry=registry, guest=guest, ipv4=v4.split("/")[0],
                  ipv6=v6.split("/")[0], cpu=cpu, iface=uplink, bridge=br, tap=tap, options=options,
                  env_facts={"env": "vm", "netns": host_ns.name,
                             "path": f"guest eth0 ({options.nic}) -> {TAP} -> {BRIDGE} -> {uplink.name} -> switch"})
    guest.start()
    if wait:
        host.wait_ready()
    return host


def check_guest(host: GuestNode, options: VmOptions) -> None:
    """Once the guest is up: what it got must be what was asked for (a NIC may refuse an MTU),
    offloads as the options say (None: left as the drivers made them), its clock on the host's."""
    host.guest.sync_clock()
    mtu = host.guest_mtu()
    if mtu != options.mtu:
        raise LabError(f"guest {host.name}: nic {options.nic} runs eth0 at MTU {mtu}, not the {options.mtu} asked "
                       f"for (the driver's limit); choose another nic or mtu")
    if options.offload is not None:
        host.env_facts["offload"] = host.set_offload(options.offload)
    for dst, gateway in host.extra.get("routes", []):
        host.guest.check(["ip", "-6" if ":" in dst else "-4", "route", "replace", dst, "via", gateway, "dev", "eth0"])
    if host.extra.get("routes"):
        host.env_facts["routes"] = {dst: gateway for dst, gateway in host.extra["routes"]}


def give_up_addresses(iface: Interface) -> None:
    """Take `iface`'s addresses out of its namespace: a guest bridged to it owns them now, and the namespace must
    not answer for them. The routes through it go too: IPv4's with their addresses, IPv6's when attach_vm turns
    IPv6 off on the bridge's ports."""
    ipr = iface.ns.ipr
    for msg in ipr.get_addr(index=iface.index):
        ipr.addr("del", index=iface.index, address=msg.get_attr("IFA_ADDRESS"), prefixlen=msg["prefixlen"])


def _with_prefix(addr: str, default: int) -> str:
    iface = ipaddress.ip_interface(addr if "/" in addr else f"{addr}/{default}")
    return str(iface)


def _workdir(lab: Any, registry: Registry) -> Path:
    base = getattr(lab, "workdir", None)
    if base:
        return Path(base)
    path = Path(tempfile.mkdtemp(prefix="vnetbench-vm-"))
    registry.add(f"work directory {path}", lambda: shutil.rmtree(path, ignore_errors=True))
    return path


# ---------------------------------------------------------------- the environment


GUEST_MIN_MEMORY = 64 * 2**20  # the guest kernel, its initramfs (the tools) and their page cache
GUEST_MAX_MEMORY = 64 * 2**30


def _guest_memory(v: float | None) -> float | None:
    if v is not None and not GUEST_MIN_MEMORY <= v <= GUEST_MAX_MEMORY:
        raise ValueError(f"{units.format_size(v)}: a guest gets 64 MiB to 64 GiB of memory (its kernel and "
                         "tools need the least)")
    return v


class GuestOptions(EnvironmentOptions):
    nic: Literal["virtio-net", "e1000", "rtl8139"] | None = Field(default=None, description="env=vm: guest NIC "
                                                                   "model; default virtio-net")
    vcpus: int | None = Field(default=None, ge=1, le=64, description="env=vm: guest vCPUs")
    memory: Annotated[quantities.Size | None, AfterValidator(_guest_memory)] = Field(default=None,
                                                                                     description="env=vm: guest RAM")


@register
class VmEnvironment(EnvironmentType):
    """Endpoints as guests: each in its own host namespace on the switch (see the module docstring)."""

    kind = "vm"
    tag = "v"
    Options = GuestOptions
    # Building the initramfs (cached after the first run) and booting the guests in parallel: 10-20 s under
    # TCG on this project's 2-core VM (test_docker_vs_kvm_short boots two in its 35 s); less under KVM.
    setup_s = 20.0

    @classmethod
    def capabilities(cls, variant: Any | None, kernel: dict[str, str | None] | None) -> list[Capability]:
        """QEMU, a kernel with the NIC's driver, TAP devices, KVM or TCG; `variant` None: every NIC model."""
        try:
            return [Capability(*c) for c in _checks(getattr(variant, "nic", None) if variant is not None else None)]
        except Exception as e:  # a check that cannot even run says so, rather than taking doctor down with it
            return [Capability("vm", False, f"checking what guests need failed: {type(e).__name__}: {e}",
                               "see `vnetbench doctor`")]

    @classmethod
    def memory_problem(cls, variant: Any, needed: int) -> str | None:
        memory = VmOptions.from_variant(variant).memory_mib * 2**20
        if needed + GUEST_OWN_BYTES <= memory:
            return None
        fits = units.format_binary_size(2 ** math.ceil(math.log2(needed + GUEST_OWN_BYTES)))
        return (f"needs {units.format_binary_size(needed)} of memory in the guest, which has {units.format_binary_size(memory)} "
                f"of which about {units.format_binary_size(GUEST_OWN_BYTES)} go to its kernel, initramfs and tools: give "
                f"the vm environment memory = \"{fits}\" (or more), or ask the tool for less")

    @classmethod
    def tool_problems(cls, variant: Any, tools: list[tuple[str, str]]) -> list[str]:
        """A guest runs only what its initramfs carries: each tool must be a binary (with libraries) or
        a shell script on this machine."""
        return initramfs.guest_problems(tools)

    def __init__(self, ctx: Any, variant: Any, options: VmOptions | None = None):
        self.ctx = ctx
        self.variant = variant
        self.options = options or VmOptions.from_variant(variant)
        self.nodes: list[GuestNode] = []
        self.attached: list[Any] = []
        self._workdir: Path | None = None

    def attach(self, endpoint: Any) -> Any:
        from vnetbench.lab.environments.base import Attached, wired_namespace

        ctx = self.ctx
        # The guest takes over what the lab gave its namespace (the addresses on its one link, its routes), and
        # the namespace becomes the guest's hypervisor, bridging that link to the guest's TAP.
        wired = wired_namespace(ctx, endpoint.name)
        ns, port, uplink = wired.ns, wired.port, wired.iface
        v4, v6 = (f"{a}/{n}" for a, n in zip((wired.ipv4, wired.ipv6), wired.prefixlens))
        routes = list(wired.routes)
        give_up_addresses(uplink)
        if self._workdir is None:
            self._workdir = _workdir(ctx, ctx.registry)
        options = replace(self.options, mtu=endpoint.mtu)
        host = attach_vm(ctx, ctx.registry, ns, endpoint.name, endpoint.number, uplink, v4, v6, endpoint.cpu,
                         options, workdir=self._workdir / f"vm-{endpoint.name}", wait=False)
        host.extra["routes"] = routes  # installed in the guest once it answers (check_guest)
        # While `auto` has no KVM verdict yet, this guest is the probe: the guests after it start
        # straight under the accelerator it finds (all of them still boot in parallel).
        host.guest.settle_accelerator()
        self.nodes.append(host)
        att = Attached(node=host, port=port, uplink=uplink, offload_ifaces=host.host_interfaces())
        self.attached.append(att)
        return att

    def finish(self) -> None:
        """Bring every guest up (they boot in parallel): wait until it answers, check what it got,
        set its clock. A guest that does not boot raises GuestBootError naming its console log."""
        pending = [h for h in self.nodes if not h.extra.get("checked")]
        if not pending:
            return
        failures: list[LabError] = []
        pool = ThreadPoolExecutor(max_workers=len(pending), thread_name_prefix="vnb-guest-boot")
        try:
            for fut in [pool.submit(h.wait_ready) for h in pending]:
                try:
                    fut.result()
                except LabError as e:
                    failures.append(e)
        except BaseException:
            # Interrupted: the waiting threads give up at once, and teardown stops the guests.
            for h in pending:
                h.guest.cancel_boot()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        if failures:
            message = "\n".join(str(e) for e in failures)
            boot = [e for e in failures if isinstance(e, GuestBootError)]
            if boot:
                # The lab's other variants are fine: this one's trials fail, its console logs are kept.
                raise EnvironmentUnavailable(message, [log for e in boot for log in e.evidence])
            raise LabError(message)


    def guests(self) -> list[Any]:
        return list(self.nodes)

    def cpu_parts(self) -> dict[str, list[Any]]:
        pids = [pid for host in self.nodes if (pid := host.guest.pid) is not None]
        return {"qemu": pids}

    def cpu_part_of(self, endpoint: str) -> str | None:
        return "qemu" if any(host.name == endpoint for host in self.nodes) else None

    def set_offload(self, on: bool) -> list[dict[str, Any]]:
        # Every guest at once: each change is a command over SSH into the guest (a handshake under TCG, most of
        # a second), and each guest's devices and its host side are its own.
        if len(self.nodes) <= 1:
            return [entry for host in self.nodes for entry in host.set_offload(on)]
        with ThreadPoolExecutor(max_workers=len(self.nodes), thread_name_prefix="vnb-guest-offload") as pool:
            done = [pool.submit(host.set_offload, on) for host in self.nodes]
        return [entry for future in done for entry in future.result()]

    def facts(self) -> dict[str, Any]:
        guests = {h.name: h.guest.facts() for h in self.nodes}
        first = next(iter(guests.values()), {})
        return {
            "env": "vm",
            "path": f"guest eth0 ({self.options.nic}) -> {TAP} -> host {BRIDGE} -> veth -> switch bridge",
            "nic": self.options.nic, "vcpus": self.options.vcpus, "memory_mib": self.options.memory_mib,
            "accelerator": sorted({g["accelerator"] for g in guests.values() if g.get("accelerator")}),
            "accelerator_reason": first.get("accelerator_reason"),
            "boot_s": {name: g.get("boot_s") for name, g in guests.items()},
            "kernel": first.get("kernel"), "qemu": first.get("qemu"),
            "console_logs": {name: g.get("console_log") for name, g in guests.items()},
        }


# ---------------------------------------------------------------- what the machine can do


def _checks(nic: str | None = None) -> list[tuple[str, bool, str, str]]:
    """(name, ok, detail, fix) for everything a guest needs; KVM is informative (TCG works without it)."""
    out: list[tuple[str, bool, str, str]] = []
    exe = shutil.which(qemu.QEMU)
    out.append(("vm qemu", exe is not None, qemu.qemu_version() or exe or f"{qemu.QEMU} is missing",
                "" if exe else "apt-get install qemu-system-x86"))
    kernel = None
    try:
        kernel = initramfs.find_kernel()
        out.append(("vm kernel", True, f"{kernel.image} with modules in {kernel.modules_dir}", ""))
    except Exception as e:
        out.append(("vm kernel", False, str(e).split(";")[0], "apt-get install linux-image-amd64"))
    out.append(("vm busybox", initramfs.find_busybox() is not None,
                "static busybox for the guest's shell and tools" if initramfs.find_busybox()
                else "no static busybox (/bin/busybox)", "apt-get install busybox-static"))
    for cmd, pkg in (*initramfs.REQUIRED_TOOLS,
                     *((t.command, t.package) for t in (tools.SSH, tools.SSH_KEYGEN, tools.DROPBEARKEY))):
        found = shutil.which(cmd, path="/usr/sbin:/usr/bin:/sbin:/bin")
        out.append((f"vm {cmd}", found is not None, found or f"{cmd} is missing",
                    "" if found else f"apt-get install {pkg}"))
    tun = Path("/dev/net/tun").exists()
    out.append(("vm tap", tun, "/dev/net/tun" if tun else "/dev/net/tun is missing (no TAP devices)",
                "" if tun else "modprobe tun"))
    if kernel is not None:
        for model in ([nic] if nic else list(qemu.NIC_DEVICES)):
            try:
                mods = initramfs.module_load_order(kernel, initramfs.NIC_MODULES[model])
                out.append((f"vm ({model})", True, f"driver modules: {', '.join(Path(m).stem for m in mods)}", ""))
            except Exception as e:
                out.append((f"vm ({model})", False, str(e), "install a kernel with this NIC's driver"))
    verdict = qemu._KVM_VERDICT
    if verdict is not None:
        ok, why = verdict
    elif os.geteuid() == 0 and exe:
        ok, why = qemu.kvm_quick_probe()
    else:
        ok, why = qemu.kvm_available()
    tcg = "guests run under TCG (software emulation, slower; recorded with the results)"
    detail = f"{why}; a run probes by booting a guest under KVM, and uses TCG if it does not come up" if ok \
        else f"{why}: {tcg}"
    out.append(("vm kvm", True, detail, ""))
    return out


def check_vm_available(nic: str | None = None) -> list[str]:
    """What stops a guest from being built here, each with what to install (empty: nothing)."""
    return [f"{detail} -> {fix}" if fix else detail for _name, ok, detail, fix in _checks(nic) if not ok]
