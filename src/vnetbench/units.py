"""Units users write in scenario files: rates, sizes and durations.

Conventions follow tc(8) and iperf3, which is what our users already type:
rates are in bits per second with decimal prefixes (``100Mbit``, ``1.25Gbit``,
``500kbit``; ``bps`` means *bytes* per second as in tc), sizes are in bytes with
decimal prefixes (``kB`` = 1000 B, ``KiB`` = 1024 B), durations carry a unit
(``20s``, ``300us``, ``1.5ms``, ``2min``).

Every parser raises :class:`UnitError` with the text it could not read and what
it expected, so the scenario layer can name the file and key around it.
"""

from __future__ import annotations

import datetime as _dt
import math
import re

_NUMBER = r"(?P<num>[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?|\.[0-9]+)"
_RE = re.compile(r"^\s*" + _NUMBER + r"\s*(?P<unit>[A-Za-z]*)\s*$")

_DECIMAL = {"": 1.0, "k": 1e3, "K": 1e3, "m": 1e6, "M": 1e6, "g": 1e9, "G": 1e9, "t": 1e12, "T": 1e12}
_BINARY = {"ki": 1024.0, "Ki": 1024.0, "mi": 1024.0**2, "Mi": 1024.0**2, "gi": 1024.0**3, "Gi": 1024.0**3}

RATE_UNITS = "bit, kbit, Mbit, Gbit, Tbit (bits/s) or bps, kbps, Mbps, Gbps (bytes/s, as in tc)"
SIZE_UNITS = "B, kB, MB, GB (x1000) or KiB, MiB, GiB (x1024)"
DURATION_UNITS = "ns, us, ms, s, min, h"


class UnitError(ValueError):
    """A value that is not a valid quantity; the message says what is expected."""


def _split(text: str | int | float, what: str, units: str) -> tuple[float, str]:
    if isinstance(text, bool):
        raise UnitError(f"{brief(text)} is not a {what}; expected a number with a unit ({units})")
    if isinstance(text, (int, float)):
        return _finite(text, text, what), ""
    m = _RE.match(str(text))
    if not m:
        raise UnitError(f"{brief(text)} is not a {what}; expected a number with a unit ({units})")
    return _finite(float(m.group("num")), text, what), m.group("unit")


def brief(text: object) -> str:
    """A value for a message: whole when short, else its start and length (a 5,000-digit number is not
    worth 5,000 characters of error)."""
    shown = repr(text)
    return shown if len(shown) <= 60 else f"{shown[:40]}... ({len(shown)} characters)"


def _finite(value: float | int, text: object, what: str) -> float:
    """`value` as a float, if it is a finite one: NaN, infinity and numbers beyond a float's range are
    not quantities (NaN would pass every range check: nan <= 0 is false)."""
    try:
        out = float(value)
    except OverflowError:
        out = math.inf
    if not math.isfinite(out):
        raise UnitError(f"{brief(text)} is not a finite {what}: give a number a float can hold (at most "
                        "about 1.8e308, and not inf or nan)")
    return out


def _prefix_factor(prefix: str) -> float | None:
    if prefix in _BINARY:
        return _BINARY[prefix]
    if prefix in _DECIMAL:
        return _DECIMAL[prefix]
    return None


def parse_rate(text: str | int | float) -> float:
    """Rate in bits per second. A bare number is bits per second."""
    value, unit = _split(text, "rate", RATE_UNITS)
    if unit == "":
        return value
    for suffix, per_bit in (("bit", 1.0), ("bps", 8.0)):
        if unit.endswith(suffix) or unit.lower().endswith(suffix):
            prefix = unit[: -len(suffix)]
            factor = _prefix_factor(prefix)
            if factor is not None:
                return _finite(value * factor * per_bit, text, "rate")
    raise UnitError(f"{brief(text)} has an unknown rate unit {brief(unit)}; expected {RATE_UNITS}")


def parse_size(text: str | int | float) -> float:
    """Size in bytes. A bare number is bytes."""
    value, unit = _split(text, "size", SIZE_UNITS)
    if unit in ("", "B"):
        return value
    if unit.endswith("B"):
        factor = _prefix_factor(unit[:-1])
        if factor is not None:
            return _finite(value * factor, text, "size")
    raise UnitError(f"{brief(text)} has an unknown size unit {brief(unit)}; expected {SIZE_UNITS}")


_DURATION = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0, "min": 60.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str | int | float) -> float:
    """Duration in seconds. A bare number is seconds."""
    value, unit = _split(text, "duration", DURATION_UNITS)
    if unit == "":
        return value
    if unit in _DURATION:
        return _finite(value * _DURATION[unit], text, "duration")
    raise UnitError(f"{brief(text)} has an unknown duration unit {brief(unit)}; expected {DURATION_UNITS}")


def parse_buffer(text: str | int | float) -> dict[str, float]:
    """A queue limit: ``{"bytes": n}`` for a size ("500kB"), ``{"seconds": t}`` for a time at the link's
    rate ("40ms")."""
    try:
        return {"bytes": parse_size(text)}
    except UnitError:
        pass
    try:
        return {"seconds": parse_duration(text)}
    except UnitError:
        raise UnitError(f"{brief(text)} is neither a size ({SIZE_UNITS}) nor a time at the link rate "
                        f"({DURATION_UNITS})") from None


def format_rate(bits_per_second: float) -> str:
    """Shortest exact-looking rendering, e.g. 100000000 -> '100Mbit'."""
    for factor, name in ((1e12, "Tbit"), (1e9, "Gbit"), (1e6, "Mbit"), (1e3, "kbit")):
        if bits_per_second >= factor:
            return f"{bits_per_second / factor:g}{name}"
    return f"{bits_per_second:g}bit"


def format_size(size_bytes: float) -> str:
    for factor, name in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if size_bytes >= factor:
            return f"{size_bytes / factor:g}{name}"
    return f"{size_bytes:g}B"


def format_binary_size(size_bytes: float) -> str:
    """Memory as people size it: "600MiB", "1GiB" (powers of 1024, as `memory = "1GiB"` is written)."""
    for factor, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if size_bytes >= factor:
            return f"{size_bytes / factor:.4g}{name}"
    return f"{size_bytes:g}B"


def format_duration(seconds: float) -> str:
    for factor, name in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us")):
        if seconds >= factor:
            return f"{seconds / factor:g}{name}"
    return f"{seconds / 1e-9:g}ns"


def parse_percent(text: str) -> float:
    """'5%' -> 0.05, '0.05' -> 0.05, '1.5' -> 1.5: a number, or a percentage of one. Raises UnitError; each
    caller checks the range its quantity allows (a probability, a CPU quota, a noise level)."""
    raw = str(text).strip()
    try:
        value = float(raw[:-1]) / 100.0 if raw.endswith("%") else float(raw)
    except ValueError:
        raise UnitError(f"{brief(text)} is not a number or a percentage") from None
    return _finite(value, text, "number")


# ------------------------------------------------------------- written forms

# What a scenario file may write for each quantity, as JSON Schema patterns (`vnetbench schema`: an editor marks
# "100 Mbti" while it is typed). Built from the parsers' own tables and number syntax; tests/unit/test_schema.py
# checks that a pattern matches exactly the texts its parser reads (ECMA-262 and Python agree on this syntax).
_NUMBER_PATTERN = _NUMBER.replace("(?P<num>", "(?:")
_UNIT_CHARS = re.compile(r"[A-Za-z]*")  # what _RE reads as a unit: a unit outside it is never reached


def _either(words: list[str]) -> str:
    return "(?:" + "|".join(sorted(words, key=lambda w: (-len(w), w))) + ")"


def _any_case(word: str) -> str:
    """The word in any letter case, "_" also written "-" (the loaders lower a name and replace "-")."""
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else "[-_]" if c == "_" else re.escape(c)
                   for c in word)


def _quantity_pattern(unit: str) -> str:
    return r"^\s*" + _NUMBER_PATTERN + r"\s*" + unit + r"\s*$"


_PREFIXES = _either([p for p in {**_DECIMAL, **_BINARY} if p])
#: A rate: a number of bits/s, or with a unit (the prefixes as written, the suffix in any case, as parse_rate).
RATE_PATTERN = _quantity_pattern(f"(?:{_PREFIXES}?(?:{_any_case('bit')}|{_any_case('bps')}))?")
#: A size: bytes, or with a unit ending in B.
SIZE_PATTERN = _quantity_pattern(f"(?:{_PREFIXES}?B)?")
#: A duration: seconds, or with a unit.
DURATION_PATTERN = _quantity_pattern(_either([u for u in _DURATION if _UNIT_CHARS.fullmatch(u)]) + "?")
#: A number or a percentage of one ("5%", "0.05"), as parse_percent reads it (Python's float() also reads
#: "1_000", "inf" and "nan": the first is no way to write a fraction, the others are refused by every range).
PERCENT_PATTERN = r"^\s*[+-]?" + _NUMBER_PATTERN + r"\s*%?\s*$"


def any_case(*words: str) -> str:
    """A pattern of these words in any letter case ("_" or "-"), with spaces around (the loaders strip and lower
    them)."""
    return r"^\s*" + _either([_any_case(w) for w in words]) + r"\s*$"


def utc_text(ts: float | None, missing: str = "-", seconds: bool = True) -> str:
    """A time for people, in UTC everywhere (the terminal, the HTML report and the JSON agree):
    '2026-11-25 02:11:05 UTC'."""
    if ts is None or ts == 0:
        return missing
    return _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).strftime(
        "%Y-%m-%d %H:%M:%S UTC" if seconds else "%Y-%m-%d %H:%M UTC")


def utc_iso(ts: float | None) -> str | None:
    """A time for programs (JSON): ISO 8601 in UTC, to the second."""
    if ts is None:
        return None
    return _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).isoformat(timespec="seconds")
