"""The guest's root file system: a small initramfs built from this machine's packages.

What goes in (all taken from the host, nothing downloaded)::

    /init                      our script: mount, load NIC modules, configure eth0
                               from the kernel command line, start dropbear, then
                               hand PID 1 to busybox init (which reaps orphans)
    /bin/busybox + applets     busybox-static
    /bin/{iperf3,ping,ss,...}  the workload tools, with the shared libraries ldd
    /lib/..., /lib64/ld-...    names for them (iperf3 needs libiperf, libcrypto, ...)
    /bin/{ethtool,dropbear}    offload control and the command channel (SSH)
    /lib/modules/<ver>/...     the NIC drivers (virtio_net, e1000, 8139too) and
                               their dependencies from modules.dep

The archive is reproducible (fixed order, owners and times; gzip without a
timestamp) and cached under ``/var/cache/vnetbench/`` by a hash of its inputs:
the kernel version, the content of every file copied in and this module's
script text. Files that change per guest (the SSH keys) are not in it: they go
into a small uncompressed archive placed in front of the cached one
(:func:`guest_initrd`); the kernel unpacks concatenated archives in order, the
way early-microcode initrds work.

Kernel command line read by /init::

    vnb.nic=virtio-net|e1000|rtl8139   which driver list to load for the lab NIC
    vnb.mac=52:54:00:00:00:03          the lab NIC (renamed eth0)
    vnb.ip=198.18.0.3/16               IPv4 address of eth0
    vnb.ip6=2001:2::3/64               IPv6 address of eth0 (no DAD)
    vnb.mtu=1500                       eth0 MTU
    vnb.offload=on|off                 TSO, GSO, GRO, tx/rx checksum on eth0 (absent: driver default)
    vnb.mgmt_mac=52:55:00:00:00:03     the management NIC (virtio-net, renamed mgmt0)
    vnb.mgmt_ip=198.19.0.2/30          its address; dropbear listens there only
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import lzma
import os
import re
import shutil
import stat
import struct
import subprocess
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from vnetbench import tools
from vnetbench.errors import EnvironmentProblem
from vnetbench.lab.nodes import exec_wrapper

CACHE_DIR = Path(os.environ.get("VNETBENCH_CACHE", "/var/cache/vnetbench"))
FORMAT_VERSION = "1"

# NIC model (QEMU device family) -> kernel modules to load, dependencies resolved from modules.dep.
NIC_MODULES: dict[str, tuple[str, ...]] = {
    "virtio-net": ("virtio_pci", "virtio_net"),
    "e1000": ("e1000",),
    # QEMU's rtl8139 is an RTL8139C+: 8139too declines it ("use 8139cp").
    "rtl8139": ("8139cp",),
}

# Tools copied into the guest: (command, Debian package). Required ones fail the build when
# missing; optional ones are copied when the host has them (workloads check in the guest).
REQUIRED_TOOLS: tuple[tuple[str, str], ...] = tuple(
    (t.command, t.package) for t in (tools.DROPBEAR, tools.IPERF3, tools.PING, tools.ETHTOOL, tools.DATE))
OPTIONAL_TOOLS: tuple[tuple[str, str], ...] = tuple(
    (t.command, t.package) for t in (
        tools.IP,  # tcp_metrics, flushed before every trial (busybox's ip has no such command)
        tools.SS,
        tools.IRTT,
    ))


def optional_tools() -> tuple[tuple[str, str], ...]:
    """The tools copied when the host has them: the list above and every workload's binaries
    (vnetbench.workloads), so a guest runs whatever a scenario's workloads need."""
    from vnetbench.workloads.registry import drivers

    found = list(OPTIONAL_TOOLS)
    for d in drivers().values():
        found.extend((t.command, t.package) for t in d.requires)
    required = {cmd for cmd, _ in REQUIRED_TOOLS}
    return tuple(dict.fromkeys(t for t in found if t[0] not in required))

BUSYBOX_CANDIDATES = ("/bin/busybox", "/usr/bin/busybox")

INIT_SCRIPT = r"""#!/bin/sh
# vnetbench guest init: network up, SSH up, then busybox init reaps orphans.
export PATH=/bin HOME=/root
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /dev/pts /tmp /run /var/log
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run

say() { echo "vnb-guest: $*"; }
# Fork-free where it is cheap to be: under TCG every fork+exec costs milliseconds.
by_mac() {
    for d in /sys/class/net/*; do
        read -r a < "$d/address"
        [ "$a" = "$1" ] && { echo "${d##*/}"; return 0; }
    done
    return 1
}

read -r cmdline < /proc/cmdline
for w in $cmdline; do
    case "$w" in
        vnb.nic=*) nic=${w#*=} ;;
        vnb.mac=*) mac=${w#*=} ;;
        vnb.ip=*) ip4=${w#*=} ;;
        vnb.ip6=*) ip6=${w#*=} ;;
        vnb.mtu=*) mtu=${w#*=} ;;
        vnb.offload=*) offload=${w#*=} ;;
        vnb.mgmt_mac=*) mgmt_mac=${w#*=} ;;
        vnb.mgmt_ip=*) mgmt_ip=${w#*=} ;;
        vnb.hostname=*) hostname "${w#*=}" ;;
    esac
done

load() {
    while read -r m; do
        insmod "/lib/modules/$m" || say "insmod $m failed"
    done < "/etc/vnb/modules-$1"
}
wait_mac() {
    i=0
    until by_mac "$1" >/dev/null; do
        i=$((i + 1)); [ $i -gt 1000 ] && { say "no NIC with MAC $1 (nic=$nic)"; return 1; }
        usleep 10000
    done
}

sysctl -qw net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0
ip link set lo up

# The lab NIC first, and up at once: its link comes up while the management NIC's driver
# loads. Stable names: the measured NIC is eth0, the management NIC (virtio-net) mgmt0.
load "$nic"
wait_mac "$mac"
m=$(by_mac "$mgmt_mac") && [ "$m" != mgmt0 ] && ip link set "$m" name mgmt0
lab=$(by_mac "$mac") && [ "$lab" != eth0 ] && ip link set "$lab" name eth0
sysctl -qw net.ipv6.conf.eth0.accept_dad=0 net.ipv6.conf.eth0.router_solicitations=0
[ -n "$mtu" ] && { ip link set eth0 mtu "$mtu" || say "mtu $mtu refused by eth0 ($nic)"; }
case "$offload" in on|off)
    for f in tso gso gro tx rx; do ethtool -K eth0 "$f" "$offload" >/dev/null 2>&1; done;;
esac
ip link set eth0 up

[ "$nic" = virtio-net ] || load virtio-net
wait_mac "$mgmt_mac"
m=$(by_mac "$mgmt_mac") && [ "$m" != mgmt0 ] && ip link set "$m" name mgmt0
sysctl -qw net.ipv6.conf.mgmt0.disable_ipv6=1
ip link set mgmt0 up
ip addr add "$mgmt_ip" dev mgmt0

[ -n "$ip4" ] && ip addr add "$ip4" dev eth0
[ -n "$ip6" ] && ip -6 addr add "$ip6" dev eth0

dropbear -r /etc/dropbear/host_key -s -g -j -k -p "${mgmt_ip%/*}:22" -P /run/dropbear.pid || say "dropbear failed"
say "eth0 $mac $ip4 $ip6 mtu $(cat /sys/class/net/eth0/mtu); ssh on ${mgmt_ip%/*}"
echo "vnb-guest-ready"
exec /bin/init
"""

INITTAB = """::ctrlaltdel:/bin/poweroff -f
::shutdown:/bin/sync
"""

# Every remote command runs as `/bin/vnb-run [-c CPUS] ARGV...` over SSH (vnetbench.hosts.ssh, as on real
# hosts). vnb-run is the exec wrapper of every node whose command channel does not itself stop a command
# (vnetbench.lab.nodes): it ends the command's process group when its input, held open by the local ssh
# client, closes, so a command ends with its client. Exit status and stdout/stderr pass through unchanged.
# With PATH=/bin program names resolve to the packaged tools first: busybox's shell would otherwise run its
# own applet of the same name (its ping, not iputils').
RUN_WRAPPER = "#!/bin/sh\nexport PATH=/bin HOME=/root\n" + \
    exec_wrapper("/bin/", "in the guest").removeprefix("#!/bin/sh\n")


@dataclass(frozen=True)
class Kernel:
    version: str
    image: Path
    modules_dir: Path


def find_kernel(version: str | None = None) -> Kernel:
    """The installed Debian kernel to boot: the newest /boot/vmlinuz-* with its modules."""
    images = sorted(Path("/boot").glob("vmlinuz-*"), key=lambda p: _version_key(p.name[len("vmlinuz-"):]))
    if version:
        images = [p for p in images if p.name == f"vmlinuz-{version}"]
    usable = [p for p in images if (Path("/lib/modules") / p.name[len("vmlinuz-"):] / "modules.dep").exists()]
    if not usable:
        what = f"kernel {version}" if version else "kernel image (/boot/vmlinuz-*) with its modules"
        raise EnvironmentProblem(f"no {what} to boot guests with: apt-get install linux-image-amd64")
    image = usable[-1]
    ver = image.name[len("vmlinuz-"):]
    return Kernel(ver, image, Path("/lib/modules") / ver)


def _version_key(v: str) -> list:
    return [int(x) if x.isdigit() else x for x in re.split(r"[.\-+~]", v)]


@dataclass(frozen=True)
class BootKernel:
    """What QEMU's -kernel gets: the uncompressed vmlinux (PVH entry) when it can be had, else the bzImage."""

    path: Path
    method: str  # "pvh" (ELF vmlinux, no self-decompression) or "bzimage"
    note: str = ""


XEN_ELFNOTE_PHYS32_ENTRY = 18
_BOOT_KERNELS: dict[tuple, BootKernel] = {}


def boot_kernel(kernel: Kernel, cache_dir: Path | None = None) -> BootKernel:
    """The kernel image to boot, preferring its uncompressed ELF with a PVH entry point.

    A bzImage decompresses itself at boot; Debian's is XZ, and under TCG that
    costs seconds. QEMU loads an ELF vmlinux with a PVH note straight into guest
    memory instead (measured: 3-4 s less per boot). The vmlinux is extracted
    once from the installed image and cached next to the initramfs.
    """
    cache_dir = Path(cache_dir or CACHE_DIR)
    known = _BOOT_KERNELS.get((kernel, str(cache_dir)))
    if known is not None and known.path.exists():
        return known
    data = kernel.image.read_bytes()
    tag = hashlib.sha256(data).hexdigest()[:16]
    cached = cache_dir / f"vmlinux-{kernel.version}-{tag}"
    if cached.exists():
        _BOOT_KERNELS[(kernel, str(cache_dir))] = BootKernel(cached, "pvh")
        return _BOOT_KERNELS[(kernel, str(cache_dir))]
    try:
        elf = _decompress_payload(data)
    except Exception as e:  # an unknown format: boot the bzImage as it is
        return BootKernel(kernel.image, "bzimage", f"no vmlinux extracted: {e}")
    if not _has_pvh_note(elf):
        return BootKernel(kernel.image, "bzimage", "the kernel has no PVH entry (CONFIG_PVH)")
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_name(f".{cached.name}.{os.getpid()}")
    tmp.write_bytes(elf)
    os.replace(tmp, cached)
    return BootKernel(cached, "pvh")


def _decompress_payload(image: bytes) -> bytes:
    """The ELF inside a bzImage (what scripts/extract-vmlinux does)."""
    for magic, method in ((b"\xfd7zXZ\x00", "xz"), (b"\x1f\x8b\x08", "gzip"), (b"\x28\xb5\x2f\xfd", "zstd")):
        start = 0
        while (off := image.find(magic, start)) >= 0:
            start = off + 1
            try:
                if method == "xz":
                    out = lzma.LZMADecompressor().decompress(image[off:])
                elif method == "gzip":
                    out = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(image[off:])
                else:
                    if shutil.which("zstd") is None:
                        break
                    out = subprocess.run(["zstd", "-dc"], input=image[off:], capture_output=True).stdout
            except (lzma.LZMAError, zlib.error, EOFError):
                continue
            if out[:4] == b"\x7fELF":
                return out
    raise ValueError("no xz, gzip or zstd compressed ELF found in the image")


def _has_pvh_note(elf: bytes) -> bool:
    if elf[:4] != b"\x7fELF" or elf[4] != 2:  # ELF64 only
        return False
    phoff, = struct.unpack_from("<Q", elf, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    for i in range(phnum):
        p_type, _flags, p_offset, _vaddr, _paddr, p_filesz = struct.unpack_from("<IIQQQQ", elf, phoff + i * phentsize)
        if p_type != 4:  # PT_NOTE
            continue
        pos, end = p_offset, p_offset + p_filesz
        while pos + 12 <= end:
            namesz, descsz, ntype = struct.unpack_from("<III", elf, pos)
            name = elf[pos + 12:pos + 12 + namesz].rstrip(b"\0")
            if name == b"Xen" and ntype == XEN_ELFNOTE_PHYS32_ENTRY:
                return True
            pos += 12 + (namesz + 3) // 4 * 4 + (descsz + 3) // 4 * 4
    return False


# ------------------------------------------------------------------ modules


def _module_index(kernel: Kernel) -> tuple[dict[str, str], dict[str, list[str]], set[str]]:
    """name -> path (relative to modules_dir), path -> deps, builtin names."""
    deps: dict[str, list[str]] = {}
    by_name: dict[str, str] = {}
    for line in (kernel.modules_dir / "modules.dep").read_text().splitlines():
        if ":" not in line:
            continue
        path, rest = line.split(":", 1)
        deps[path] = rest.split()
        by_name[_mod_name(path)] = path
    builtin = set()
    bfile = kernel.modules_dir / "modules.builtin"
    if bfile.exists():
        builtin = {_mod_name(p) for p in bfile.read_text().split()}
    return by_name, deps, builtin


def _mod_name(path: str) -> str:
    base = path.rsplit("/", 1)[-1]
    base = re.sub(r"\.ko(\.(xz|gz|zst))?$", "", base)
    return base.replace("-", "_")


def module_load_order(kernel: Kernel, names: Iterable[str]) -> list[str]:
    """Module paths (relative to the modules dir) to insmod in order, dependencies first."""
    by_name, deps, builtin = _module_index(kernel)
    order: list[str] = []

    def visit(path: str) -> None:
        if path in order:
            return
        # modules.dep lists the full closure, the module needed last first: load from the end.
        for d in reversed(deps.get(path, [])):
            visit(d)
        order.append(path)

    for name in names:
        n = name.replace("-", "_")
        if n in builtin:
            continue
        if n not in by_name:
            raise EnvironmentProblem(f"kernel {kernel.version} has no module {name} (needed by the guest's NIC)")
        visit(by_name[n])
    return order


def _module_bytes(path: Path) -> bytes:
    data = path.read_bytes()
    if path.suffix == ".xz":
        return lzma.decompress(data)
    if path.suffix == ".gz":
        return gzip.decompress(data)
    if path.suffix == ".zst":
        out = subprocess.run(["zstd", "-dc", str(path)], capture_output=True, check=True)
        return out.stdout
    return data


def _plain_module_name(rel: str) -> str:
    return re.sub(r"\.(xz|gz|zst)$", "", rel)


# ------------------------------------------------------------- binaries


def _which(cmd: str) -> str | None:
    return shutil.which(cmd, path="/usr/sbin:/usr/bin:/sbin:/bin")


def find_busybox() -> str | None:
    """busybox-static's binary (a dynamically linked busybox would need its libraries too)."""
    for c in BUSYBOX_CANDIDATES:
        if os.path.exists(c) and _ldd(c) == []:
            return c
    return None


def _ldd(binary: str) -> list[str]:
    """Absolute paths of the shared objects `binary` loads (the interpreter included)."""
    try:
        out = subprocess.run(["ldd", binary], capture_output=True, text=True)
    except FileNotFoundError:
        raise EnvironmentProblem(
            f"ldd is missing, so the libraries of {binary} cannot be found for the guest: "
            "apt-get install libc-bin") from None
    if "not a dynamic executable" in (out.stdout + out.stderr) or "statically linked" in out.stdout:
        return []
    if out.returncode != 0:
        raise EnvironmentProblem(f"ldd {binary} failed: {out.stderr.strip()}")
    libs = []
    for line in out.stdout.splitlines():
        line = line.strip()
        m = re.match(r"\S+ => (/\S+) \(", line) or re.match(r"(/\S+) \(", line)
        if m:
            libs.append(m.group(1))
        elif "=> not found" in line:
            raise EnvironmentProblem(f"{binary} needs {line.split()[0]}, which is not installed")
    return libs


def guest_problems(tools: Iterable[tuple[str, str]], where: str = "guest") -> list[str]:
    """Why each of these (command, Debian package) cannot be copied into a guest (or a container image:
    `where`), with what to do; empty when all can. Asked before anything is built: either has busybox, the
    copied binaries and their libraries, and nothing else (no Python, no Perl)."""
    out = []
    for cmd, pkg in dict.fromkeys(tools):
        exe = _which(cmd)
        if exe is None:
            out.append(f"{cmd} is not installed on this machine, so it cannot be copied into the {where} "
                       f"-> apt-get install {pkg}")
            continue
        with open(os.path.realpath(exe), "rb") as f:
            head = f.read(128)
        if head.startswith(b"#!"):
            interpreter = head[2:].split(b"\n", 1)[0].strip().decode(errors="replace")
            if interpreter.split()[0] not in ("/bin/sh", "/usr/bin/sh"):
                out.append(f"{cmd} ({exe}) is a script for {interpreter}, which a {where} does not have "
                           "(it carries busybox and ELF binaries only) -> run this workload in another environment")
            continue
        if not head.startswith(b"\x7fELF"):
            out.append(f"{cmd} ({exe}) is neither an ELF binary nor a shell script -> run this workload in another "
                       "environment")
            continue
        try:
            _ldd(exe)
        except EnvironmentProblem as e:
            out.append(f"{cmd}: {e}")
    return out


def collect_tools(tools: Iterable[tuple[str, str]], add: Callable[[str, str, int], None]
                  ) -> tuple[dict[str, str], list[str]]:
    """Copy each (command, package) this machine has, as ``bin/<command>`` with the shared libraries it
    loads, through ``add(archive path, host source, mode)``: ({command: host path}, [commands it lacks]).
    Shared by the guest's initramfs and the container engines' tools image."""
    found: dict[str, str] = {}
    missing: list[str] = []
    for cmd, _pkg in tools:
        exe = _which(cmd)
        if exe is None:
            missing.append(cmd)
            continue
        found[cmd] = exe
        add(f"bin/{cmd}", os.path.realpath(exe), 0o755)
        for lib in _ldd(exe):
            # Keep the name the loader asks for (/lib64/ld-linux..., /lib/x86_64-linux-gnu/...),
            # stored as a regular file with the target's content.
            add(lib, os.path.realpath(lib), 0o755)
    return found, missing


def busybox_applets(busybox: str, exclude: Iterable[str] = ()) -> list[str]:
    """The applets `busybox` provides, less the names a real tool takes (linked to busybox in bin/)."""
    out = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True)
    skip = set(exclude) | {"busybox"}
    return sorted(a for a in out.stdout.split() if a and a not in skip)


def packages_of(paths: Iterable[str]) -> list[str]:
    """Debian packages (name=version) that own these files, in one dpkg-query call each way."""
    paths = sorted(set(paths))
    # Merged /usr: dpkg knows a library under the name the package shipped it (/lib/...).
    names = set(paths) | {p.replace("/usr/lib/", "/lib/", 1) for p in paths if p.startswith("/usr/lib/")}
    out = subprocess.run(["dpkg-query", "-S", *sorted(names)], capture_output=True, text=True)
    pkgs = set()
    for line in out.stdout.splitlines():
        owner = line.split(": ", 1)[0]
        pkgs.update(p.strip().split(":", 1)[0] for p in owner.split(","))
    if not pkgs:
        return []
    ver = subprocess.run(["dpkg-query", "-W", "-f=${Package}=${Version}\n", *sorted(pkgs)], capture_output=True,
                         text=True)
    return sorted(line for line in ver.stdout.splitlines() if line.strip())


# ---------------------------------------------------------------- cpio


class Cpio:
    """A deterministic newc ('070701') archive writer: what the kernel's initramfs unpacker reads."""

    def __init__(self) -> None:
        self.buf = io.BytesIO()
        self.ino = 1
        self.dirs: set[str] = set()

    def _entry(self, name: str, mode: int, data: bytes = b"", rdev: tuple[int, int] = (0, 0), nlink: int = 1) -> None:
        name_b = name.encode() + b"\0"
        fields = [self.ino, mode, 0, 0, nlink, 0, len(data), 0, 0, rdev[0], rdev[1], len(name_b), 0]
        self.ino += 1
        self.buf.write(b"070701" + b"".join(b"%08X" % f for f in fields))
        self.buf.write(name_b)
        self._pad()
        self.buf.write(data)
        self._pad()

    def _pad(self) -> None:
        self.buf.write(b"\0" * (-self.buf.tell() % 4))

    def dir(self, name: str, perm: int = 0o755) -> None:
        name = name.strip("/")
        if not name or name in self.dirs:
            return
        parent = name.rsplit("/", 1)[0] if "/" in name else ""
        if parent:
            self.dir(parent)
        self.dirs.add(name)
        self._entry(name, stat.S_IFDIR | perm, nlink=2)

    def file(self, name: str, data: bytes, perm: int = 0o644) -> None:
        name = name.strip("/")
        if "/" in name:
            self.dir(name.rsplit("/", 1)[0])
        self._entry(name, stat.S_IFREG | perm, data)

    def symlink(self, name: str, target: str) -> None:
        name = name.strip("/")
        if "/" in name:
            self.dir(name.rsplit("/", 1)[0])
        self._entry(name, stat.S_IFLNK | 0o777, target.encode())

    def chardev(self, name: str, major: int, minor: int, perm: int = 0o600) -> None:
        name = name.strip("/")
        if "/" in name:
            self.dir(name.rsplit("/", 1)[0])
        self._entry(name, stat.S_IFCHR | perm, rdev=(major, minor))

    def finish(self) -> bytes:
        self._entry("TRAILER!!!", 0)
        # Pad to a 512-byte block like cpio(1) does.
        self.buf.write(b"\0" * (-self.buf.tell() % 512))
        return self.buf.getvalue()


# ------------------------------------------------------------- the plan


@dataclass
class Plan:
    """Every file of the base initramfs: archive path -> (host source path, mode), plus links."""

    kernel: Kernel
    files: dict[str, tuple[str, int]] = field(default_factory=dict)
    modules: dict[str, list[str]] = field(default_factory=dict)  # nic -> load order (archive-relative)
    tools: dict[str, str] = field(default_factory=dict)  # command -> host path
    missing_optional: list[str] = field(default_factory=list)
    applets: list[str] = field(default_factory=list)
    busybox: str = ""

    def add(self, archive_path: str, source: str, perm: int) -> None:
        self.files.setdefault(archive_path.strip("/"), (source, perm))


def plan(kernel: Kernel | None = None) -> Plan:
    """Decide what goes into the base initramfs; raises EnvironmentProblem naming missing packages."""
    kernel = kernel or find_kernel()
    missing = [pkg for cmd, pkg in REQUIRED_TOOLS if _which(cmd) is None]
    busybox = find_busybox()
    if busybox is None:
        missing.insert(0, "busybox-static")
    if missing:
        raise EnvironmentProblem(f"the guest image needs: apt-get install {' '.join(sorted(set(missing)))}")
    p = Plan(kernel=kernel, busybox=busybox)
    p.add("bin/busybox", busybox, 0o755)
    p.tools, p.missing_optional = collect_tools(REQUIRED_TOOLS + optional_tools(), p.add)
    p.applets = busybox_applets(busybox, exclude=p.tools)
    for nic, names in NIC_MODULES.items():
        order = module_load_order(kernel, names)
        p.modules[nic] = [_plain_module_name(m) for m in order]
        for m in order:
            p.add(f"lib/modules/{_plain_module_name(m)}", str(kernel.modules_dir / m), 0o644)
    return p


def _digest(p: Plan) -> tuple[str, dict[str, str]]:
    h = hashlib.sha256()
    h.update(f"format {FORMAT_VERSION}\nkernel {p.kernel.version}\n".encode())
    h.update(INIT_SCRIPT.encode() + INITTAB.encode() + RUN_WRAPPER.encode())
    h.update(json.dumps(p.modules, sort_keys=True).encode() + json.dumps(p.applets).encode())
    sums = hash_files(p.files, h)
    return h.hexdigest()[:20], sums


def hash_files(files: dict[str, tuple[str, int]], into: "hashlib._Hash") -> dict[str, str]:
    """Each file's sha256 (path in the archive -> hex), and every path, mode and sum fed to `into`, in path
    order: the content part of an image's digest (the guest's initramfs, the engines' tools image)."""
    sums = {}
    for name in sorted(files):
        src, perm = files[name]
        fh = hashlib.sha256()
        with open(src, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                fh.update(chunk)
        sums[name] = fh.hexdigest()
        into.update(f"{name} {perm:o} {sums[name]}\n".encode())
    return sums


# The configuration files of a root file system made of busybox and copied binaries (a guest's, a container
# engine's tools image): a root user, and name lookups from files only.
ETC_FILES = {
    "etc/passwd": b"root:x:0:0:root:/root:/bin/sh\n",
    "etc/group": b"root:x:0:\n",
    "etc/shells": b"/bin/sh\n",
    "etc/hosts": b"127.0.0.1 localhost\n::1 localhost\n",
    "etc/nsswitch.conf": b"passwd: files\ngroup: files\nhosts: files\n",
    "etc/services": b"",
}


def _render(p: Plan) -> bytes:
    a = Cpio()
    for d in ("bin", "dev", "etc", "lib", "proc", "sys", "tmp", "run", "var", "root"):
        a.dir(d, 0o700 if d == "root" else 0o755)
    a.chardev("dev/console", 5, 1)
    a.chardev("dev/null", 1, 3, 0o666)
    for link in ("sbin", "usr/bin", "usr/sbin"):
        a.symlink(link, "/bin")
    for name in sorted(p.files):
        src, perm = p.files[name]
        data = _module_bytes(Path(src)) if name.startswith("lib/modules/") else Path(src).read_bytes()
        a.file(name, data, perm)
    for applet in p.applets:
        a.symlink(f"bin/{applet}", "busybox")
    a.file("init", INIT_SCRIPT.encode(), 0o755)
    a.file("bin/vnb-run", RUN_WRAPPER.encode(), 0o755)
    a.file("etc/inittab", INITTAB.encode())
    for name, data in ETC_FILES.items():
        a.file(name, data)
    for nic, mods in p.modules.items():
        a.file(f"etc/vnb/modules-{nic}", ("\n".join(mods) + "\n").encode())
    return a.finish()


@dataclass(frozen=True)
class Image:
    path: Path
    digest: str
    kernel: Kernel
    manifest: dict


_BUILT: dict[tuple, Image] = {}
STALE_AFTER_S = 24 * 3600


def build(kernel: Kernel | None = None, cache_dir: Path | None = None, compress: bool = False) -> Image:
    """The base initramfs for `kernel`, from the cache when its inputs have not changed.

    Uncompressed by default: under TCG the kernel unpacks a plain cpio faster than it
    inflates a gzip'd one (measured 4.4 s against 7.6 s to SSH, bench/environments_vm.py).
    Within one process the inputs are hashed once per kernel.
    """
    kernel = kernel or find_kernel()
    cache_dir = Path(cache_dir or CACHE_DIR)
    memo_key = (kernel, str(cache_dir), compress)
    known = _BUILT.get(memo_key)
    if known is not None and known.path.exists():
        return known
    p = plan(kernel)
    digest, sums = _digest(p)
    cache_dir.mkdir(parents=True, exist_ok=True)
    suffix = ".cpio.gz" if compress else ".cpio"
    path = cache_dir / f"initramfs-{p.kernel.version}-{digest}{suffix}"
    manifest_path = path.with_name(path.name + ".json")
    if path.exists() and manifest_path.exists():
        image = Image(path, digest, p.kernel, json.loads(manifest_path.read_text()))
        _BUILT[memo_key] = image
        return image
    raw = _render(p)
    if compress:
        out = io.BytesIO()
        with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=6, mtime=0) as gz:
            gz.write(raw)
        data = out.getvalue()
    else:
        data = raw
    packages = packages_of(src for src, _ in p.files.values())
    manifest = {
        "digest": digest, "kernel": p.kernel.version, "format": FORMAT_VERSION, "compressed": compress,
        "size_bytes": len(data), "uncompressed_bytes": len(raw), "packages": packages,
        "tools": p.tools, "missing_optional_tools": p.missing_optional, "modules": p.modules, "files": sums,
    }
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    tmp_m = manifest_path.with_name(f".{manifest_path.name}.{os.getpid()}")
    tmp_m.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    os.replace(tmp_m, manifest_path)
    _prune(cache_dir, keep=path)
    image = Image(path, digest, p.kernel, manifest)
    _BUILT[memo_key] = image
    return image


def _prune(cache_dir: Path, keep: Path) -> None:
    """Drop images whose inputs changed (an upgraded package) once nobody can still be starting from them."""
    now = time.time()
    for old in cache_dir.glob("initramfs-*"):
        if old.name.startswith(keep.name):
            continue
        try:
            if now - old.stat().st_mtime > STALE_AFTER_S:
                old.unlink()
        except OSError:
            pass


def overlay(authorized_key: str, host_key: bytes) -> bytes:
    """The per-guest part (uncompressed newc): the client's public key and the server's host key."""
    a = Cpio()
    a.dir("root", 0o700)
    a.dir("root/.ssh", 0o700)
    a.file("root/.ssh/authorized_keys", authorized_key.strip().encode() + b"\n", 0o600)
    a.dir("etc/dropbear", 0o700)
    a.file("etc/dropbear/host_key", host_key, 0o600)
    return a.finish()


def guest_initrd(base: Image, overlay_bytes: bytes, dest: Path) -> Path:
    """Write overlay + base as one initrd file: the kernel unpacks both, in that order."""
    with open(dest, "wb") as out:
        out.write(overlay_bytes)
        with open(base.path, "rb") as f:
            shutil.copyfileobj(f, out)
    return dest
