"""Property test: any scenario, however odd, is planned or refused with the documented error, never a traceback.

Variants are made from the built-in scenarios the way the outside review made its 4,833: one value (or an
axis, or a new key) anywhere in the file is replaced by something odd (non-finite and huge numbers, wrong
types, unicode, empty and nested tables, long lists). Each is validated and expanded as `vnetbench plan` and
`run` do; it must either give configurations or raise a ScenarioError whose message names the source. The
default is 1,000 variants (CI); VNB_FUZZ_EXAMPLES=10000 runs the nightly size.
"""

from __future__ import annotations

import copy
import os
import time
import tomllib
from importlib import resources

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vnetbench.errors import VnetbenchError
from vnetbench.scenario.load import BUILTIN_PACKAGE, LoadedScenario, apply_override, builtin_names, validate
from vnetbench.scenario.plan import expand

EXAMPLES = int(os.environ.get("VNB_FUZZ_EXAMPLES", "1000"))
BUILTINS = {name: tomllib.loads(resources.files(BUILTIN_PACKAGE).joinpath(f"{name}.toml").read_text())
            for name in builtin_names()}

ODD_NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 2**63, 10**400, 1e-320, 1e308, float("nan"), float("inf"), -0.0]))
ODD_STRINGS = st.one_of(
    st.text(max_size=40), st.sampled_from(["", "unlimited", "nan", "inf", "1e400", "0", "-5Mbit", "1Mbit/0s",
                                           "trace:/dev/zero", "trace:/nonexistent", "1e6s", "2.5s", "50%",
                                           "100Mbit/1s" + "," * 300 + "x", "ratio * " * 80 + "1", "ünïcode",
                                           "0.0001ms", "999999999999Gbit", "{}", "[]"]))
LEAVES = st.one_of(ODD_NUMBERS, ODD_STRINGS, st.booleans(), st.none())
VALUES = st.recursive(LEAVES, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                      st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                      max_leaves=8)


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
    node = raw
    for part in path[:-1]:
        node = node[part]
    if value is None:
        node.pop(path[-1], None)  # a key left out
    else:
        node[path[-1]] = value


@st.composite
def variants(draw):
    name = draw(st.sampled_from(sorted(BUILTINS)))
    raw = copy.deepcopy(BUILTINS[name])
    for _ in range(draw(st.integers(1, 3))):
        paths = list(_paths(raw))
        kind = draw(st.sampled_from(["replace", "replace", "new key", "axis"]))
        if kind == "new key" or not paths:
            section = draw(st.sampled_from(["lab", "repeat", "matrix", "workload"]))
            raw.setdefault(section, {})
            if isinstance(raw[section], dict):
                raw[section][draw(st.text(min_size=1, max_size=12))] = draw(VALUES)
        elif kind == "axis":
            raw.setdefault("matrix", {})
            if isinstance(raw["matrix"], dict):
                raw["matrix"][draw(st.sampled_from(["ratio", "delay", "payload", "mtu", "env", "buffer", "x"]))] = \
                    draw(st.lists(VALUES, max_size=6))
        else:
            path = draw(st.sampled_from(paths))
            _set(raw, path, _like(draw, _get(raw, path)))
    return name, raw


def _plan(name: str, raw: dict) -> None:
    """What plan does with a file before it asks the machine: validate, then expand (limited, to keep the
    test fast: the limit's own error is one of the outcomes)."""
    source = f"fuzz:{name}"
    try:
        scenario = validate(raw, source)
        expand(LoadedScenario(scenario=scenario, source=source, text="", overrides=()), max_configurations=300)
    except VnetbenchError as e:
        message = str(e)
        assert message.startswith(source) and message.strip(), message
        assert len(message) < 20_000, message[:500]


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(variants())
def test_any_variant_plans_or_fails_with_the_documented_error(variant):
    name, raw = variant
    started = time.monotonic()
    _plan(name, raw)
    assert time.monotonic() - started < 30, f"planning a variant of {name} took over 30 s"


@settings(max_examples=max(100, EXAMPLES // 5), deadline=None, derandomize=True)
@given(name=st.sampled_from(sorted(BUILTINS)),
       key=st.sampled_from(["bottleneck", "buffer", "delay", "jitter", "loss", "mtu", "duration", "repetitions",
                            "offered", "ratio", "senders", "seed", "env", "payload", "interval", "workload",
                            "matrix", "lab", "workload.stream.omit", "repeat.seed", "lab.link.bottleneck"]),
       value=ODD_STRINGS)
def test_any_set_value_is_applied_or_refused_with_the_documented_error(name, key, value):
    raw = copy.deepcopy(BUILTINS[name])
    try:
        apply_override(raw, f"{key}={value}", f"fuzz:{name}")
    except VnetbenchError as e:
        assert str(e).strip()
        return
    _plan(name, raw)
