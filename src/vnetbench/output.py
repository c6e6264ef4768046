"""Writing the files users ask for (reports, exports, JUnit, CSV) without ever losing the database.

Every command that writes a file goes through :func:`output_file`:

- a target that is a SQLite database or one of its journals (``-wal``, ``-journal``, ``-shm``: a killed run's
  committed trials may live only in its write-ahead log), or the ``--db`` in use, is refused before anything
  is written (``report -o vnetbench.db`` once replaced the results with HTML);
- the file is written to a temporary file in the target's directory and renamed over the target only when
  complete, so an error leaves the old file (or none) and no half-written one, and no temporary file either.
  The rename replaces the directory entry: a link standing at the name (planted, or old) is replaced, never
  written through, and a dangling one makes nothing where it points;
- a target that is not a regular file, or a link to one, is refused: a FIFO (opening it for writing blocks
  until someone reads, and feeds whoever does), a device (a link to ``/dev/sda`` would be written to the
  disk), a directory or a socket. Only ``/dev/stdout`` and ``/dev/stderr``, named as such, are written in
  place: they are this process's own output;
- what goes wrong is one line that names the path and what to do: a directory, a missing or read-only place,
  no permission, a full disk.

A closed pipe on standard output (``export | head``) is the CLI's to handle
(:func:`vnetbench.cli.main`); this module is about named files.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator

from vnetbench.errors import VnetbenchError

SQLITE_MAGIC = b"SQLite format 3\x00"


class OutputError(VnetbenchError):
    """An output file that cannot or must not be written."""


def is_sqlite_file(path: Path) -> bool:
    """Whether `path` is a regular file that begins as SQLite's do (opened without blocking: a FIFO there is
    no database, and must not hang the check)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.read(fd, len(SQLITE_MAGIC)) == SQLITE_MAGIC
    except OSError:
        return False
    finally:
        os.close(fd)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


JOURNALS = ("-wal", "-journal", "-shm")
STREAMS = ("/dev/stdout", "/dev/stderr")  # written in place: this process's own output, whatever it is


def _journal_of(path: Path) -> Path | None:
    """The database whose journal `path` would be (``x.db-wal`` -> ``x.db``), or None."""
    for suffix in JOURNALS:
        if path.name.endswith(suffix) and len(path.name) > len(suffix):
            return path.with_name(path.name[:-len(suffix)])
    return None


def _kind(mode: int) -> str | None:
    """What a file that is not an output file is, for a message; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def check_target(path: str | Path, db: str | Path | None = None, what: str = "output") -> Path:
    """Refuse a target that would destroy results or reach anything but a file, before any work is done: the
    database in use (also when it does not exist yet: it is about to) or its journals, any other SQLite file
    or journal, a directory, a FIFO, a device or a socket, and a link to any of them."""
    target = Path(path)
    if str(target) in STREAMS:
        return target
    journal_of = _journal_of(target)
    if db is not None:
        database = Path(db)
        for same in (target, journal_of):
            if same is not None and (_same_file(same, database) or same.resolve() == database.resolve()):
                which = "the results database" if same is target else "a journal of the results database"
                raise OutputError(f"{what} {target} is {which} (--db {db}): writing there would lose stored "
                                  f"runs; choose another file name, e.g. report.html")
    try:
        standing = os.lstat(target)
    except FileNotFoundError:
        return target
    except OSError as e:
        raise _explain(e, target, what) from None
    if stat.S_ISLNK(standing.st_mode):
        try:
            pointed = os.stat(target)
        except OSError:  # dangling (or a loop): the rename replaces the link, nothing is made where it points
            return target
        kind = _kind(pointed.st_mode)
        if kind is not None:
            raise OutputError(f"{what} {target} is a link to {kind} ({os.path.realpath(target)}): vnetbench "
                              "writes files and never writes through a link to anything else (someone may have "
                              "planted it); remove the link, or choose another file name")
    else:
        kind = _kind(standing.st_mode)
        if kind == "a directory":
            raise OutputError(f"{what} {target} is a directory: give a file name inside it, e.g. "
                              f"{target / 'report.html'}")
        if kind is not None:
            raise OutputError(f"{what} {target} is {kind}: vnetbench writes its output to files only (opening "
                              f"{kind} can block, or write to hardware); remove it, or choose another file name")
    if is_sqlite_file(target) or journal_of is not None and is_sqlite_file(journal_of):
        raise OutputError(f"{what} {target} is a SQLite database or its journal (results?): vnetbench does not "
                          "overwrite databases; choose another file name, or remove it yourself if it is not "
                          "needed")
    return target


def _explain(e: OSError, target: Path, what: str) -> OutputError:
    reasons = {
        errno.ENOSPC: "the disk is full: free space or choose another place",
        errno.EDQUOT: "the disk quota is exhausted: free space or choose another place",
        errno.EROFS: "the file system is read-only: choose a writable place",
        errno.EACCES: "permission denied: choose a place you may write to",
        errno.EPERM: "permission denied: choose a place you may write to",
        errno.EISDIR: "it is a directory: give a file name inside it",
        errno.ENOTDIR: "a part of the path is not a directory",
        errno.ENAMETOOLONG: "the path is too long",
    }
    why = reasons.get(e.errno, e.strerror or str(e))
    return OutputError(f"cannot write {what} {target}: {why}")


@contextmanager
def output_file(path: str | Path, db: str | Path | None = None, *, what: str = "output",
                binary: bool = False, newline: str | None = None) -> Iterator[IO]:
    """Open ``path`` for writing, safely (see the module docstring); the file is in place when the
    ``with`` block ends without an exception, and untouched when it raises."""
    target = check_target(path, db, what)
    mode = "wb" if binary else "w"
    encoding = None if binary else "utf-8"
    if str(target) in STREAMS:
        try:
            with open(target, mode, encoding=encoding, newline=newline) as f:
                yield f
        except OSError as e:
            raise _explain(e, target, what) from None
        return
    try:
        existing = os.lstat(target)  # a regular file keeps its permissions; a link is replaced by a new file
    except OSError:
        existing = None
    if existing is not None and not stat.S_ISREG(existing.st_mode):
        existing = None
    parent = target.parent if str(target.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as e:
        raise _explain(e, target, what) from None
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, mode, encoding=encoding, newline=newline) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        if existing is not None:
            os.chmod(tmp, stat.S_IMODE(existing.st_mode))
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise _explain(e, target, what) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(path: str | Path, text: str, db: str | Path | None = None, *, what: str = "output") -> Path:
    with output_file(path, db, what=what) as f:
        f.write(text)
    return Path(path)


def write_bytes(path: str | Path, data: bytes, db: str | Path | None = None, *, what: str = "output") -> Path:
    with output_file(path, db, what=what, binary=True) as f:
        f.write(data)
    return Path(path)
