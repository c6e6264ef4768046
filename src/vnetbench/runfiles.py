"""The files a run's processes write their output to: new files of vnetbench's naming, in the run's directory.

A run starts tools as root and sends each one's output to files in its own work directory (made by mkdtemp:
0700, root's). Three rules keep those files from ever being anything else:

- their names are vnetbench's, from indices and fixed words (``3.out``, ``server-0.err``), never text from a
  scenario or an inventory, and a name must be one plain path component (checked here, whoever calls);
- the directory actually opened must be the run's (``within``) or inside it, as the kernel resolved it;
- the file is created new (``O_CREAT | O_EXCL``, mode 0600) without following a link at its name
  (``O_NOFOLLOW``): whatever stood at the name (a planted link to ``/etc/...``, a FIFO, an old output) is
  removed first, the directory entry itself and never what it points to.

Everything goes through a descriptor of the directory, so nothing is resolved twice.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import BinaryIO

from vnetbench.errors import LabError

# The names vnetbench gives these files: one plain component (no "/" or NUL, not "." or ".."), no leading "-"
# or ".". (Names users choose follow scenario/names.py; none of them is part of these.)
FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def create(path: Path, within: Path | None = None) -> BinaryIO:
    """A new, empty file at `path`, open for writing: `path` is a directory of the run's and a file name of
    vnetbench's. The directory, as opened, must resolve to `within` (a directory vnetbench made: the run's
    work directory) or inside it; default: the file's own directory, when that is the one vnetbench made."""
    path = Path(path)
    if not FILE_NAME.fullmatch(path.name) or ".." in path.parts:
        raise LabError(f"{path!s:.200}: not a file name vnetbench makes (one plain component, in the run's "
                       "directory); this is a bug in vnetbench, please report it")
    directory = path.parent
    root = os.path.realpath(within if within is not None else directory)
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        opened = os.readlink(f"/proc/self/fd/{dir_fd}")  # the directory as the kernel resolved it
        if not _inside(opened, root):
            raise LabError(f"{path!s:.200}: its directory resolves to {opened!s:.200}, outside the run's directory "
                           f"{root!s:.200}; nothing was written")
        try:
            standing = os.stat(path.name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            standing = None
        if standing is not None:
            # Only what a run's directory could hold by mistake or by a plant is removed: an old output, a
            # link, a FIFO. A device, a socket or a directory is no output of ours: removing /dev/null because
            # a caller named it would break every process on the machine.
            if not (stat.S_ISREG(standing.st_mode) or stat.S_ISLNK(standing.st_mode)
                    or stat.S_ISFIFO(standing.st_mode)):
                raise LabError(f"{path}: not a file vnetbench writes a process's output to (a directory, device "
                               "or socket stands there); nothing was removed or written. If it is in a run's "
                               "work directory, remove it; otherwise this is a bug in vnetbench, please report it")
            os.unlink(path.name, dir_fd=dir_fd)  # the entry, not what a link there points to
        try:
            fd = os.open(path.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=dir_fd)
        except FileExistsError:  # made between the unlink and the open: not by this run, which writes it once
            raise LabError(f"{path}: something else created this file in the run's work directory as vnetbench "
                           "was about to; nothing was written to it") from None
    finally:
        os.close(dir_fd)
    return os.fdopen(fd, "wb")
