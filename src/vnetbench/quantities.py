"""Quantities as typed fields of scenario models: a rate, a size or a duration is written with its unit
("100Mbit", "500kB", "20s") and arrives in base units (bit/s, bytes, seconds). Shared by the scenario's
own models and every workload's options (:mod:`vnetbench.workloads`).

Each parser declares what a file may write in its place (``json_schema_input_type``): the JSON Schema of a
scenario file (`vnetbench schema`) describes the file as written, not the numbers it is parsed into."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, StringConstraints

from vnetbench import units


def rate(v: Any) -> float:
    value = units.parse_rate(v)
    if value <= 0:
        raise ValueError(f"{units.brief(v)}: a rate must be positive")
    return value


def size(v: Any) -> float:
    value = units.parse_size(v)
    if value <= 0:
        raise ValueError(f"{units.brief(v)}: a size must be positive")
    return value


def duration(v: Any) -> float:
    value = units.parse_duration(v)
    if value < 0:
        raise ValueError(f"{units.brief(v)}: a duration cannot be negative")
    return value


def at_least_one_second(v: float) -> float:
    if v < 1:
        raise ValueError(f"{v:g}s: give at least 1s")
    return v


def whole_seconds(v: float) -> float:
    if v < 1 or v != int(v):
        raise ValueError(f"{v:g}s: the tool runs whole seconds; give 1s or more, whole")
    return v


# What a file writes: a number in base units, or text with a unit (JSON Schema patterns from vnetbench.units).
RateText = Annotated[str, StringConstraints(pattern=units.RATE_PATTERN)]
SizeText = Annotated[str, StringConstraints(pattern=units.SIZE_PATTERN)]
DurationText = Annotated[str, StringConstraints(pattern=units.DURATION_PATTERN)]
PercentText = Annotated[str, StringConstraints(pattern=units.PERCENT_PATTERN)]
UnlimitedText = Annotated[str, StringConstraints(pattern=units.any_case("unlimited", "none"))]
WrittenRate = float | RateText
WrittenSize = float | SizeText
WrittenDuration = float | DurationText
WrittenFraction = float | PercentText

Rate = Annotated[float, BeforeValidator(rate, json_schema_input_type=WrittenRate)]
Size = Annotated[float, BeforeValidator(size, json_schema_input_type=WrittenSize)]
Duration = Annotated[float, BeforeValidator(duration, json_schema_input_type=WrittenDuration)]
#: A tool's run time of at least a second (ping's deadline, irtt's duration).
Seconds = Annotated[float, BeforeValidator(duration, json_schema_input_type=WrittenDuration),
                    AfterValidator(at_least_one_second)]
#: A tool's run time where the tool takes whole seconds (sockperf -t, wrk -d, sysbench --time).
WholeSeconds = Annotated[float, BeforeValidator(duration, json_schema_input_type=WrittenDuration),
                         AfterValidator(whole_seconds)]


def text_schema(pattern: str) -> dict[str, str]:
    """The JSON Schema of a text form, for models that read one in a model validator (impair/model.py)."""
    return {"type": "string", "pattern": pattern}


def written_also_as(*forms: Any, spelled: dict[str, str] | None = None, keys: dict[str, Any] | None = None):
    """``json_schema_extra`` of a model whose before-validator reads more than its table: other forms (a buffer
    written "500kB", a loss written "1%"), other spellings of a property's values (``spelled``: a pattern per
    property, beside the values it lists: a queue kind "Drop-Tail"), or keys the validator folds into others
    (``keys``: a link's ``both``). The model's JSON Schema becomes one of the table and those forms. A form or
    key given as a callable is made from the table's schema (to reuse one of its properties)."""

    def made(item: Any, table: dict[str, Any]) -> Any:
        return item(table) if callable(item) else item

    def extra(schema: dict[str, Any]) -> None:
        table = {k: v for k, v in schema.items() if k not in ("title", "description")}
        for k in table:
            del schema[k]
        props = table.setdefault("properties", {})
        for name, pattern in (spelled or {}).items():
            meta = {k: props[name].pop(k) for k in ("title", "description", "default") if k in props[name]}
            props[name] = {**meta, "anyOf": [props[name], text_schema(pattern)]}
        for name, item in (keys or {}).items():
            props[name] = made(item, table)
        schema["anyOf"] = [table, *(made(f, table) for f in forms)] if forms else [table]

    return extra
