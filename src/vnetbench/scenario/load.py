"""Reading scenario files: built-in names or paths, ``--set`` overrides, and
validation errors that name the file, the key path, the value and what to write.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from vnetbench import limits, units
from vnetbench.errors import ScenarioError
from vnetbench.impair import capacity
from vnetbench.scenario.model import MEASURED, LabSpec, RepeatSpec, ScaleSpec, Scenario
from vnetbench.workloads import registry

BUILTIN_PACKAGE = "vnetbench.scenario.builtin"
_WORKLOAD_MODELS: dict[str, type[BaseModel]] = registry.options_models()


@dataclass(frozen=True)
class LoadedScenario:
    scenario: Scenario
    source: str  # path or "builtin:NAME"
    text: str  # the file as written, for the record
    overrides: tuple[str, ...]
    # What a [scale] table did: the line rate run and where it came from (stored in the run's fingerprint,
    # shown by `plan`, `show` and the report).
    scale_note: str | None = None

    @property
    def text_hash(self) -> str:
        digest = hashlib.sha256(self.text.encode())
        for item in self.overrides:
            digest.update(b"\0" + item.encode())
        return digest.hexdigest()[:16]


MAX_SCENARIO_BYTES = limits.SCENARIO_BYTES.value


def builtin_names() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files(BUILTIN_PACKAGE).iterdir() if p.name.endswith(".toml"))


def read_source(name_or_path: str) -> tuple[str, str]:
    """(source label, text) for a built-in scenario name or a file path."""
    path = Path(name_or_path)
    shown = name_or_path if len(name_or_path) <= 200 else units.brief(name_or_path)
    try:
        is_file = path.suffix == ".toml" or path.exists() or "/" in name_or_path
        if is_file and not path.is_file():
            raise ScenarioError(f"{shown}: no such scenario file; built-in scenarios are: {', '.join(builtin_names())}")
        text = None
        if is_file:
            with path.open("rb") as f:  # at most one byte beyond the limit: a huge file is not read whole
                text = f.read(MAX_SCENARIO_BYTES + 1)
    except OSError as e:  # a name too long, a directory without permission, ...
        raise ScenarioError(f"{shown}: cannot read the scenario file: {e.strerror or e}") from None
    if text is not None:
        _check_size(len(text), shown)
        try:
            return str(path), text.decode("utf-8")
        except UnicodeDecodeError as e:
            line = text[:e.start].count(b"\n") + 1
            raise ScenarioError(f"{shown}: line {line} is not UTF-8 (byte {text[e.start]:#04x}); TOML files are "
                                "UTF-8: save it as UTF-8") from None
    if name_or_path in builtin_names():
        text = resources.files(BUILTIN_PACKAGE).joinpath(f"{name_or_path}.toml").read_text()
        return f"builtin:{name_or_path}", text
    raise ScenarioError(
        f"{name_or_path!r} is neither a scenario file nor a built-in scenario; "
        f"built-in scenarios are: {', '.join(builtin_names())}"
    )


def workload_order(text: str) -> list[str]:
    """The workloads of a stored scenario's text in the order it declares them (empty where the text does not
    parse): the order `show` and the report give a metric's per-workload forms."""
    try:
        workloads = tomllib.loads(text).get("workload")
    except tomllib.TOMLDecodeError:
        return []
    return list(workloads) if isinstance(workloads, dict) else []


def load(name_or_path: str, overrides: list[str] | tuple[str, ...] = ()) -> LoadedScenario:
    source, text = read_source(name_or_path)
    return load_text(text, source, overrides)


def _check_size(size: int, source: str) -> None:
    if size > MAX_SCENARIO_BYTES:
        raise ScenarioError(f"{source}: larger than {limits.SCENARIO_BYTES} (a scenario is a few kilobytes): this "
                            "is not a scenario file; a long rate trace goes in a trace file (schedule = "
                            "\"trace:FILE\")")


# A key of more than KEY_DEPTH dot-separated parts (`a.b.c`), bare or quoted, with TOML's blanks around the dots.
# Possessive and atomic, and never started inside a word, a string or a chain: one pass over the text.
_KEY_PART = r'(?:[A-Za-z0-9_-]++|"[^"\n]{0,200}+"|\'[^\'\n]{0,200}+\')'
_DEEP_KEY = re.compile(rf'(?<![A-Za-z0-9_\-"\'.])(?>{_KEY_PART}(?:[ \t]*+\.[ \t]*+{_KEY_PART}){{{limits.KEY_DEPTH.value}}})')


def check_bounds(text: str, source: str) -> None:
    """Refuse, before it is parsed, a text whose reading alone would take long: too large, or a key of too
    many parts (tomllib's time grows with the square of a key's depth). `source` names it in the message."""
    _check_size(len(text.encode("utf-8", "replace")), source)
    if text.count(".") < limits.KEY_DEPTH.value:  # no key that deep: no need to look (nearly every file)
        return
    found = _DEEP_KEY.search(text)
    if found is not None:
        line = text.count("\n", 0, found.start()) + 1
        raise ScenarioError(f"{source}: line {line}: a key of more than {limits.KEY_DEPTH.value} dot-separated "
                            f"parts, over {limits.KEY_DEPTH}; a scenario's keys have at most 5 "
                            "(lab.link.bottleneck.forward.rate): shorten it")


def load_text(text: str, source: str, overrides: list[str] | tuple[str, ...] = ()) -> LoadedScenario:
    """Parse and validate scenario text (a file's, or one stored with a run for --resume)."""
    check_bounds(text, source)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ScenarioError(f"{source}: not valid TOML: {e}") from None
    except ValueError as e:  # Python's own limits, e.g. an integer of more than 4,300 digits
        raise ScenarioError(f"{source}: a value is beyond what can be read: {e}".split("; use sys.")[0]) from None
    except RecursionError:
        raise ScenarioError(f"{source}: arrays or tables nested too deep to read") from None
    return load_data(raw, text, source, overrides)


def load_data(raw: dict[str, Any], text: str, source: str,
              overrides: list[str] | tuple[str, ...] = ()) -> LoadedScenario:
    """Validate a scenario already parsed from TOML (`raw`, changed in place); `text` is kept for the record. The
    docs' tests plan their examples this way, each fragment merged into the scenario it belongs to."""
    # The file's rates are scaled to the line rate run here; what --set gives runs as typed. So the [scale]
    # table's own overrides come first, then the scaling (its resolved line rate kept as one more override, so
    # that --resume runs the rates the run started with), then every other override.
    scaling = [item for item in overrides if _is_scale_override(item)]
    for item in scaling:
        apply_override(raw, item, source)
    scale_note, pinned = apply_scale(raw, source)
    if pinned:
        overrides = (*overrides, pinned)
    for item in overrides:
        if item not in scaling and item != pinned:
            apply_override(raw, item, source)
    check_text(raw, source)
    try:
        scenario = validate(raw, source)
    except RecursionError:
        raise ScenarioError(f"{source}: arrays or tables nested too deep: a scenario's values are at most a few "
                            "levels deep") from None
    return LoadedScenario(scenario=scenario, source=source, text=text, overrides=tuple(overrides),
                          scale_note=scale_note)


# Characters no scenario needs and a terminal or a reader acts on: C0 and C1 controls (ESC starts a terminal
# escape sequence that can rewrite the screen, set the window title or hide text) and Unicode's bidirectional
# overrides (text that reads differently than it is, "Trojan Source"). Tab and newline are plain text.
_HOSTILE = {c for c in range(0x20) if c not in (0x09, 0x0A)} | {0x7F} | set(range(0x80, 0xA0)) \
    | set(range(0x202A, 0x202F)) | set(range(0x2066, 0x206A))


def check_text(raw: Any, source: str) -> None:
    """Every key and string of the scenario is plain text: names, descriptions, labels and options reach
    terminals, HTML and log files, never as instructions to them."""
    todo: list[tuple[tuple[str, ...], Any]] = [((), raw)]
    while todo:  # a stack, not recursion: nesting depth is judged (and refused) by validation
        path, value = todo.pop()
        texts: list[tuple[str, str]] = []  # (where, text)
        if isinstance(value, dict):
            texts = [(f"a key of {_shown_key('.'.join(path)) or 'the top level'}", k) for k in value
                     if isinstance(k, str)]
            todo.extend((path + (str(k),), v) for k, v in value.items())
        elif isinstance(value, list):
            todo.extend((path + (str(i),), v) for i, v in enumerate(value))
        elif isinstance(value, str):
            texts = [(_shown_key(".".join(path)), value)]
        for where, text in texts:
            bad = next((ch for ch in text if ord(ch) in _HOSTILE), None)
            if bad is not None:
                raise ScenarioError(f"{source}: {where}: contains the control character U+{ord(bad):04X}; scenario "
                                    "text must be plain (no terminal escape sequences, control or bidirectional "
                                    "override characters): remove it")


def validate(raw: dict[str, Any], source: str) -> Scenario:
    try:
        return Scenario.model_validate(raw)
    except ValidationError as e:
        raise ScenarioError(format_validation_error(e, raw, source)) from None


# ------------------------------------------------------------------- scale

# What a [scale] table scales, by key, wherever it appears in [lab], [workload.*] and [matrix] (an axis of that
# name, or a key of an axis' inline tables): bandwidths, and the sizes that follow the bandwidth-delay product.
# A buffer given as a time ("10ms") is already relative to its rate and stays; schedules and traces stay too.
_SCALED_RATES = frozenset({"bottleneck", "rate", "offered"})  # offered only as a literal rate, not an expression
_SCALED_SIZES = frozenset({"window", "buffer"})  # buffer only in bytes


def _is_scale_override(item: str) -> bool:
    key = item.split("=", 1)[0].strip()
    return key == "scale" or key.startswith("scale.")


class _ScaleOnly(BaseModel):
    """The [scale] table read before the rest of the scenario, with the rest's errors left to validation."""

    model_config = ConfigDict(extra="ignore")
    scale: ScaleSpec | None = None


def apply_scale(raw: dict[str, Any], source: str) -> tuple[str | None, str | None]:
    """Scale the scenario's rates to the line rate of this machine, in place. Returns what was done, for people,
    and the override that pins a line rate found here (``"measured"`` resolved), or None."""
    if "scale" not in raw:
        return None, None
    try:
        spec = _ScaleOnly.model_validate(raw).scale
    except ValidationError as e:
        raise ScenarioError(format_validation_error(e, raw, source)) from None
    if spec is None:
        return None, None
    written = spec.line_rate
    pinned = None
    if spec.to == MEASURED:
        allowed, origin = capacity.line_rate()
        if allowed is not None:
            target = min(written, allowed)
        else:
            target = spec.fallback or written
            origin = f"the scenario's fallback, because {origin}"
        pinned = f"scale.to={units.format_rate(target)}"
        raw["scale"]["to"] = units.format_rate(target)
    else:
        target = units.parse_rate(spec.to)
        origin = "as scale.to sets it"
    if target >= written:
        return f"line rate {units.format_rate(written)}, as the scenario is written: {origin}.", pinned
    factor = target / written
    _scale_tree(raw.get("lab"), factor, None)
    _scale_tree(raw.get("workload"), factor, None)
    for axis, values in _table(raw.get("matrix")).items():
        _scale_tree(values, factor, axis)
    return (f"line rate {units.format_rate(target)}: {origin}. The scenario is written for "
            f"{units.format_rate(written)}: its bandwidths, byte buffers and socket windows are scaled by "
            f"{factor:.4g}.", pinned)


def _scale_tree(node: Any, factor: float, key: str | None) -> Any:
    """Scale, in place, every value under a scaled key in this part of the raw scenario; returns the node."""
    if isinstance(node, dict):
        for k, v in node.items():
            node[k] = _scale_tree(v, factor, k)
        return node
    if isinstance(node, list):
        for i, v in enumerate(node):
            node[i] = _scale_tree(v, factor, key)
        return node
    if key in _SCALED_RATES:
        return _scaled(node, factor, units.parse_rate, units.format_rate)
    if key in _SCALED_SIZES:
        if key == "buffer":
            try:
                if "bytes" not in units.parse_buffer(node):
                    return node
            except units.UnitError:
                return node
        return _scaled(node, factor, units.parse_size, units.format_size)
    return node


def _scaled(value: Any, factor: float, parse: Any, fmt: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return value
    try:
        base = parse(value)
    except units.UnitError:
        return value  # 'unlimited', an expression: not a quantity to scale (validation judges the rest)
    scaled = float(f"{base * factor:.6g}")  # 1.25Gbit x 0.24 is 300Mbit, not 299.99999999999994Mbit
    return scaled if isinstance(value, (int, float)) else fmt(scaled)


# ---------------------------------------------------------------- overrides


def _parse_value(text: str) -> Any:
    """A --set value: TOML when it reads as TOML (numbers, lists, booleans), else the
    plain string; a bracketed list may leave its strings unquoted (``[udp,tcp]``)."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        pass
    except ValueError as e:  # Python's own limits, e.g. an integer of more than 4,300 digits
        raise ScenarioError(f"--set value {units.brief(text)} is beyond what can be read: "
                            f"{str(e).split('; use sys.')[0]}") from None
    except RecursionError:
        raise ScenarioError(f"--set value {units.brief(text)} is nested too deep") from None
    if text.startswith("[") and text.endswith("]"):
        inner = text[1:-1].strip()
        return [_parse_value(item.strip()) for item in inner.split(",")] if inner else []
    return text


def _model_fields(model: type[BaseModel]) -> set[str]:
    return set(model.model_fields)


def _table(value: Any) -> dict[str, Any]:
    """A section of the raw file when it is a table, else an empty one (its type is validation's to judge)."""
    return value if isinstance(value, dict) else {}


def _workload_model(tool: Any) -> type[BaseModel] | None:
    """The options model of a workload's `tool`, as written (any type): None for no known tool."""
    return _WORKLOAD_MODELS.get(tool) if isinstance(tool, str) else None


def resolve_key(raw: dict[str, Any], key: str, source: str) -> list[list[str]]:
    """Turn a --set key into the path(s) in the scenario it sets.

    Dotted keys are taken as they are. A bare name is looked up: a matrix axis
    first (its plural works too: ``ratios`` -> ``matrix.ratio``), then the one
    section that has a field of that name (``bottleneck`` -> ``lab.bottleneck``,
    ``repetitions`` -> ``repeat.repetitions``); a workload option sets that
    option of every workload that has it (``duration`` -> the stream's and the
    RR test's), as a bare matrix axis does.
    """
    if "." in key:
        parts = key.split(".")
        if len(parts) > limits.KEY_DEPTH.value:
            raise ScenarioError(f"--set {_shown_key(key)}: a key of {len(parts):,} parts, over "
                                f"{limits.KEY_DEPTH}: a scenario's keys have at most 5")
        if parts[0] == "link":  # link.NAME.DIRECTION.KEY is short for lab.link.NAME.DIRECTION.KEY, as in [matrix]
            parts = ["lab", *parts]
        return [parts]
    # The file's sections as written: any of them may be of the wrong type (a string where a table belongs), which
    # validation names after the overrides are applied; here they only offer no place for a bare key.
    matrix = _table(raw.get("matrix"))
    for axis in (key, key[:-1] if key.endswith("s") else None):
        if axis and axis in matrix:
            return [["matrix", axis]]
    candidates: list[list[list[str]]] = []
    if key in _model_fields(LabSpec):
        candidates.append([["lab", key]])
    if key in _model_fields(RepeatSpec):
        candidates.append([["repeat", key]])
    workloads = [["workload", name, key] for name, spec in _table(raw.get("workload")).items()
                 if isinstance(spec, dict) and key not in ("tool", "during")
                 and key in _model_fields(_workload_model(spec.get("tool")) or BaseModel)]
    if workloads:
        candidates.append(workloads)
    if key in ("name", "description", "workloads"):
        candidates.append([[key]])
    shown = _shown_key(key)
    if key in ("tool", "during") and not candidates:
        raise ScenarioError(f"--set {shown}: each workload has its own {key}; say which, e.g. "
                            f"--set workload.NAME.{key}=...")
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        wrong = [f"{section} is {_kind(raw[section])}, not a table" for section in ("lab", "matrix", "workload",
                                                                                    "repeat")
                 if section in raw and not isinstance(raw[section], dict)]
        raise ScenarioError(
            f"--set {shown}: {source} has no parameter named {shown}"
            + (f" ({'; '.join(wrong)} in {source}: fix the file)" if wrong else "")
            + "; use a dotted key path (e.g. lab.bottleneck, workload.stream.duration, matrix.ratio)"
        )
    raise ScenarioError(
        f"--set {shown}: ambiguous in {source}, it could be "
        f"{' or '.join(' + '.join('.'.join(p) for p in c) for c in candidates)}; give the full key path"
    )


def _shown_key(key: str) -> str:
    """A key for a message: as written when it is short plain text, else quoted and shortened."""
    return key if len(key) <= 80 and key.isprintable() else units.brief(key)


def _kind(value: Any) -> str:
    """What a value of the raw file is, for a message: "a string", "an array", ..."""
    return {str: "a string", list: "an array", bool: "a boolean", int: "an integer", float: "a number",
            dict: "a table"}.get(type(value), f"a {type(value).__name__}")


def apply_override(raw: dict[str, Any], item: str, source: str) -> None:
    if "=" not in item:
        raise ScenarioError(f"--set {units.brief(item)}: expected KEY=VALUE, e.g. --set bottleneck=50Mbit")
    key, text = item.split("=", 1)
    key = key.strip()
    check_bounds(text, f"--set {_shown_key(key)}")
    for path in resolve_key(raw, key, source):
        value = _parse_value(text.strip())
        if path[0] == "matrix":
            if isinstance(value, str) and "," in value:
                value = [_parse_value(v.strip()) for v in value.split(",")]
            if not isinstance(value, list):
                value = [value]
        node = raw
        for part in path[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ScenarioError(f"--set {_shown_key(key)}: {_shown_key('.'.join(path[:-1]))} in {source} is "
                                    f"{_kind(child)}, not a table: set a key beside it, or fix the file")
            node = child
        node[path[-1]] = value


# ------------------------------------------------------------------ errors


def _valid_keys(raw: dict[str, Any], loc: tuple[Any, ...]) -> list[str]:
    """The keys allowed at the parent of ``loc``, for 'unknown key' messages."""
    parent = list(loc[:-1])
    model: type[BaseModel] | None = Scenario
    if parent[:1] == ["lab"]:
        model = LabSpec
    elif parent[:1] == ["repeat"]:
        model = RepeatSpec
    elif parent[:1] == ["workload"] and len(parent) >= 2:
        model = _workload_model(_table(_table(raw.get("workload")).get(parent[1])).get("tool"))
        if len(parent) == 3:  # pydantic puts the discriminator tag in the location
            model = _WORKLOAD_MODELS.get(str(parent[2]), model)
    elif parent:
        model = None
    return sorted(model.model_fields) if model else []


def _lookup(raw: Any, loc: tuple[Any, ...]) -> Any:
    node = raw
    for part in loc:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            return None
    return node


def _clean_loc(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    # Drop the discriminator tags pydantic inserts ("workload.stream.iperf3.duration").
    out = []
    for i, part in enumerate(loc):
        if i == 2 and loc[0] == "workload" and part in _WORKLOAD_MODELS:
            continue
        out.append(part)
    return tuple(out)


def format_validation_error(error: ValidationError, raw: dict[str, Any], source: str) -> str:
    lines = [f"{source}: the scenario is not valid ({error.error_count()} problem{'s' if error.error_count() > 1 else ''}):"]
    for item in error.errors():
        loc = _clean_loc(tuple(item["loc"]))
        key = _shown_key(".".join(str(p) for p in loc)) or "(top level)"
        kind = item["type"]
        msg = item["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
        if kind == "union_tag_invalid":  # pydantic's message quotes the tag whole, however long
            ctx = item.get("ctx") or {}
            lines.append(f"  {key}.{ctx.get('discriminator', 'tool').strip(chr(39))} = "
                         f"{units.brief(ctx.get('tag'))}: not one vnetbench knows; give one of "
                         f"{ctx.get('expected_tags', '')}")
            continue
        if kind == "extra_forbidden":
            valid = _valid_keys(raw, tuple(item["loc"]))
            hint = f"; valid keys here: {', '.join(valid)}" if valid else ""
            lines.append(f"  {key}: unknown key{hint}")
            continue
        if kind == "missing":
            lines.append(f"  {key}: required but missing")
            continue
        value = _lookup(raw, loc)
        shown = f" = {units.brief(value)}" if value is not None and not isinstance(value, dict) else ""
        lines.append(f"  {key}{shown}: {msg}")
    return "\n".join(lines)
