"""The docs (issue 32): the generated reference pages are current, and made of descriptions every key has."""

from __future__ import annotations

import subprocess
import sys

from helpers import ROOT
from vnetbench import docsgen
from vnetbench.scenario.schema import scenario_schema
from vnetbench.workloads import iperf3, registry
from vnetbench.workloads.base import WorkloadOptions


def test_generated_pages_are_current():
    stale = docsgen.stale(ROOT)
    assert not stale, f"out of date: {', '.join(stale)}; run `python -m vnetbench.docsgen` and commit the pages"


def test_docsgen_check_says_which_page_is_stale(tmp_path):
    for rel, text in docsgen.pages().items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    (tmp_path / "docs/reference/metrics.md").write_text("# edited by hand\n")
    proc = subprocess.run([sys.executable, "-m", "vnetbench.docsgen", "--check", "--root", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "out of date: docs/reference/metrics.md" in proc.stdout, proc


def test_every_scenario_key_and_option_says_what_it_is():
    """The reference is made of these descriptions: a key without one is a blank cell."""
    models = [m for _, m in docsgen.SCENARIO_SECTIONS] + [WorkloadOptions, iperf3.FlowTiming,
                                                          *registry.options_models().values()]
    blank = [f"{m.__module__}.{m.__qualname__}.{k}" for m in models for k, f in m.model_fields.items()
             if not f.description and k != "tool"]
    assert not blank, f"give these fields a description: {blank}"


def test_the_scenario_page_has_a_section_for_every_table_of_the_schema():
    defs = set(scenario_schema()["$defs"])
    covered = {m.__name__ for _, m in docsgen.SCENARIO_SECTIONS} | {"FlowTiming"} | \
        {f"workload_{t}" for t in registry.drivers()}
    assert defs <= covered, f"no section for {sorted(defs - covered)}: add it to docsgen.SCENARIO_SECTIONS"
