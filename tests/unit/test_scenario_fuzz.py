"""Property test: any scenario, however odd, is planned or refused with the documented error, never a traceback.

Variants are made from the built-in scenarios the way the outside reviews made theirs: one value (or an
axis, or a new key) anywhere in the file is replaced by something odd (non-finite and huge numbers, unicode,
empty and nested tables, long lists), and any key a scenario can have (every field of every table of the
model, not only those the built-ins write) is given a value of the wrong type or size: a table where a
string belongs, a string where a table belongs, an array of thousands, an integer of hundreds of digits, a
date. Each variant is written out as TOML and read as `vnetbench plan` reads a file (`load_text`), with `--set`
overrides of any key and any value on top, then expanded; it must either give configurations or raise a
ScenarioError whose message names the file or the `--set` item, holds no control character and has no line
longer than the lists of valid values it gives. The default is 1,000 variants per test (CI);
VNB_FUZZ_EXAMPLES=10000 runs the nightly size.
"""

from __future__ import annotations

import copy
import datetime
import json
import math
import os
import time
import tomllib
from importlib import resources

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vnetbench.errors import ScenarioError, VnetbenchError
from vnetbench.impair.model import LinkBuffer, LinkConditions, LinkSpec, LossSpec, QueueSpec, Schedule, ScheduleStep
from vnetbench.scenario.load import BUILTIN_PACKAGE, builtin_names, load_text
from vnetbench.scenario.model import HostsSpec, LabSpec, RepeatSpec, ScaleSpec, Scenario
from vnetbench.scenario.plan import expand
from vnetbench.workloads import registry
from vnetbench.workloads.iperf3 import FlowTiming

EXAMPLES = int(os.environ.get("VNB_FUZZ_EXAMPLES", "1000"))
BUILTINS = {name: tomllib.loads(resources.files(BUILTIN_PACKAGE).joinpath(f"{name}.toml").read_text())
            for name in builtin_names()}
TOOLS = registry.options_models()

ODD_NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 2**63, 10**400, 1e-320, 1e308, float("nan"), float("inf"), -0.0]))
ODD_STRINGS = st.one_of(
    st.text(max_size=40), st.sampled_from(["", "unlimited", "nan", "inf", "1e400", "0", "-5Mbit", "1Mbit/0s",
                                           "trace:/dev/zero", "trace:/nonexistent", "trace:/proc/self/environ",
                                           "trace:/proc/kmsg", "1e6s", "2.5s", "50%",
                                           "100Mbit/1s" + "," * 300 + "x", "ratio * " * 80 + "1", "ünïcode",
                                           "0.0001ms", "999999999999Gbit", "{}", "[]", "[/x]", "x\x1b[2J"]))
LEAVES = st.one_of(ODD_NUMBERS, ODD_STRINGS, st.booleans(), st.none(),
                   st.datetimes(), st.dates(), st.times())  # TOML has dates and times, which no key takes
VALUES = st.recursive(LEAVES, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                      st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                      max_leaves=8)
# A value of the wrong type or size for whatever key it lands on.
WRONG = st.one_of(
    st.just({}), st.just([]), st.just({"a": {"b": {}}}), st.just([[[]]]), st.just("x" * 5000), st.just(10**400),
    st.just(list(range(2000))), st.just(["x"] * 300), st.just({f"k{i}": i for i in range(200)}),
    st.dictionaries(st.sampled_from(["rate", "kind", "model", "at", "tool", "cycle", "direction", "forward",
                                     "both", "trace", "every", "steps", "p", "env"]), VALUES, min_size=1, max_size=3),
    st.lists(VALUES, min_size=1, max_size=3), LEAVES)


def _model_keys(raw: dict) -> list[tuple[str, ...]]:
    """Every key a scenario can have, as a path: each field of each table of the model, with the workloads,
    links and directions the scenario names (and one of each it does not)."""
    keys = [(f,) for f in Scenario.model_fields]
    for section, model in (("lab", LabSpec), ("repeat", RepeatSpec), ("hosts", HostsSpec), ("scale", ScaleSpec)):
        keys += [(section, f) for f in model.model_fields]
    for link in ("bottleneck", "s1"):
        at = ("lab", "link", link)
        keys += [at + (f,) for f in [*LinkSpec.model_fields, "both"]]
        keys += [at + ("schedule", f) for f in [*Schedule.model_fields, "cycle"]]
        keys += [at + ("schedule", "steps", f) for f in ScheduleStep.model_fields]
        for d in ("forward", "reverse", "both"):
            keys += [at + (d, f) for f in LinkConditions.model_fields]
            for sub, model in (("loss", LossSpec), ("queue", QueueSpec), ("buffer", LinkBuffer)):
                keys += [at + (d, sub, f) for f in model.model_fields]
    keys += [("lab", "loss", f) for f in LossSpec.model_fields] + [("lab", "buffer", f) for f in LinkBuffer.model_fields]
    workloads = raw.get("workload") if isinstance(raw.get("workload"), dict) else {}
    for name, spec in [*workloads.items(), ("extra", {"tool": "iperf3"})]:
        tool = spec.get("tool") if isinstance(spec, dict) else None
        for f in ((TOOLS.get(tool) if isinstance(tool, str) else None) or TOOLS["iperf3"]).model_fields:
            keys.append(("workload", name, f))
        if tool == "iperf3":
            keys += [("workload", name, "flows", f) for f in FlowTiming.model_fields]
    keys += [("matrix", axis) for axis in ["ratio", "delay", "env", "proto", "x", *LabSpec.model_fields][:12]]
    return keys


def _paths(node, prefix=()):
    """Every key path of a parsed scenario, tables included."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))


def _get(raw, path):
    node = raw
    for part in path:
        node = node[part]
    return node


def _like(draw, current):
    """An odd value, most often of the current value's own kind (what a user's typo or a script would
    write), else anything."""
    if draw(st.integers(0, 4)) == 0:
        return draw(VALUES)
    if isinstance(current, bool):
        return draw(st.one_of(st.booleans(), ODD_NUMBERS, ODD_STRINGS))
    if isinstance(current, (int, float)):
        return draw(st.one_of(ODD_NUMBERS, ODD_STRINGS))
    if isinstance(current, str):
        return draw(ODD_STRINGS)
    if isinstance(current, list):
        return [(_like(draw, x) if draw(st.booleans()) else x) for x in current] or draw(st.lists(LEAVES, max_size=3))
    return draw(VALUES)


def _set(raw, path, value):
    """Put `value` at `path`, making the tables on the way (a step that is not a table is replaced by one:
    the value lands wherever it was aimed); None leaves the key out."""
    node = raw
    for part in path[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    if value is None:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = copy.deepcopy(value)  # st.just() gives the same object every time: never change it


@st.composite
def variants(draw, changes=(1, 3)):
    name = draw(st.sampled_from(sorted(BUILTINS)))
    raw = copy.deepcopy(BUILTINS[name])
    for _ in range(draw(st.integers(*changes))):
        paths = list(_paths(raw))
        kind = draw(st.sampled_from(["replace", "replace", "wrong type", "wrong type", "new key", "axis"]))
        if kind == "wrong type":
            _set(raw, draw(st.sampled_from(_model_keys(raw))), draw(WRONG))
        elif kind == "new key" or not paths:
            section = draw(st.sampled_from(["lab", "repeat", "matrix", "workload"]))
            raw.setdefault(section, {})
            if isinstance(raw[section], dict):
                raw[section][draw(st.text(min_size=1, max_size=12))] = copy.deepcopy(draw(VALUES))
        elif kind == "axis":
            raw.setdefault("matrix", {})
            if isinstance(raw["matrix"], dict):
                raw["matrix"][draw(st.sampled_from(["ratio", "delay", "payload", "mtu", "env", "buffer", "x"]))] = \
                    draw(st.lists(VALUES, max_size=6))
        else:
            path = draw(st.sampled_from(paths))
            _set(raw, path, _like(draw, _get(raw, path)))
    return name, raw


# ------------------------------------------------------------------ TOML out


def _toml_string(text: str) -> str:
    # JSON's escapes are TOML's, but for DEL, which TOML wants escaped and JSON leaves
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return _toml_string(v)
    if isinstance(v, (datetime.datetime, datetime.date, datetime.time)):
        return v.isoformat()
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v if x is not None) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_toml_string(k)} = {_toml_value(x)}" for k, x in v.items() if x is not None) + "}"
    raise TypeError(type(v))


def to_toml(raw: dict) -> str:
    """The scenario as a file: every top-level key on its own line, tables inline (TOML 1.0 keeps an inline
    table on one line, as here)."""
    return "".join(f"{_toml_string(k)} = {_toml_value(v)}\n" for k, v in raw.items() if v is not None)


# ------------------------------------------------------------------ --set

FIELD_NAMES = sorted({f for m in (Scenario, LabSpec, RepeatSpec, *TOOLS.values()) for f in m.model_fields}
                     | {"ratios", "x", "proto", "env", "payload"})
SET_VALUES = st.one_of(
    ODD_STRINGS, WRONG.filter(lambda v: v is not None).map(_toml_value),
    st.sampled_from(["1" + "0" * 400, "{}", "{a = {b = {}}}", "[1, [2]]", "[udp,tcp]", "udp,tcp", '"x"',
                     "1979-05-27T07:32:00", "{a.b.c = 1}", "[" * 300 + "]" * 300, "[" * 300 + "x" + "]" * 300]))


@st.composite
def set_items(draw, raw: dict):
    if draw(st.booleans()):
        key = draw(st.sampled_from(FIELD_NAMES))
    else:
        key = ".".join(draw(st.sampled_from(_model_keys(raw))))
    return f"{key}={draw(SET_VALUES)}"


# ------------------------------------------------------------------ the property


def _plan(name: str, text: str, sets: list[str] = ()) -> None:
    """What plan does with a file before it asks the machine: read, override, validate, then expand
    (limited, to keep the test fast: the limit's own error is one of the outcomes)."""
    source = f"fuzz-{name}.toml"
    started = time.monotonic()
    try:
        expand(load_text(text, source, list(sets)), max_configurations=300)
    except VnetbenchError as e:
        message = str(e)
        assert isinstance(e, ScenarioError), (type(e), message[:500])
        assert source in message or message.startswith("--set "), message[:500]
        # shortened values, no terminal escapes or other control characters (a message is for people)
        assert not any(ord(c) < 0x20 and c != "\n" or 0x7F <= ord(c) < 0xA0 for c in message), message[:500]
        assert all(len(line) <= 4000 for line in message.splitlines()), max(message.splitlines(), key=len)[:500]
    assert time.monotonic() - started < 30, f"planning a variant of {name} took over 30 s"


SETTINGS = dict(deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])


@settings(max_examples=EXAMPLES, **SETTINGS)
@given(variants())
def test_any_variant_plans_or_fails_with_the_documented_error(variant):
    name, raw = variant
    _plan(name, to_toml(raw))


@settings(max_examples=EXAMPLES, **SETTINGS)
@given(st.data())
def test_any_set_on_any_variant_is_applied_or_refused_with_the_documented_error(data):
    name, raw = data.draw(variants(changes=(0, 1)))
    sets = data.draw(st.lists(set_items(raw), min_size=1, max_size=2))
    _plan(name, to_toml(raw), sets)


def test_the_writer_round_trips_a_builtin():
    for raw in BUILTINS.values():
        assert tomllib.loads(to_toml(raw)) == raw
