"""Quantities as typed fields of scenario models: a rate, a size or a duration is written with its unit
("100Mbit", "500kB", "20s") and arrives in base units (bit/s, bytes, seconds). Shared by the scenario's
own models and every workload's options (:mod:`vnetbench.workloads`)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator

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


Rate = Annotated[float, BeforeValidator(rate)]
Size = Annotated[float, BeforeValidator(size)]
Duration = Annotated[float, BeforeValidator(duration)]
