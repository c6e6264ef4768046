"""Which vnetbench runs are measuring on this machine right now.

Two runs on one machine measure each other: each one's iperf3 and guests take the
cores the other's numbers depend on. So every run holds an exclusive ``flock`` on
its own file in ``/run/vnetbench`` for as long as it measures, and a new run looks
there first. A lock is the kernel's, not a pid written down: it goes away with the
process however the process ends (kill -9 included), and a recycled pid can never
make a dead run look alive. The same files tell ``vnetbench runs`` whether a run
stored as ``running`` is still running or was interrupted.

``/run`` is a tmpfs, emptied at boot, so a file there never outlives the machine's
uptime; a run recorded under another boot id is interrupted whatever its file says.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from vnetbench.errors import EnvironmentProblem
from vnetbench.units import utc_text

LOCK_DIR = Path("/run/vnetbench")
_GATE = ".gate"  # held while a run looks for others and takes its own file, so two starting at once see each other


def boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


@dataclass(frozen=True)
class LiveRun:
    run_id: str
    pid: int
    scenario: str
    db: str
    started: float

    def describe(self) -> str:
        return (f"run {self.run_id} (scenario {self.scenario!r}, pid {self.pid}, database {self.db}, "
                f"started {utc_text(self.started)})")


def _path(run_id: str, lock_dir: Path) -> Path:
    return lock_dir / f"run-{run_id}.lock"


def _held(path: Path) -> bool:
    """True when another open file description holds ``path``'s lock (its run is alive)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # closing drops the shared lock we may have taken
    return False


def _read(path: Path) -> LiveRun | None:
    try:
        info = json.loads(path.read_text())
        return LiveRun(str(info["run_id"]), int(info["pid"]), str(info.get("scenario", "?")),
                       str(info.get("db", "?")), float(info.get("started", 0)))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def live_runs(lock_dir: Path = LOCK_DIR, *, exclude: str | None = None) -> list[LiveRun]:
    """The runs measuring on this machine now (their process holds its lock)."""
    try:
        paths = sorted(lock_dir.glob("run-*.lock"))
    except OSError:
        return []
    found = []
    for p in paths:
        if _held(p):
            info = _read(p)
            if info is not None and info.run_id != exclude:
                found.append(info)
    return found


def is_live(run_id: str, lock_dir: Path = LOCK_DIR) -> bool:
    return _held(_path(run_id, lock_dir))


def effective_status(stored: str, run_id: str, recorded_boot_id: str | None, lock_dir: Path = LOCK_DIR) -> str:
    """``running`` only while the run's process is alive on this machine; a stored ``running`` whose process
    is gone (killed, machine rebooted) is ``interrupted``. Other statuses are as stored."""
    if stored != "running":
        return stored
    if recorded_boot_id and recorded_boot_id != boot_id():
        return "interrupted"  # recorded during an earlier boot (or on another machine): not running here
    return "running" if is_live(run_id, lock_dir) else "interrupted"


@contextmanager
def _gate(lock_dir: Path) -> Iterator[None]:
    fd = os.open(lock_dir / _GATE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class RunLock:
    """This run's claim on the machine: taken before the lab is built, released when the run ends."""

    def __init__(self, run_id: str, *, scenario: str, db: str, lock_dir: Path = LOCK_DIR):
        self.run_id, self.scenario, self.db, self.lock_dir = run_id, scenario, db, lock_dir
        self.fd: int | None = None
        self.others: list[LiveRun] = []  # runs that were measuring when this one started

    def acquire(self, allow_concurrent: bool = False) -> "RunLock":
        """Take the lock, or refuse (EnvironmentProblem) while another run measures, unless ``allow_concurrent``;
        then ``others`` names the runs this one will share the machine with."""
        try:
            self.lock_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
            with _gate(self.lock_dir):
                self.others = live_runs(self.lock_dir, exclude=self.run_id)
                if self.others and not allow_concurrent:
                    raise EnvironmentProblem(
                        "another vnetbench run is measuring on this machine: "
                        + "; ".join(o.describe() for o in self.others)
                        + ". Two runs on one machine load the same cores and compromise each other's numbers: "
                        "wait for it, or pass --allow-concurrent (recorded in the run and shown in its report)")
                self._take()
        except OSError as e:
            raise EnvironmentProblem(f"cannot take the run lock in {self.lock_dir}: {e.strerror or e}; "
                                     "vnetbench needs a writable /run (it runs as root)") from None
        return self

    def _take(self) -> None:
        path = _path(self.run_id, self.lock_dir)
        for stale in self.lock_dir.glob("run-*.lock"):
            if stale != path and not _held(stale):
                stale.unlink(missing_ok=True)  # its run ended without removing it (killed): tidy, under the gate
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = _read(path)
            raise EnvironmentProblem(f"run {self.run_id} is already running on this machine "
                                     f"({holder.describe() if holder else path})") from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"run_id": self.run_id, "pid": os.getpid(), "scenario": self.scenario,
                                 "db": self.db, "started": time.time()}).encode())
        self.fd = fd

    def release(self) -> None:
        if self.fd is None:
            return
        _path(self.run_id, self.lock_dir).unlink(missing_ok=True)  # unlinked while held: no one can take it stale
        os.close(self.fd)
        self.fd = None

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
