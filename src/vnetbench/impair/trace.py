"""Mahimahi rate traces (``schedule = "trace:FILE"``): read once, within bounds, quoting nothing of them.

A scenario names its trace by path, and vnetbench reads it as root (vnetbench.userfiles: a regular file
outside /proc, /sys and /dev, of at most limits.TRACE_BYTES, read within bounds). Messages name the file and
a line number, never what the file holds: a secret named as a trace stays secret.

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
import warnings
from dataclasses import dataclass
from pathlib import Path

from vnetbench import limits
from vnetbench.userfiles import Kind, identity, open_checked, read_bounded

OPPORTUNITY_BYTES = 1500
MAX_BYTES = limits.TRACE_BYTES.value
TRACE = Kind("trace file", "give a Mahimahi trace file", limits.TRACE_BYTES,
             too_big="millions of delivery opportunities: shorten it")
# A timestamp of 13 digits is 31 years: no trace's, and beyond it numbers would lose precision as floats.
MAX_TIMESTAMP_MS = 10**12 - 1
_KEPT = 16  # traces kept parsed (a scenario names a few)


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
    fd, info, shown = open_checked(path, TRACE)
    try:
        key = (os.path.realpath(path), identity(info))
        if key in _parsed and not keep_bytes:
            return _parsed[key], None
        data = read_bounded(fd, shown, TRACE)
    finally:
        os.close(fd)
    trace = parse(data, shown, key[1])
    if len(_parsed) >= _KEPT:
        _parsed.pop(next(iter(_parsed)))
    _parsed[key] = trace
    return trace, data if keep_bytes else None
