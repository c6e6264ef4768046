"""Files a scenario names (a rate trace, a containerlab topology), read as root: within bounds, quoting nothing.

A scenario names the file by path, and vnetbench reads it as root: so the path is the scenario's, but what is
read must be that kind of file and nothing else. A path under /proc, /sys or /dev, anything but a regular
file, an empty file (the kernel's files, /proc/kmsg among them, are regular and say they are empty) or one
larger than its limit is refused before a byte is read. The file is opened without blocking (a FIFO planted
after the check cannot hang the run), checked again as opened, and read with a bound on its size and its
time. Messages name the file, never what it holds: a secret named as a trace stays secret.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from vnetbench import units
from vnetbench.limits import Limit

# Kernel and device files: never a user's file, and reading some of them blocks or has effects.
NOT_USER_FILES = ("/proc", "/sys", "/dev")
# 64 MiB read from a local disk in well under a second, and a cold one in a few.
READ_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Kind:
    """What a file must be: how messages call it ("trace file"), what to give instead, and its size limit."""

    what: str
    hint: str  # "give a Mahimahi trace file"
    limit: Limit
    too_big: str = "shorten it"  # what to do with a file over the limit


def _under(path: str, roots: tuple[str, ...]) -> str | None:
    return next((r for r in roots if path == r or path.startswith(r + "/")), None)


def open_checked(path: str | Path, kind: Kind) -> tuple[int, os.stat_result, str]:
    """(descriptor, its stat, the path for messages) of a file that may be of `kind`; ValueError otherwise."""
    shown = units.brief(str(path))
    root = _under(os.path.realpath(path), NOT_USER_FILES)
    if root is not None:
        raise ValueError(f"{kind.what} {shown} is under {root}, a kernel or device file: {kind.hint}")
    try:
        # O_NONBLOCK: a FIFO put at the path after the check above opens without waiting for a writer
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        raise ValueError(f"{kind.what} {shown} cannot be read: {e.strerror or e}") from None
    try:
        info = os.fstat(fd)
        opened = os.readlink(f"/proc/self/fd/{fd}")  # as the kernel resolved it: no link swapped in meanwhile
        root = _under(opened, NOT_USER_FILES)
        if not stat.S_ISREG(info.st_mode) or root is not None:
            raise ValueError(f"{kind.what} {shown} is not a regular file (a device, pipe, directory or kernel "
                             f"file): {kind.hint}")
        if info.st_size == 0:
            raise ValueError(f"{kind.what} {shown} is empty: {kind.hint}")
        if info.st_size > kind.limit.value:
            raise ValueError(f"{kind.what} {shown} has {info.st_size:,} bytes, over {kind.limit}: {kind.too_big}")
    except BaseException:
        os.close(fd)
        raise
    return fd, info, shown


def identity(info: os.stat_result) -> tuple[int, ...]:
    """A file as read: (device, inode, size, mtime ns, ctime ns); a rewritten file has another."""
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns


def read_bounded(fd: int, shown: str, kind: Kind) -> bytes:
    """The whole file, and not a byte beyond its limit (a file that grew since it was checked is refused),
    within READ_TIMEOUT_S (a file on a share that has stopped answering, or that trickles, is refused, not
    waited for)."""
    most = kind.limit.value
    chunks, size = [], 0
    deadline = time.monotonic() + READ_TIMEOUT_S
    while size <= most:
        if time.monotonic() > deadline:
            raise ValueError(f"{kind.what} {shown} could not be read within {READ_TIMEOUT_S:g} s ({size:,} bytes "
                             "read): copy it to a local disk")
        chunk = os.read(fd, min(1 << 20, most + 1 - size))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
    raise ValueError(f"{kind.what} {shown} grew beyond {kind.limit} while it was read: shorten it")


def read_user_file(path: str | Path, kind: Kind) -> tuple[bytes, tuple[int, ...], str]:
    """(bytes, identity, the path for messages) of the file at `path`, checked and read within bounds."""
    fd, info, shown = open_checked(path, kind)
    try:
        return read_bounded(fd, shown, kind), identity(info), shown
    finally:
        os.close(fd)
