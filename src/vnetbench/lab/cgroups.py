"""Control groups for container limits: CPU quota, cpuset and memory, as Docker sets them.

A container's limits live in one cgroup per run and node, named like its
namespaces (``vnb-<run>-<node>``) so `vnetbench clean` can find what a killed
run left. The kernel's interface is used directly (files under the cgroup
mount), no systemd and no libcgroup.

Both cgroup versions are handled, because machines still ship both:

- v2 (unified): one directory, ``cpu.max``, ``cpuset.cpus``, ``memory.max``;
  the controllers are enabled in the parent's ``cgroup.subtree_control``.
- v1 (one hierarchy per controller, or a hybrid where the v2 mount holds no
  controllers): ``cpu.cfs_quota_us``/``cpu.cfs_period_us``, ``cpuset.cpus``
  (+ ``cpuset.mems``, which must be set before a task may join) and
  ``memory.limit_in_bytes``. This is what runc writes on such hosts.

Where a controller is found on both, v2 wins. New groups are made below the
cgroup this process runs in, so the container's processes stay inside whatever
accounting the caller is under; on v2, whose parent may not hold processes and
enable controllers at once, they go below the root instead (Docker's cgroupfs
driver does the same).

Processes join at exec time: the host runs each workload through a tiny shell
wrapper that writes its own pid to ``cgroup.procs`` and then execs the tool,
so no instruction of the tool ever runs outside the limits (writing the pid of
a started process afterwards would be racy).
"""

from __future__ import annotations

import errno
import os
import shlex
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from vnetbench.errors import EnvironmentProblem, LabError
from vnetbench.lab import marks
from vnetbench.lab.teardown import Registry, atomic

CFS_PERIOD_US = 100_000
CONTROLLERS = ("cpu", "cpuset", "memory")


@dataclass(frozen=True)
class Limits:
    """What to limit; None = unlimited."""

    cpu_quota: float | None = None  # CPUs (0.5 = half of one CPU per period)
    cpuset: str | None = None  # "1", "0-1", "0,2"
    memory_bytes: int | None = None
    # cpu.idle (Linux 5.15+, v1 and v2): the group competes for a core as a SCHED_IDLE task does, at the lowest
    # weight, and gives it up to any other task that wakes there (lab/idle.py's pollers)
    cpu_idle: bool = False

    def controllers(self) -> list[str]:
        wanted = [("cpu", self.cpu_quota is not None or self.cpu_idle), ("cpuset", self.cpuset is not None),
                  ("memory", self.memory_bytes is not None)]
        return [c for c, used in wanted if used]

    def __bool__(self) -> bool:
        return bool(self.controllers())


@dataclass(frozen=True)
class Mount:
    path: Path
    version: int  # 1 or 2
    controllers: frozenset[str]
    own: str  # this process's cgroup path in this hierarchy ("/..." relative to the mount)


def _mounts() -> list[Mount]:
    own_v1: dict[str, str] = {}
    own_v2 = "/"
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            hid, ctrls, path = line.split(":", 2)
            if hid == "0":
                own_v2 = path
            for c in ctrls.split(","):
                own_v1[c] = path
    except OSError:
        pass
    found = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        pre, _, post = line.partition(" - ")
        fields, extra = pre.split(), post.split()
        if len(fields) < 5 or len(extra) < 3:
            continue
        fstype, mountpoint, options = extra[0], Path(fields[4]), extra[2].split(",")
        if fstype == "cgroup2":
            try:
                ctrls = frozenset((mountpoint / "cgroup.controllers").read_text().split())
            except OSError:
                ctrls = frozenset()
            found.append(Mount(mountpoint, 2, ctrls, own_v2))
        elif fstype == "cgroup":
            ctrls = frozenset(o for o in options if o in CONTROLLERS or o == "cpuacct")
            if ctrls:
                own = next((own_v1[c] for c in ctrls if c in own_v1), "/")
                found.append(Mount(mountpoint, 1, ctrls, own))
    return found


def mount_for(controller: str) -> Mount | None:
    """Where `controller` can be used: the v2 mount if it has it, else its v1 hierarchy."""
    mounts = _mounts()
    for version in (2, 1):
        for m in mounts:
            if m.version == version and controller in m.controllers:
                return m
    return None


LIMIT_FILES = {"cpu": ("cpu.max", "cpu.cfs_quota_us", "cpu.cfs_period_us"), "cpuset": ("cpuset.cpus",),
               "memory": ("memory.max", "memory.limit_in_bytes")}


def read_limits(dirs: dict[str, Path]) -> dict[str, str]:
    """The limit files of these cgroup directories (per controller) as the kernel reports them, by file name;
    a v2 directory serves every controller, so the same path may come for several."""
    out = {}
    for controller, path in dirs.items():
        for name in LIMIT_FILES[controller]:
            try:
                out[name] = (path / name).read_text().strip()
            except OSError:
                pass
    return out


def dirs_of(pid: int) -> dict[str, Path]:
    """The cgroup directory process `pid` is in, per controller (a container an engine made, say)."""
    own_v1: dict[str, str] = {}
    own_v2 = None
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        hid, ctrls, path = line.split(":", 2)
        if hid == "0":
            own_v2 = path
        for c in ctrls.split(","):
            own_v1[c] = path
    out = {}
    for c in CONTROLLERS:
        m = mount_for(c)
        rel = (own_v2 if m is not None and m.version == 2 else own_v1.get(c)) if m is not None else None
        if m is not None and rel is not None:
            out[c] = m.path / rel.lstrip("/")
    return out


@dataclass(frozen=True)
class CpuAccount:
    """The CPU time a cgroup's processes had, every process that was ever in it (an engine's container: its
    servers, the commands exec'd into it, their system time): cgroup v2's ``cpu.stat`` (usage_usec, kept
    whether or not the cpu controller is enabled) or v1's ``cpuacct.usage`` (nanoseconds)."""

    label: str  # whose it is ("r", "s1")
    path: Path  # the counter's file

    def ns(self) -> int | None:
        try:
            text = self.path.read_text()
        except OSError:
            return None  # the cgroup is gone
        if self.path.name == "cpuacct.usage":
            return int(text.strip())
        usec = next((int(line.split()[1]) for line in text.splitlines() if line.startswith("usage_usec ")), None)
        return None if usec is None else usec * 1000


def cpu_account(label: str, pid: int) -> CpuAccount | None:
    """The CPU account of the cgroup process `pid` is in (None: neither hierarchy counts its CPU here)."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    v1 = mount_for("cpuacct")  # a v1 hierarchy: v2 has no cpuacct controller, and counts in cpu.stat instead
    for line in lines:
        hid, ctrls, rel = line.split(":", 2)
        if v1 is not None and "cpuacct" in ctrls.split(",") and (
                path := v1.path / rel.lstrip("/") / "cpuacct.usage").exists():
            return CpuAccount(label, path)
        if hid == "0":
            for m in _mounts():
                if m.version == 2 and (path := m.path / rel.lstrip("/") / "cpu.stat").exists():
                    return CpuAccount(label, path)
    return None


def availability() -> dict[str, str | None]:
    """{controller: None if usable, else why not} for cpu, cpuset and memory."""
    out: dict[str, str | None] = {}
    for c in CONTROLLERS:
        m = mount_for(c)
        out[c] = None if m else f"no cgroup hierarchy (v2 or v1) offers the {c} controller"
    return out


def describe() -> str:
    """One line for doctor and the fingerprint: which version serves which controller."""
    parts = []
    for c in CONTROLLERS:
        m = mount_for(c)
        parts.append(f"{c}: v{m.version} at {m.path}" if m else f"{c}: missing")
    return "; ".join(parts)


@dataclass
class CGroup:
    """One container's cgroup: a directory per hierarchy that serves a limited controller."""

    name: str
    limits: Limits
    dirs: dict[str, Path] = field(default_factory=dict)  # controller -> directory
    version: dict[str, int] = field(default_factory=dict)  # controller -> 1 | 2

    @classmethod
    def create(cls, name: str, limits: Limits, registry: Registry) -> "CGroup":
        if not name.startswith("vnb-"):
            raise ValueError(f"cgroup {name!r}: vnetbench's cgroups are named vnb-*")
        group = cls(name, limits)
        # Marked before any directory exists, unmarked after all are gone (the registry undoes in reverse):
        # `clean` removes only cgroups with a mark (a user's vnb-nightly.service is not ours).
        with atomic():
            marks.mark("cgroup", name)
            registry.add(f"the mark of cgroup {name}", lambda: marks.unmark("cgroup", name))
        for controller in limits.controllers():
            mount = mount_for(controller)
            if mount is None:
                raise EnvironmentProblem(
                    f"the container limit needs the cgroup {controller} controller, which this machine does not "
                    f"offer ({describe()}); drop the limit or boot with cgroups enabled")
            parent = _parent_dir(mount, controller)
            path = parent / name
            group.version[controller] = mount.version
            if path in group.dirs.values():  # v2: one directory serves every controller
                group.dirs[controller] = path
                continue
            with atomic():
                try:
                    path.mkdir()
                except FileExistsError:
                    raise LabError(f"cgroup {path} already exists: a run with this id is active, or run "
                                   "`vnetbench clean`") from None
                registry.add(f"cgroup {path}", lambda p=path: remove_dir(p))
            group.dirs[controller] = path
        group._write_limits()
        return group

    def _write_limits(self) -> None:
        lim = self.limits
        for controller, path in self.dirs.items():
            v2 = self.version[controller] == 2
            try:
                if controller == "cpu":
                    if lim.cpu_idle:
                        _write(path / "cpu.idle", "1")
                    if lim.cpu_quota is not None:
                        quota = int(round(lim.cpu_quota * CFS_PERIOD_US))
                        if v2:
                            _write(path / "cpu.max", f"{quota} {CFS_PERIOD_US}")
                        else:
                            _write(path / "cpu.cfs_period_us", str(CFS_PERIOD_US))
                            _write(path / "cpu.cfs_quota_us", str(quota))
                elif controller == "cpuset":
                    if not v2:  # v1 refuses tasks until both are set; memory nodes as the parent's
                        _write(path / "cpuset.mems", (path.parent / "cpuset.mems").read_text().strip())
                    _write(path / "cpuset.cpus", lim.cpuset)
                elif controller == "memory":
                    _write(path / ("memory.max" if v2 else "memory.limit_in_bytes"), str(int(lim.memory_bytes)))
            except OSError as e:
                raise LabError(f"setting the {controller} limit of cgroup {path}: {e.strerror or e}") from None

    def procs_files(self) -> list[Path]:
        return sorted({p / "cgroup.procs" for p in self.dirs.values()})

    def wrapper(self) -> list[str]:
        """argv prefix that joins this cgroup, then execs the rest of the command line."""
        joins = " && ".join(f"echo $$ > {shlex.quote(str(f))}" for f in self.procs_files())
        return ["sh", "-c", f'{joins} && exec "$@"', "vnb-cgroup"]

    def read(self) -> dict[str, str]:
        """The limits as the kernel reports them, keyed by file name (for the record and tests)."""
        return read_limits(self.dirs)

    def pids(self) -> list[int]:
        out: set[int] = set()
        for f in self.procs_files():
            try:
                out.update(int(x) for x in f.read_text().split())
            except OSError:
                pass
        return sorted(out)


def _parent_dir(mount: Mount, controller: str) -> Path:
    if mount.version == 1:
        return mount.path / mount.own.lstrip("/")
    # v2: below our own cgroup if it can hand the controller down, else below the root.
    own = mount.path / mount.own.lstrip("/")
    for parent in (own, mount.path) if own != mount.path else (mount.path,):
        try:
            enabled = (parent / "cgroup.subtree_control").read_text().split()
            if controller not in enabled:
                _write(parent / "cgroup.subtree_control", f"+{controller}")
            return parent
        except OSError:
            continue
    raise EnvironmentProblem(f"cannot enable the cgroup v2 {controller} controller for child groups of "
                             f"{own} or {mount.path}")


def _write(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def remove_dir(path: Path, grace: float = 2.0) -> None:
    """rmdir a cgroup (children first); processes still inside are killed first."""
    if not path.exists():
        return
    for child in sorted((p for p in path.iterdir() if p.is_dir()), reverse=True):
        remove_dir(child, grace)
    deadline = time.monotonic() + grace
    sig = signal.SIGTERM
    while True:
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno != errno.EBUSY or time.monotonic() > deadline + 2:
                raise
        for pid in _procs(path):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            sig = signal.SIGKILL
        time.sleep(0.02)


def _procs(path: Path) -> list[int]:
    try:
        return [int(x) for x in (path / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def find(prefix: str = "vnb-", max_depth: int = 8) -> list[Path]:
    """Every cgroup directory named prefix* in any hierarchy (not descending into them)."""
    found: list[Path] = []
    seen: set[Path] = set()
    for m in _mounts():
        if m.path in seen:
            continue
        seen.add(m.path)
        base_depth = len(m.path.parts)
        for root, dirs, _files in os.walk(m.path):
            if len(Path(root).parts) - base_depth >= max_depth:
                dirs[:] = []
                continue
            keep = []
            for d in dirs:
                if d.startswith(prefix):
                    found.append(Path(root) / d)
                else:
                    keep.append(d)
            dirs[:] = keep
    return sorted(found)
