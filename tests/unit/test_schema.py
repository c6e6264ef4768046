"""`vnetbench schema`: the JSON Schema of scenario files, generated from the models, for editors (issue 32).

It must accept every file the loader accepts in the forms the docs write (every built-in, every variant of one
with a value respelled), refuse the mistakes an editor should mark, and its unit patterns must read exactly what
the unit parsers read.
"""

from __future__ import annotations

import copy
import json
import re
import tomllib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import cli
from vnetbench import units
from vnetbench.errors import VnetbenchError
from vnetbench.scenario.load import builtin_names, read_source, validate
from vnetbench.scenario.schema import scenario_schema, schema_text

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is in the test extras: pip install -e '.[test]'")

SCHEMA = scenario_schema()
# The schema says draft 2020-12; editors' validators implement older drafts too (Taplo's documentation names
# draft 4), so it must mean the same to each: no keyword a draft lacks may change a verdict.
DRAFTS = {"2020-12": jsonschema.Draft202012Validator, "7": jsonschema.Draft7Validator,
          "4": jsonschema.Draft4Validator}
VALIDATOR = DRAFTS["2020-12"](SCHEMA)
BUILTINS = {name: tomllib.loads(read_source(name)[1]) for name in builtin_names()}


def problems(raw: dict, draft: str = "2020-12") -> list[str]:
    validator = VALIDATOR if draft == "2020-12" else DRAFTS[draft](SCHEMA)
    return [f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message[:200]}"
            for e in validator.iter_errors(raw)]


def test_the_schema_is_a_valid_schema_of_each_draft():
    for validator in DRAFTS.values():
        validator.check_schema(SCHEMA)
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert SCHEMA["title"] == "vnetbench scenario"
    # each tool's table is named by its tool, not by pydantic's module path
    assert {f"workload_{t}" for t in ("iperf3", "ping", "sockperf", "ss")} <= set(SCHEMA["$defs"])
    assert not [name for name in SCHEMA["$defs"] if "__" in name]


@pytest.mark.parametrize("draft", sorted(DRAFTS))
@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_every_builtin_validates(name, draft):
    assert problems(BUILTINS[name], draft) == []


def test_the_command_prints_it_and_writes_it(tmp_path):
    proc = cli("schema")
    assert proc.stdout == schema_text()
    assert json.loads(proc.stdout)["properties"]["lab"]["$ref"] == "#/$defs/LabSpec"
    target = tmp_path / "scenario.schema.json"
    proc = cli("schema", "-o", str(target))
    assert proc.stdout == "" and json.loads(target.read_text()) == SCHEMA


MINIMAL = {"name": "s", "workload": {"stream": {"tool": "iperf3"}}}


def _with(path: str, value) -> dict:
    raw = copy.deepcopy(MINIMAL)
    node = raw
    *parents, last = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return raw


@pytest.mark.parametrize("path, value, mark", [
    ("lab.bottleneck", "100 Mbti", "lab.bottleneck"),           # a typo in a unit
    ("lab.bottleneck", "fast", "lab.bottleneck"),
    ("lab.buffer", "40 parsecs", "lab.buffer"),
    ("lab.delay", "-5ms", "lab.delay"),
    ("lab.mtu", 100, "lab.mtu"),                                # below 576
    ("lab.env", "kvm", "lab.env"),                              # not an environment
    ("lab.bottlenek", "100Mbit", "lab"),                        # an unknown key
    ("lab.loss", {"model": "gilbert_elliott", "q": "1%"}, "lab.loss"),
    ("lab.link", {"bottleneck": {"forward": {"rate": "1Gbit", "dealy": "5ms"}}}, "lab.link"),
    ("repeat.order", "random", "repeat.order"),
    ("repeat.repetitions", "five", "repeat.repetitions"),
    ("workload.stream.duration", "ten seconds", "workload.stream"),
    ("workload.stream.proto", "sctp", "workload.stream"),
    ("workload.probe", {"tool": "fping"}, "workload.probe"),    # no such tool
    ("workload.probe", {"tool": "ping", "interval": "1ms", "size": "big"}, "workload.probe"),
    ("scale", {"to": "measured"}, "scale"),                     # line_rate is required
])
def test_known_mistakes_are_marked(path, value, mark):
    for draft in DRAFTS:
        found = problems(_with(path, value), draft)
        assert found, f"{path} = {value!r} was accepted (draft {draft})"
        assert any(p.startswith(mark) for p in found), (draft, found)
    with pytest.raises(VnetbenchError):  # and the loader refuses them too: the schema marks no valid file
        validate(_with(path, value), "test")


@pytest.mark.parametrize("raw, where", [
    ({"name": "s"}, "(top)"),                                   # no workload table
    ({"workload": {"s": {"tool": "iperf3"}}}, "(top)"),         # no name
    ({"name": "s", "workload": {"s": {"tool": "iperf3"}}, "labs": {}}, "(top)"),
])
def test_missing_and_unknown_top_level_keys_are_marked(raw, where):
    assert any(p.startswith(where) for p in problems(raw))


# Spellings of each kind of value the loader reads, as a user would write them: every one must pass the schema
# wherever the loader takes it.
SPELLINGS = {
    "rate": ["100Mbit", "100 Mbit", "1.25Gbit", "500kbit", "12.5MBps", "1e6", 1_000_000, 2.5e8, " 10Gbit ", "8KiBit"],
    "size": ["500kB", "1500B", "64KiB", "1 MB", 1500, "2e3B", "1GiB"],
    "duration": ["20s", "300us", "1.5ms", "2min", 5, 0.25, "1h", "10 ms", "3sec"],
    "fraction": ["1%", "0.5 %", 0.01, "0.05", 0, "100%"],
    "loss": ["1%", 0.02, "none", "OFF", {"model": "gilbert_elliott", "p": "1%", "r": "30%"},
             {"model": "GE", "p": 0.01, "r": 0.3}, {"model": "random", "p": "2%"}, {"model": "Bernoulli", "p": 0.1}],
    "queue": ["codel", "drop-tail", "DropTail", "RED" and {"kind": "red", "min": "30kB", "max": "90kB"},
              {"kind": "Drop-Head"}, {"kind": "pie", "target": "15ms"}, "fq"],
    "buffer": ["500kB", "40ms", 100_000, "1MiB", "5 ms"],
    "bottleneck": ["unlimited", "Unlimited", "none", "50Mbit", 1e8],
    "schedule": ["100Mbit/5s 20Mbit/5s", [{"at": "0s", "forward": {"rate": "20Mbit"}}],
                 {"cycle": "10Mbit/1s, 20Mbit/1s", "direction": "both"}, "50Mbit / 2s"],
}
WHERE = {
    "rate": ["lab.link.bottleneck.forward.rate", "scale.line_rate", "workload.stream.offered"],
    "size": ["workload.stream.window", "lab.memory_limit"],
    "duration": ["lab.delay", "workload.stream.omit", "lab.link.bottleneck.reverse.delay", "hosts.wait_for_host"],
    "fraction": ["lab.link.bottleneck.forward.reorder", "repeat.target_ci", "lab.cpu_quota"],
    "loss": ["lab.loss", "lab.link.s1.forward.loss"],
    "queue": ["lab.link.bottleneck.forward.queue"],
    "buffer": ["lab.buffer", "lab.link.bottleneck.forward.buffer"],
    "bottleneck": ["lab.bottleneck"],
    "schedule": ["lab.link.bottleneck.schedule"],
}
# What a key needs beside it to be valid at all (a cpu_quota needs a container; target_ci an adaptive [repeat]).
COMPANIONS = {"lab.cpu_quota": {"lab.env": "container"}, "lab.memory_limit": {"lab.env": "container"},
              "hosts.wait_for_host": {"hosts.receiver": "a", "hosts.senders": ["b"]},
              "scale.line_rate": {"scale.to": "1Gbit"},
              "lab.link.bottleneck.forward.queue": {"lab.link.bottleneck.forward.rate": "100Mbit",
                                                    "lab.link.bottleneck.forward.buffer": "200kB"}}


def _set(raw: dict, path: str, value) -> None:
    node = raw
    *parents, last = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


@settings(max_examples=300, deadline=None, derandomize=True)
@given(data=st.data())
def test_what_the_loader_reads_the_schema_accepts(data):
    """No false marks: a value respelled in any way the loader reads, anywhere it may stand, passes the schema."""
    kind = data.draw(st.sampled_from(sorted(SPELLINGS)))
    path = data.draw(st.sampled_from(WHERE[kind]))
    value = data.draw(st.sampled_from(SPELLINGS[kind]))
    raw = copy.deepcopy(MINIMAL)
    for k, v in COMPANIONS.get(path, {}).items():
        _set(raw, k, v)
    _set(raw, path, value)
    try:
        validate(copy.deepcopy(raw), "test")
    except VnetbenchError:
        return  # not valid here (a rate in offered above the line, a loss the backend cannot express, ...)
    assert problems(raw) == [], f"{path} = {value!r} loads, but the schema marks it"


@settings(max_examples=200, deadline=None, derandomize=True)
@given(data=st.data())
def test_a_builtin_respelled_still_validates(data):
    """Every quantity of a built-in written another way the loader reads (with spaces, a bare number in base
    units) still passes."""
    name = data.draw(st.sampled_from(sorted(BUILTINS)))
    raw = copy.deepcopy(BUILTINS[name])
    respelled = []

    def walk(node):
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
        for key, value in list(items):
            if isinstance(value, (dict, list)):
                walk(value)
            elif isinstance(value, str) and data.draw(st.booleans()):
                m = re.fullmatch(r"([0-9.]+)\s*([A-Za-z%]+)", value)
                if m and m.group(1) != ".":
                    node[key] = f" {m.group(1)} {m.group(2)} "
                    respelled.append(node[key])

    walk(raw)
    validate(copy.deepcopy(raw), name)
    assert problems(raw) == [], respelled


# The unit patterns against the unit parsers: a text matches exactly when the parser reads it (up to values the
# parser refuses for range: non-finite numbers).
UNIT_TEXT = st.text(alphabet="0123456789.eE+- kKmMgGtTiIbBpPsSnuh%µ", max_size=10) | st.sampled_from(
    ["1Mibit", "5KiB", "2e3", ".5", "1.", "10 min", "3sec", "1e400Gbit", " 5%", "-1%", "1bitbit", "5 mS", "1e-3s"])


@pytest.mark.parametrize("pattern, parse", [
    (units.RATE_PATTERN, units.parse_rate), (units.SIZE_PATTERN, units.parse_size),
    (units.DURATION_PATTERN, units.parse_duration), (units.PERCENT_PATTERN, units.parse_percent)])
def test_unit_patterns_read_what_the_parsers_read(pattern, parse):
    @settings(max_examples=400, deadline=None, derandomize=True)
    @given(text=UNIT_TEXT)
    def check(text):
        matched = re.search(pattern, text) is not None
        try:
            parse(text)
            parsed = True
        except units.UnitError as e:
            parsed = "finite" in str(e) and matched  # 1e400Gbit: written right, beyond a float
        assert matched == parsed, (text, matched, parsed)

    check()
