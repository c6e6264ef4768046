"""Quantities as typed fields of scenario models: a rate, a size or a duration is written with its unit
("100Mbit", "500kB", "20s") and arrives in base units (bit/s, bytes, seconds). Shared by the scenario's
own models and every workload's options (:mod:`vnetbench.workloads`)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator

from vnetbench import units


def rate(v: Any) -> float:
    value = units.parse_rate(v)
    if value <= 0:
        raise ValueError(f"{v!r}: a rate must be positive")
    return value


def size(v: Any) -> float:
    value = units.parse_size(v)
    if value <= 0:
        raise ValueError(f"{v!r}: a size must be positive")
    return value


def duration(v: Any) -> float:
    value = units.parse_duration(v)
    if value < 0:
        raise ValueError(f"{v!r}: a duration cannot be negative")
    return value


def at_least_one_second(v: float) -> float:
    if v < 1:
        raise ValueError(f"{v:g}s: give at least 1s")
    return v


def whole_seconds(v: float) -> float:
    if v < 1 or v != int(v):
        raise ValueError(f"{v:g}s: the tool runs whole seconds; give 1s or more, whole")
    return v


Rate = Annotated[float, BeforeValidator(rate)]
Size = Annotated[float, BeforeValidator(size)]
Duration = Annotated[float, BeforeValidator(duration)]
#: A tool's run time of at least a second (ping's deadline, irtt's duration).
Seconds = Annotated[float, BeforeValidator(duration), AfterValidator(at_least_one_second)]
#: A tool's run time where the tool takes whole seconds (sockperf -t, wrk -d, sysbench --time).
WholeSeconds = Annotated[float, BeforeValidator(duration), AfterValidator(whole_seconds)]
