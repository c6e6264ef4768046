"""Names are names, never paths (issue 33, high): one rule for every name a user chooses.

A workload called "../../../../etc/cron.daily/x" used to pass `plan`, and `run` then created or truncated
/etc/cron.daily/x.out and .err as root. Every name a scenario chooses (its own, its workloads', its matrix
axes' and their inline tables' keys, its [hosts] references) now follows one rule, scenario/names.py, which
`plan` and `run` check before anything is built; inventories follow it too (test_hosts_inventory.py). What
a run writes is named by index besides (test_run_files.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import ROOT, hostile_names, tree_state
from vnetbench.errors import ScenarioError
from vnetbench.scenario.load import load_text
from vnetbench.scenario.names import NAME_MAX, is_name, suggestion
from vnetbench.scenario.plan import expand

BASE = ('name = "{name}"\n[lab]\nsenders = 1\nbottleneck = "100Mbit"\n'
        '[workload.stream]\ntool = "iperf3"\nduration = "2s"\n')


REFUSED = [
    ("workload", "../../../../etc/cron.daily/x"),
    ("workload", "a\nrun: 0123456789ab"),  # a fake last line for whoever parses `run`'s output
    ("workload", "-rf"),
    ("workload", ".."),
    ("name", "../../x"),
    ("name", "congestion\trun: fake"),
    ("name", "x" * (NAME_MAX + 1)),
    ("matrix", "../x"),
    ("hosts", "../../x"),
    ("addresses", "a b"),
]


def _key(name: str) -> str:
    """`name` as a TOML key, quoted and escaped."""
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t") + '"'


def _scenario(where: str, name: str) -> str:
    return {
        "workload": BASE.format(name="t") + f'[workload.{_key(name)}]\ntool = "ping"\nduration = "2s"\n',
        "name": BASE.replace('"{name}"', _key(name)),
        "matrix": BASE.format(name="t") + f'[matrix]\n{_key(name)} = [{{ratio = 1}}]\n',
        "hosts": BASE.format(name="t") + f'[hosts]\nreceiver = {_key(name)}\nsenders = ["c"]\n',
        "addresses": BASE.format(name="t") + f'[hosts]\nreceiver = "r"\nsenders = ["c"]\n'
                                             f'addresses = {{ {_key(name)} = "198.18.0.1" }}\n',
    }[where]


def _says_what_to_do(message: str, source: str, name: str) -> None:
    # the file, the key, the value (escaped) and what to do
    assert source in message and repr(name)[:40] in message and "not a name" in message, message
    assert "rename it, e.g." in message and "a name is 1 to 80 ASCII letters" in message, message


@pytest.mark.parametrize("where, name", REFUSED)
def test_the_model_refuses_a_name_that_is_not_one(where, name):
    with pytest.raises(ScenarioError) as e:
        load_text(_scenario(where, name), "s.toml")
    _says_what_to_do(str(e.value), "s.toml", name)


@pytest.mark.parametrize("where, name", REFUSED[:2] + REFUSED[5:6] + REFUSED[7:])
def test_plan_refuses_it(tmp_path, where, name):
    scenario = tmp_path / "s.toml"
    scenario.write_text(_scenario(where, name))
    proc = subprocess.run([sys.executable, "-m", "vnetbench", "plan", str(scenario)], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr, proc.stderr
    _says_what_to_do(proc.stderr, str(scenario), name)


@pytest.mark.skipif(os.geteuid() != 0, reason="run checks root before it reads the scenario")
def test_run_refuses_it_before_anything_is_built_or_written(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    scenario = tmp_path / "s.toml"
    name = "../" * 12 + str(victim / "x").lstrip("/")
    scenario.write_text(BASE.format(name="t") + f'[workload.{_key(name)}]\ntool = "ping"\nduration = "2s"\n')
    before = tree_state(tmp_path)
    # No tools on PATH: were the name ever let through again, the run would stop at its tool check, before it
    # builds a lab (a unit test must not) or writes to the victim directory.
    proc = subprocess.run([sys.executable, "-m", "vnetbench", "run", str(scenario), "--db", str(tmp_path / "r.db"),
                           "--no-progress"], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "PATH": str(tmp_path / "no-tools")})
    assert proc.returncode == 2 and "is not a name" in proc.stderr, proc.stderr
    assert tree_state(tmp_path) == before  # no database, no logs, nothing in the victim directory


@settings(max_examples=300, deadline=None)
@given(name=hostile_names(), where=st.sampled_from(["name", "workload", "matrix", "hosts", "addresses"]))
def test_a_name_the_scenario_model_accepts_stays_in_its_directory(name, where):
    """Through the model `plan` and `run` use: any name is refused with the documented error, or is one plain
    path component of ASCII letters, digits, '_', '.' and '-' (so also no NUL, line break, tab or option)."""
    text = _scenario(where, name)
    try:
        loaded = load_text(text, "s.toml")
        configs = expand(loaded)
    except ScenarioError as e:
        assert str(e).startswith("s.toml") and "Traceback" not in str(e)
        return
    s = loaded.scenario
    names = [s.name, *s.workload, *s.matrix, *(k for c in configs for k in c.labels)]
    if s.hosts:
        names += [s.hosts.receiver, *s.hosts.senders, *s.hosts.addresses]
    for n in names:
        assert is_name(n) and n not in (".", "..") and not n.startswith("-")
        assert os.path.basename(n) == n and "\0" not in n and n.isprintable() and n.isascii()
        root = Path("/run-dir")
        assert os.path.normpath(root / n).startswith(str(root) + "/")


@given(name=hostile_names())
def test_the_name_offered_instead_is_a_name(name):
    assert is_name(suggestion(name))

