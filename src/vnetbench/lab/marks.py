"""What vnetbench made on this machine, marked so that `vnetbench clean` removes that and nothing else.

A name is not a mark: a user's `vnb-nightly.service` cgroup or a `vnb-*` namespace someone else named (even
the host's own) matches ``vnb-*`` too. Every namespace and cgroup a run makes gets a file here, named like
it, the moment it exists, holding the making process's id; the file goes when the thing goes. `clean` removes
only what has a mark, and reports the rest as not its own.

The marks live in ``/run/vnetbench/made`` (a tmpfs: emptied at boot, as namespaces are), in directories
made by root with mode 0700 and checked to be root's, not links and not open to others, so that no other user
can plant or remove a mark.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from vnetbench.errors import EnvironmentProblem

MARKS_DIR = Path("/run/vnetbench/made")
KINDS = ("netns", "cgroup")


def _checked_dir(path: Path) -> Path:
    """`path` as a directory of root's (or this user's) with no access for others; made so when missing."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    problem = None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        problem = "is not a directory (a link or a file stands there)"
    elif st.st_uid != os.geteuid():
        problem = f"belongs to uid {st.st_uid}, not to uid {os.geteuid()}"
    elif st.st_mode & 0o022:
        problem = f"can be written by others (mode {stat.S_IMODE(st.st_mode):o})"
    if problem:
        raise EnvironmentProblem(f"{path} {problem}: vnetbench keeps there what it made, for `vnetbench clean`; "
                                 f"remove it (rm -rf {path}) and run again")
    return path


def _dir(kind: str) -> Path:
    assert kind in KINDS, kind
    _checked_dir(MARKS_DIR.parent)
    _checked_dir(MARKS_DIR)
    return _checked_dir(MARKS_DIR / kind)


def _file(kind: str, name: str) -> Path:
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"{name!r} cannot be marked: not a plain name")
    return _dir(kind) / name


def mark(kind: str, name: str) -> None:
    """Say that this process made `name` (a namespace or a cgroup of that name)."""
    fd = os.open(_file(kind, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, f"{os.getpid()}\n".encode())
    finally:
        os.close(fd)


def unmark(kind: str, name: str) -> None:
    try:
        os.unlink(_file(kind, name))
    except FileNotFoundError:
        pass


def is_marked(kind: str, name: str) -> bool:
    try:
        return stat.S_ISREG(os.lstat(_file(kind, name)).st_mode)
    except FileNotFoundError:
        return False


def marked(kind: str) -> list[str]:
    """Every name with a mark of this kind (whether or not the thing still exists)."""
    try:
        return sorted(p.name for p in _dir(kind).iterdir() if p.is_file() and not p.is_symlink())
    except FileNotFoundError:
        return []
