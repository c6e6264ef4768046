"""Matrix entries marked `if_available = true` (issue 15: virt-compare's engine rows "where installed"): their
configurations run where this machine can build their environment, and are left out elsewhere, said so by
`plan`, by `run` before it starts, in the run's fingerprint, by `show` and in the report."""

from __future__ import annotations

import json
import os

import pytest

from helpers import cli
from vnetbench.errors import EnvironmentProblem
from vnetbench.report import html as html_report
from vnetbench.report.html_synthetic import make_run
from vnetbench.runner import fingerprint
from vnetbench.runner.places.lab import leave_out_unavailable
from vnetbench.scenario import load as L
from vnetbench.scenario import plan as P
from vnetbench.store.db import Store

NOWHERE = "unix:///nonexistent/vnetbench-test.sock"  # no engine can answer here


@pytest.fixture
def no_engines(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", NOWHERE)
    monkeypatch.setenv("CONTAINER_HOST", NOWHERE)
    return {**os.environ, "DOCKER_HOST": NOWHERE, "CONTAINER_HOST": NOWHERE}


def study(*entries: str) -> list[str]:
    return ["--set", f"env=[{','.join(entries)}]", "--set", "offload=[on]",
            "--set", 'load=[{proto="tcp",parallel=1}]']


def test_the_mark_is_not_a_label_and_does_not_change_a_configuration():
    marked = P.expand(L.load("virt-compare", study('{env="bare"}', '{env="docker",if_available=true}')[1::2]))
    plain = P.expand(L.load("virt-compare", study('{env="bare"}', '{env="docker"}')[1::2]))
    assert [c.labels for c in marked] == [c.labels for c in plain] == [
        {"env": "bare", "offload": "on", "proto": "tcp", "parallel": 1},
        {"env": "docker", "offload": "on", "proto": "tcp", "parallel": 1}]
    assert [c.key for c in marked] == [c.key for c in plain]  # a stored run resumes under either spelling
    assert [c.if_available for c in marked] == [False, True] and not any(c.if_available for c in plain)


def test_an_environment_this_machine_lacks_is_left_out_with_its_reason(no_engines):
    configs = P.expand(L.load("virt-compare", study('{env="bare"}', '{env="docker",if_available=true}',
                                                    '{env="podman",if_available=true}')[1::2]))
    kept, left_out = leave_out_unavailable(configs)
    assert [c.labels["env"] for c in kept] == ["bare"]
    assert [(e["environment"], e["configurations"]) for e in left_out] == [("docker", 1), ("podman", 1)]
    assert all(f"no engine listens at {NOWHERE}" in e["reason"] for e in left_out)
    note = fingerprint.left_out_note({"left_out": left_out})
    assert note.startswith("Left out on this machine (marked if_available): docker (1 configuration): ")
    assert "apt-get install docker.io" in note and "CONTAINER_HOST chooses another" in note
    assert fingerprint.left_out_note({}) is None and fingerprint.left_out_note({"left_out": "junk"}) is None


def test_unmarked_entries_are_never_left_out(no_engines):
    configs = P.expand(L.load("virt-compare", study('{env="bare"}', '{env="docker"}')[1::2]))
    assert leave_out_unavailable(configs) == (configs, [])  # run's preflight refuses it instead, as before


def test_nothing_left_to_run_is_refused(no_engines):
    configs = P.expand(L.load("virt-compare", study('{env="docker",if_available=true}')[1::2]))
    with pytest.raises(EnvironmentProblem, match="every configuration of this scenario is marked if_available"):
        leave_out_unavailable(configs)


def test_plan_says_what_it_leaves_out(no_engines):
    args = study('{env="bare"}', '{env="docker",if_available=true}')
    shown = cli("plan", "virt-compare", *args, env=no_engines)
    assert "1 configuration x 2 repetitions" in shown.stdout
    assert "left out here (if_available): docker, 1 configuration: env docker: docker: no engine listens at " \
           f"{NOWHERE}" in " ".join(shown.stdout.split())
    planned = json.loads(cli("plan", "virt-compare", *args, "--json", env=no_engines).stdout)
    assert [c["labels"]["env"] for c in planned["configurations"]] == ["bare"]
    assert planned["left_out"][0]["environment"] == "docker" and planned["left_out"][0]["configurations"] == 1
    # every configuration marked and none available: plan lists the problems instead of leaving all out
    alone = json.loads(cli("plan", "virt-compare", *study('{env="docker",if_available=true}'), "--json",
                           env=no_engines).stdout)
    assert alone["left_out"] == [] and not alone["ready"] and NOWHERE in " ".join(alone["problems"])


def test_show_and_the_report_give_the_note_escaped(tmp_path):
    db = tmp_path / "r.db"
    with Store(db) as store:
        make_run(store, "leftout00001", matrix={"proto": ["udp", "tcp"]}, repetitions=2, duration_s=2,
                 fingerprint={"left_out": [{"environment": "docker", "configurations": 2,
                                            "reason": "no engine <b>here</b> [red]x[/]"}]})
        page = html_report.render_report(store, ["leftout00001"])
    assert ('<p class="note warn">Left out on this machine (marked if_available): docker (2 configurations): '
            "no engine &lt;b&gt;here&lt;/b&gt; [red]x[/].</p>") in page
    shown = " ".join(cli("show", "leftout00001", "--db", str(db)).stdout.split())
    assert "Left out on this machine (marked if_available): docker (2 configurations): no engine <b>here</b> " \
           "[red]x[/]." in shown  # rich markup in a reason is printed as it is, not interpreted
