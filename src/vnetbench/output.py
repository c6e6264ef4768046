"""Writing the files users ask for (reports, exports, JUnit, CSV) without ever losing the database.

Every command that writes a file goes through :func:`output_file`:

- a target that is a SQLite database, or the ``--db`` in use, is refused before
  anything is written (``report -o vnetbench.db`` once replaced the results with HTML);
- a regular file is written to a temporary file in the target's directory and
  renamed over the target only when complete, so an error leaves the old file
  (or none) and no half-written one, and no temporary file either;
- a target that is not a regular file (``/dev/stdout``, a FIFO, ``/dev/full``)
  is written in place: it cannot be renamed over, and nothing is lost by it;
- what goes wrong is one line that names the path and what to do: a directory,
  a missing or read-only place, no permission, a full disk.

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
    try:
        with open(path, "rb") as f:
            return f.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC
    except OSError:
        return False


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def check_target(path: str | Path, db: str | Path | None = None, what: str = "output") -> Path:
    """Refuse a target that would destroy results, before any work is done: the database in use
    (also when it does not exist yet: it is about to), any other SQLite file, a directory."""
    target = Path(path)
    if db is not None:
        database = Path(db)
        if _same_file(target, database) or target.resolve() == database.resolve():
            raise OutputError(f"{what} {target} is the results database (--db {db}): writing there would "
                              f"replace every stored run; choose another file name, e.g. report.html")
    if target.is_dir():
        raise OutputError(f"{what} {target} is a directory: give a file name inside it, e.g. {target / 'report.html'}")
    if target.is_file() and is_sqlite_file(target):
        raise OutputError(f"{what} {target} is a SQLite database (results?): vnetbench does not overwrite "
                          "databases; choose another file name, or remove it yourself if it is not needed")
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
    try:
        existing = os.stat(target)
    except FileNotFoundError:
        existing = None
    except OSError as e:
        raise _explain(e, target, what) from None
    if existing is not None and not stat.S_ISREG(existing.st_mode):
        # A device or FIFO: written in place (renaming over /dev/stdout would be wrong).
        try:
            with open(target, mode, encoding=encoding, newline=newline) as f:
                yield f
        except OSError as e:
            raise _explain(e, target, what) from None
        return
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
