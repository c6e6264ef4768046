"""Mahimahi rate traces (``schedule = "trace:FILE"``): read once, within bounds, quoting nothing of them.

A scenario names its trace by path, and vnetbench reads it as root: so the path is the scenario's, but what
is read must be a trace and nothing else. A path under /proc, /sys or /dev, anything but a regular file,
an empty file (the kernel's files, /proc/kmsg among them, are regular and say they are empty) or one larger
than limits.TRACE_BYTES is refused before a byte is read. The file is opened without blocking (a FIFO
planted after the check cannot hang the run), checked again as opened, and read with a bound on its size and
its time. Messages name the file and a line number, never what the file holds: a secret named as a trace
stays secret.

A trace is parsed once per run, whatever the number of configurations that name it: the result is kept by
the file's identity (device, inode, size, modification and change times), so a rewritten file is read
again. The emulator is given a copy vnetbench wrote in the run's directory of the bytes it checked
(impair/userspace.py), never the path itself.

Format: one line per 1500-byte delivery opportunity, the line holding its millisecond timestamp; timestamps
do not decrease, and the trace loops with a period of its last timestamp.
"""

from __future__ import annotations

import itertools
import os
import re
import stat
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from vnetbench import limits, units

OPPORTUNITY_BYTES = 1500
MAX_BYTES = limits.TRACE_BYTES.value
# A timestamp of 13 digits is 31 years: no trace's, and beyond it numbers would lose precision as floats.
MAX_TIMESTAMP_MS = 10**12 - 1
# Kernel and device files: never a trace, and reading some of them blocks or has effects.
NOT_TRACES = ("/proc", "/sys", "/dev")
_KEPT = 16  # traces kept parsed (a scenario names a few)
# A 64 MiB trace reads from a local disk in well under a second, and a cold one in a few.
READ_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class MahimahiTrace:
    opportunities: int
    period_ms: int
    identity: tuple[int, ...]  # of the file as read: (device, inode, size, mtime ns, ctime ns)

    @property
    def mean_rate(self) -> float:
        """Average rate of the looping trace, bit/s."""
        return self.opportunities * OPPORTUNITY_BYTES * 8 / (self.period_ms / 1000.0)


_parsed: dict[tuple[str, tuple[int, ...]], MahimahiTrace] = {}


def _under(path: str, roots: tuple[str, ...]) -> str | None:
    return next((r for r in roots if path == r or path.startswith(r + "/")), None)


def _open(path: str | Path) -> tuple[int, os.stat_result, str]:
    """(descriptor, its stat, the path for messages) of a file that may be a trace; ValueError otherwise."""
    shown = units.brief(str(path))
    root = _under(os.path.realpath(path), NOT_TRACES)
    if root is not None:
        raise ValueError(f"trace file {shown} is under {root}, a kernel or device file: give a Mahimahi trace file")
    try:
        # O_NONBLOCK: a FIFO put at the path after the check above opens without waiting for a writer
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        raise ValueError(f"trace file {shown} cannot be read: {e.strerror or e}") from None
    try:
        info = os.fstat(fd)
        opened = os.readlink(f"/proc/self/fd/{fd}")  # as the kernel resolved it: no link swapped in meanwhile
        root = _under(opened, NOT_TRACES)
        if not stat.S_ISREG(info.st_mode) or root is not None:
            raise ValueError(f"trace file {shown} is not a regular file (a device, pipe, directory or kernel file): "
                             "give a Mahimahi trace file")
        if info.st_size == 0:
            raise ValueError(f"trace file {shown} is empty: it needs at least one timestamp")
        if info.st_size > MAX_BYTES:
            raise ValueError(f"trace file {shown} has {info.st_size:,} bytes, over {limits.TRACE_BYTES} (millions "
                             "of delivery opportunities): shorten it")
    except BaseException:
        os.close(fd)
        raise
    return fd, info, shown


def _identity(info: os.stat_result) -> tuple[int, ...]:
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns


def _read(fd: int, shown: str) -> bytes:
    """The whole file, and not a byte beyond the limit (a file that grew since it was checked is refused), within
    READ_TIMEOUT_S (a file on a share that has stopped answering, or that trickles, is refused, not waited for)."""
    chunks, size = [], 0
    deadline = time.monotonic() + READ_TIMEOUT_S
    while size <= MAX_BYTES:
        if time.monotonic() > deadline:
            raise ValueError(f"trace file {shown} could not be read within {READ_TIMEOUT_S:g} s ({size:,} bytes "
                             "read): copy it to a local disk")
        chunk = os.read(fd, min(1 << 20, MAX_BYTES + 1 - size))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
    raise ValueError(f"trace file {shown} grew beyond {limits.TRACE_BYTES} while it was read: shorten it")


_DIGITS = b"0123456789"
_DIGIT_MASK = bytes(1 if chr(i).isdigit() and i < 128 else 0 for i in range(256))  # digit -> 1, else 0
_ODD_LINE = re.compile(rb"[^\n]*[^0-9\n][^\n]*")


def parse(data: bytes, shown: str, identity: tuple[int, ...] = ()) -> MahimahiTrace:
    """Check and count a trace's bytes. With bytes methods and numpy, not a loop per line: a 60 MiB trace of 9
    million lines takes about a second."""
    import numpy as np

    text = data.replace(b"\r\n", b"\n")

    def line_of(offset: int) -> int:
        return text.count(b"\n", 0, offset) + 1

    def line_of_number(index: int) -> int:  # only on the way to an error
        found = next(itertools.islice(re.finditer(rb"[0-9]+", text), index, None))
        return line_of(found.start())

    if text.translate(None, _DIGITS + b"\n"):  # more than digits and line breaks: blanks around them, or worse
        for odd in _ODD_LINE.finditer(text):
            line = odd.group().strip(b" \t")
            if line and not line.isdigit():
                raise ValueError(f"trace file {shown} line {line_of(odd.start())} is not one whole number of "
                                 "milliseconds (Mahimahi format: one timestamp per line)")
    mask = text.translate(_DIGIT_MASK)
    count = mask.count(b"\x00\x01") + mask.startswith(b"\x01")  # where a number begins
    if count == 0:
        raise ValueError(f"trace file {shown} is empty: it needs at least one timestamp")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy warns, rather than fails, on text it cannot read to its end
        stamps = np.fromstring(text, dtype=np.int64, sep=" ")
    if len(stamps) != count:
        raise ValueError(f"trace file {shown} cannot be read as one timestamp per line")
    # (a number of 19 digits or more reads as the largest int64: caught here too)
    beyond = np.flatnonzero(stamps > MAX_TIMESTAMP_MS)
    if len(beyond):
        raise ValueError(f"trace file {shown} line {line_of_number(int(beyond[0]))}: a timestamp of more than "
                         f"{len(str(MAX_TIMESTAMP_MS))} digits (over 31 years of milliseconds)")
    back = np.flatnonzero(np.diff(stamps) < 0)
    if len(back):
        raise ValueError(f"trace file {shown} line {line_of_number(int(back[0]) + 1)} goes back in time: "
                         "timestamps must not decrease")
    if stamps[-1] <= 0:
        raise ValueError(f"trace file {shown} ends at 0 ms: its last timestamp is its period and must be positive")
    return MahimahiTrace(len(stamps), int(stamps[-1]), identity)


def read_mahimahi(path: str | Path) -> MahimahiTrace:
    """The trace at `path`, checked (ValueError names the file and the line); parsed once while the file
    stays the same."""
    return _load(path, keep_bytes=False)[0]


def trace_bytes(path: str | Path) -> tuple[MahimahiTrace, bytes]:
    """The trace at `path` and the bytes it was checked from, read now (for the emulator's copy)."""
    return _load(path, keep_bytes=True)  # type: ignore[return-value]


def _load(path: str | Path, keep_bytes: bool) -> tuple[MahimahiTrace, bytes | None]:
    fd, info, shown = _open(path)
    try:
        key = (os.path.realpath(path), _identity(info))
        if key in _parsed and not keep_bytes:
            return _parsed[key], None
        data = _read(fd, shown)
    finally:
        os.close(fd)
    trace = parse(data, shown, key[1])
    if len(_parsed) >= _KEPT:
        _parsed.pop(next(iter(_parsed)))
    _parsed[key] = trace
    return trace, data if keep_bytes else None
