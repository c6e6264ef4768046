"""`vnetbench plan` (outside review, item 2): check and cost a scenario without building or writing anything."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import cli
from vnetbench.errors import ScenarioError
from vnetbench.runner import preview
from vnetbench.scenario import load as L
from vnetbench.scenario import plan as P


def test_plan_expands_and_costs_a_builtin_like_run_would(tmp_path):
    # run where a database would be created by default: plan writes nothing there (nor anywhere)
    proc = subprocess.run([sys.executable, "-m", "vnetbench", "plan", "congestion", "--json", "--set",
                           "repetitions=3"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert os.listdir(tmp_path) == []
    plan = json.loads(proc.stdout)
    assert plan["valid"] is True and plan["scenario"] == "congestion" and plan["source"] == "builtin:congestion"
    assert len(plan["configurations"]) == 26 and plan["configurations"][0]["labels"] == {"ratio": 0.4, "proto": "udp"}
    # 26 configurations x 3 repetitions + the warm-up trial
    assert plan["trials"] == {"min": 79, "max": 79} and plan["repetitions"] == {"min": 3, "max": 3}
    # each trial: the stream's 2 s omit and 20 s (ping runs during it) + the overhead
    trial = plan["configurations"][0]["trial_s"]
    assert trial == pytest.approx(22 + preview.TRIAL_OVERHEAD_S, abs=0.05)
    assert plan["configurations"][0]["phases"] == ["stream (iperf3) + probe (ping)"]
    assert plan["estimated_s"]["min"] == pytest.approx(79 * trial + plan["estimated_s"]["setup"], abs=2)
    assert {"iperf3", "ping", "ss"} <= {t["command"] for t in plan["tools"]}
    assert [e["variant"] for e in plan["environments"]] == ["bare"]


def test_plan_in_a_terminal_fits_and_says_whether_it_can_run(tmp_path):
    proc = cli("plan", "latency-rr", "--set", "repetitions=2", "--set", 'env=[{env="bare"},{env="container"}]')
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("latency-rr (builtin:latency-rr): 16 configurations x 2 repetitions + 1 warm-up = "
                               "33 trials"), lines[0]
    assert lines[1].startswith("estimated time: ")
    assert "rr (sockperf)" in proc.stdout and "sockperf" in proc.stdout
    assert "environments: bare ok, container ok" in proc.stdout
    assert max(len(x) for x in lines) <= 160


def test_an_invalid_scenario_is_the_usual_one_line_error_and_exit_2(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "bad"\n[lab]\nbottleneck = "fast"\n[workload.s]\ntool = "iperf3"\n')
    proc = cli("plan", str(bad), check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "lab.bottleneck" in proc.stderr and "Traceback" not in proc.stderr


def test_a_matrix_too_large_is_refused_before_it_is_expanded(tmp_path):
    axis = ", ".join(str(1000 + i) for i in range(120))
    path = tmp_path / "big.toml"
    path.write_text(f'name = "big"\n[lab]\nsenders = 1\nbottleneck = "unlimited"\n[matrix]\nmtu = [{axis}]\n'
                    f'payload = [{", ".join(str(14 + i) for i in range(100))}]\n'
                    '[workload.rr]\ntool = "sockperf"\nduration = "1s"\n')
    proc = cli("plan", str(path), check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert ("the matrix makes 12,000 configurations (120 mtu x 100 payload), more than the limit of 10,000: "
            "shrink an axis, or raise the limit with --max-configurations 12000") in proc.stderr
    # the same check guards `run`, whose expansion is the same function
    with pytest.raises(ScenarioError, match="12,000 configurations"):
        P.expand(L.load(str(path)))
    assert len(P.expand(L.load(str(path)), max_configurations=12_000)) == 12_000
    proc = cli("plan", str(path), "--max-configurations", "0", check=False)
    assert proc.returncode == 2 and "argument --max-configurations: 0 must be at least 1" in proc.stderr


def test_without_root_plan_still_answers_and_says_what_it_could_not_probe(monkeypatch):
    monkeypatch.setattr(preview.os, "geteuid", lambda: 1000)
    plan = preview.make_plan(L.load("overlay-latency", ["repetitions=1"]))
    assert plan.links["choice"] is None and "needs root" in plan.links["note"]
    assert "vnetbench run needs root (it builds network namespaces): run it with sudo" in plan.problems
    assert {e["variant"] for e in plan.environments} >= {"bare", "overlay(overlay=vxlan)"}


def test_a_missing_tool_is_a_problem_with_its_package(monkeypatch):
    real = preview.workload_tools

    def with_a_missing_one(configs):
        from vnetbench.tools import Tool
        return real(configs) + [Tool("vnb-no-such-tool", "vnb-no-such-package")]

    monkeypatch.setattr(preview, "workload_tools", with_a_missing_one)
    plan = preview.make_plan(L.load("quick"))
    assert "missing tool: vnb-no-such-tool -> apt-get install vnb-no-such-package" in plan.problems
    assert plan.as_json()["ready"] is False
