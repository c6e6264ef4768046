"""`vnetbench clean`: remove what a killed run left behind, and nothing else.

Only namespaces and cgroups named ``vnb-*`` that carry vnetbench's mark (:mod:`vnetbench.lab.marks`: a
file made beside them when they were made), and containers and networks that carry the label
``org.vnetbench.run`` in a container engine, are considered ours; a ``vnb-*`` name without a mark is
reported and left alone, and the processes of the machine's own namespace are never signalled. Processes
inside the namespaces are killed first (a namespace with a live process would
survive its name), then the namespaces are removed, which removes every
interface, bridge, qdisc and nftables table inside. Nothing of ours lives in
the root namespace. Container cgroups (``vnb-*`` in any cgroup hierarchy, v1 or
v2) are emptied the same way and removed. A namespace vnetbench only named (an
engine's, ``*.foreign``) is unmounted; its processes are never signalled.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from vnetbench import runlock
from vnetbench.errors import EnvironmentProblem
from vnetbench.lab import cgroups, marks, netns


@dataclass
class CleanReport:
    namespaces: list[str] = field(default_factory=list)
    processes: list[int] = field(default_factory=list)
    cgroups: list[str] = field(default_factory=list)
    engine_objects: list[str] = field(default_factory=list)  # "docker container NAME", "docker network NAME"
    errors: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)  # work and SSH control directories, in the temp directory
    live: list[runlock.LiveRun] = field(default_factory=list)  # runs still measuring: left alone
    not_ours: list[str] = field(default_factory=list)  # vnb-* namespaces and cgroups without vnetbench's mark


def leftovers(prefix: str = netns.PREFIX) -> list[str]:
    """vnetbench's namespaces under `prefix`, but not a live process's throw-away probe (netns.TRANSIENT): a
    `doctor` or a run checking its qdiscs at this moment has left nothing, and removing it would break it."""
    return [n for n in netns.list_names() if n.startswith(prefix)
            and not ((owner := netns.transient_owner(n)) is not None and _alive(owner))]


def cgroup_leftovers(prefix: str = netns.PREFIX) -> list[str]:
    """Paths of vnb-* cgroups that vnetbench made (marked), in every hierarchy."""
    return [str(p) for p in cgroups.find(prefix) if marks.is_marked("cgroup", p.name)]


def marked_leftovers(prefix: str = netns.PREFIX) -> list[str]:
    """vnetbench's namespaces under `prefix` that carry its mark."""
    return [n for n in leftovers(prefix) if marks.is_marked("netns", n)]


def not_ours(prefix: str = netns.PREFIX) -> list[str]:
    """vnb-* namespaces and cgroups without vnetbench's mark: someone else's names, left alone."""
    return ([f"namespace {n}" for n in leftovers(prefix) if not marks.is_marked("netns", n)]
            + [f"cgroup {p}" for p in cgroups.find(prefix) if not marks.is_marked("cgroup", p.name)])


def _stale_marks(prefix: str, skip: tuple[str, ...]) -> list[tuple[str, str]]:
    """Marks whose namespace or cgroup is gone (removed by other means, or made by a run killed before)."""
    names = set(netns.list_names())
    groups = {p.name for p in cgroups.find(prefix)}
    return [(kind, name) for kind, present in (("netns", names), ("cgroup", groups)) for name in marks.marked(kind)
            if name.startswith(prefix) and not any(name.startswith(p) for p in skip) and name not in present]


def engine_leftovers(prefix: str = netns.PREFIX, skip: tuple[str, ...] = (), remove: bool = False,
                     images: bool = False) -> tuple[list[str], list[str]]:
    """What runs left in the container engines (labelled containers and networks whose run prefix starts
    with `prefix`, but not with one of `skip`), removed when asked: ([descriptions], [errors]). An engine
    that is not installed is skipped; one that is installed but does not answer is an error, since it may
    hold our containers. With `images`, vnetbench's tools images too."""
    from vnetbench.lab import engines

    found: list[str] = []
    errors: list[str] = []
    for kind in engines.DEFAULT_URLS:
        url = engines.engine_url(kind)
        path = engines.socket_path(url)
        if path is not None and not os.path.exists(path):
            continue
        try:
            engine = engines.connect(kind)
            containers, networks = engines.leftovers(engine, prefix)
            doomed = [(what, obj) for what, objs in (("container", containers), ("network", networks))
                      for obj in objs if not engines.labelled(obj, *skip)]
            if images:
                doomed += [("image", i) for i in engines.images(engine)]
            for what, obj in doomed:
                label = obj.tags[0] if what == "image" and obj.tags else getattr(obj, "name", obj.id[:19])
                found.append(f"{kind} {what} {label}")
                if remove:
                    try:
                        if what == "container":
                            obj.remove(force=True, v=True)
                        elif what == "image":
                            engine.client.images.remove(obj.id, force=True)
                        else:
                            obj.remove()
                    except Exception as e:  # noqa: BLE001 - one failure must not strand the rest
                        errors.append(f"{kind} {what} {label}: {str(e)[:200]}")
        except EnvironmentProblem as e:  # installed, not answering: says how to start it
            errors.append(str(e))
        except Exception as e:  # noqa: BLE001 - an engine that fails half-way is said, not a traceback
            errors.append(f"{kind} at {url}: {str(e)[:300]}")
    # After the networks: what CNI kept of networks no engine has any more.
    for state in engines.cni_state(prefix, skip):
        found.append(f"CNI address state {state}")
        if remove:
            engines.forget_cni_state(state.name)
    return found, errors


def clean(prefix: str = netns.PREFIX, dry_run: bool = False, images: bool = False) -> CleanReport:
    if not prefix.startswith(netns.PREFIX):
        raise ValueError(f"refusing to clean {prefix!r}: only names starting with {netns.PREFIX!r} are vnetbench's")
    report = CleanReport()
    # A run that is still measuring is not a leftover: its namespaces are its lab, in use.
    live = {netns.run_prefix(r.run_id) + "-": r for r in runlock.live_runs()}
    if prefix in live:
        raise EnvironmentProblem(f"{live[prefix].describe()} is measuring now; `vnetbench clean` removes only what a "
                                 "killed run left: stop it with Ctrl-C (it tears its lab down itself)")
    report.live = [r for p, r in live.items() if p.startswith(prefix)]

    def ours(name: str) -> bool:
        return not any(name.startswith(p) for p in live)

    # The engines first: removing a container ends its processes the engine's way, and its network after it.
    report.engine_objects, report.errors = engine_leftovers(prefix, skip=tuple(live), remove=not dry_run,
                                                            images=images)
    names = [n for n in marked_leftovers(prefix) if ours(n)]
    report.not_ours = [w for w in not_ours(prefix) if ours(w.split(" ", 1)[1].rsplit("/", 1)[-1])]
    for name in names:
        report.namespaces.append(name)
        # An engine's namespace, or the machine's own under a name we gave it: its processes are not ours.
        if not netns.is_foreign(name) and not netns.is_hosts_own(name):
            report.processes.extend(netns.pids(name))
    report.cgroups = [c for c in cgroup_leftovers(prefix) if ours(Path(c).name)]
    stale = _stale_marks(prefix, tuple(live))
    report.files = [str(p) for p in file_leftovers(prefix, skip=tuple(live))]
    if dry_run:
        return report
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [p for p in report.processes if _alive(p)]
        for pid in alive:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 2
        while any(_alive(p) for p in alive) and time.monotonic() < deadline:
            time.sleep(0.02)
    for name in names:
        try:
            netns.remove(name)
        except OSError as e:
            report.errors.append(f"{name}: {e}")
    for path in report.cgroups:
        try:
            cgroups.remove_dir(Path(path))
        except OSError as e:
            report.errors.append(f"{path}: {e}")
    for name in {Path(c).name for c in report.cgroups} - {p.name for p in cgroups.find(prefix)}:
        marks.unmark("cgroup", name)  # every hierarchy's directory of it is gone
    for kind, name in stale:
        marks.unmark(kind, name)
    for path in report.files:
        masters = _control_masters(Path(path))
        for pid in masters:  # their connection goes with them; the host keeps nothing
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 2  # each removes its own socket as it goes
        while any(_alive(p) for p in masters) and time.monotonic() < deadline:
            time.sleep(0.02)
        try:
            shutil.rmtree(path, onerror=_gone_is_fine)
        except OSError as e:
            report.errors.append(f"{path}: {e}")
    return report


def _gone_is_fine(function: object, path: str, exc_info: tuple) -> None:
    """shutil.rmtree's error handler: a file that went meanwhile (a socket its master removed) is no error."""
    if not issubclass(exc_info[0], FileNotFoundError):
        raise exc_info[1]


def file_leftovers(prefix: str = netns.PREFIX, skip: tuple[str, ...] = ()) -> list[Path]:
    """Directories a killed run left in the temp directory: its work directory (servers' and trials' files,
    named netns.WORKDIR_PREFIX + its run prefix), unless its run is in `skip` (measuring now); and, when every run
    is cleaned, the SSH control directories (hosts/ssh.py, named with their owner's pid) of a vnetbench
    that is gone. Only real directories of this user's."""
    from vnetbench.hosts.ssh import CONTROL_DIR_PREFIX

    tmp = Path(tempfile.gettempdir())
    found = []
    for path in tmp.glob(f"{netns.WORKDIR_PREFIX}{prefix}*"):
        run = path.name[len(netns.WORKDIR_PREFIX):]
        if _own_dir(path) and not any(run.startswith(p) for p in skip):
            found.append(path)
    if prefix == netns.PREFIX:
        for path in tmp.glob(f"{CONTROL_DIR_PREFIX}*"):
            owner = path.name[len(CONTROL_DIR_PREFIX):].partition("-")[0]
            if owner.isdigit() and _alive(int(owner)):
                continue  # in use (a pid reused by another process keeps it too: left, not wrongly removed)
            if _own_dir(path):
                found.append(path)
    return sorted(found)


def _control_masters(path: Path) -> list[int]:
    """ssh masters still serving a control directory whose vnetbench is gone (their title names the socket)."""
    needle = f"{path}/".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "cmdline").read_bytes().startswith(b"ssh: " + needle):
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def _own_dir(path: Path) -> bool:
    try:
        st = path.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purpose: it holds no namespace.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
