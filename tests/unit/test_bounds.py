"""Nothing in a scenario expands without bound (issue 33, item 4): `plan` refuses each resource case, within a
second and naming the limit (limits.py), and writes nothing; a trace is parsed once whatever the number of
configurations that name it."""

from __future__ import annotations

import time

import pytest

from helpers import cli, tree_state
from vnetbench import limits
from vnetbench.errors import ScenarioError
from vnetbench.impair import trace as T
from vnetbench.scenario import load as L
from vnetbench.scenario import plan as P

BASE = 'name = "bounds"\n[lab]\nsenders = 1\nbottleneck = "100Mbit"\n[workload.stream]\ntool = "iperf3"\nduration = "2s"\n'


def _in_lab(line: str) -> str:
    return BASE.replace("[workload", f"{line}\n[workload", 1)


def _cases(tmp_path):
    """(file name, its text or None when written by the case, --set items, what the refusal must say)"""
    huge_trace = tmp_path / "huge.trace"
    with open(huge_trace, "wb") as f:  # sparse: its size is what is refused, before a byte is read
        f.truncate(limits.TRACE_BYTES.value + 1)
    return [
        ("size.toml", BASE + "#" + "x" * limits.SCENARIO_BYTES.value + "\n", [], str(limits.SCENARIO_BYTES)),
        # 40 kB of one dotted key took tomllib 14 s and 1.7 GB
        ("depth.toml", BASE + "x" + ".x" * 20_000 + " = 1\n", [], str(limits.KEY_DEPTH)),
        ("depth-set.toml", BASE, ["lab" + ".x" * 20_000 + "=1"], str(limits.KEY_DEPTH)),
        ("depth-set-value.toml", BASE, ["matrix.x={" + "a." * 20_000 + "a = 1}"], str(limits.KEY_DEPTH)),
        # `every = "1us"`: 7.4 s and 1 GB at trial start for one second of schedule
        ("every.toml", BASE + '[lab.link.bottleneck]\nschedule = {every = "1us", steps = '
                              '[{at = "0s", forward = {rate = "10Mbit"}}]}\n', [],
         "a schedule repeats at most every 1ms"),
        ("steps.toml", BASE.replace('"2s"', '"200s"') + '[lab.link.bottleneck]\nschedule = {every = "1ms", '
                                                        'steps = [{at = "0s", forward = {rate = "10Mbit"}}]}\n', [],
         str(limits.SCHEDULE_STEPS)),
        ("trace.toml", _in_lab(f'bottleneck_schedule = "trace:{huge_trace}"'), [], str(limits.TRACE_BYTES)),
        ("matrix.toml", BASE + "[matrix]\nmtu = [" + ", ".join(str(1300 + i) for i in range(101)) + "]\nratio = ["
                        + ", ".join(str(1 + i) for i in range(100)) + "]\n", [], "the limit of 10,000"),
    ]


def test_plan_refuses_each_resource_case_within_a_second_naming_the_limit(tmp_path):
    cases = _cases(tmp_path)
    for name, text, _, _ in cases:
        (tmp_path / name).write_text(text)
    before = tree_state(tmp_path)
    for name, _, sets, needle in cases:
        path = tmp_path / name
        started = time.monotonic()
        with pytest.raises(ScenarioError) as refused:
            P.expand(L.load(str(path), sets))
        took = time.monotonic() - started
        assert needle in str(refused.value), (name, str(refused.value)[:500])
        assert took < 1.0, f"{name}: refused after {took:.2f} s"
        # the CLI says the same in one short line, exit status 2
        proc = cli("plan", str(path), *[a for s in sets for a in ("--set", s)], check=False)
        assert proc.returncode == 2 and needle in proc.stderr and "Traceback" not in proc.stderr, (name, proc.stderr)
        assert proc.stdout == "" and all(len(line) <= 400 for line in proc.stderr.splitlines()), proc.stderr[:500]
    assert tree_state(tmp_path) == before  # plan wrote nothing, beside the files or anywhere under them


def test_a_trace_is_parsed_once_for_every_configuration_that_names_it(tmp_path, monkeypatch):
    trace = tmp_path / "t.trace"
    trace.write_text("".join(f"{i}\n" for i in range(1, 2001)))
    scenario = tmp_path / "s.toml"
    scenario.write_text(_in_lab(f'bottleneck_schedule = "trace:{trace}"') + '[matrix]\nratio = [1, 2, 3, 4, 5, 6, 7, 8]\n')
    parsed = []
    real = T.parse
    monkeypatch.setattr(T, "parse", lambda *a, **k: parsed.append(a[1]) or real(*a, **k))
    T._parsed.clear()
    assert len(P.expand(L.load(str(scenario)))) == 8
    assert len(parsed) == 1, parsed
    trace.write_text("".join(f"{i}\n" for i in range(1, 2002)))  # rewritten: read again, once
    assert len(P.expand(L.load(str(scenario)))) == 8
    assert len(parsed) == 2, parsed
