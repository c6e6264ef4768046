"""The one table of tools (vnetbench/tools.py): everything that names a tool takes it from there, and the
Makefile installs exactly the packages the table and its support list name."""

from __future__ import annotations

import re
from pathlib import Path

from vnetbench import doctor, tools
from vnetbench.lab import engines
from vnetbench.lab.guest import initramfs
from vnetbench.workloads.registry import drivers

ROOT = Path(__file__).resolve().parents[2]


def makefile_packages() -> set[str]:
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    found = re.search(r"^DEB_PACKAGES\s*:=\s*(.*)$", text, re.M)
    assert found, "the Makefile has no DEB_PACKAGES line"
    return set(found.group(1).split())


def test_the_makefile_installs_exactly_the_tables_packages():
    wanted = {t.package for t in tools.ALL} | set(tools.SUPPORT_PACKAGES)
    have = makefile_packages()
    assert not wanted - have, f"tools whose package the Makefile does not install: {sorted(wanted - have)}"
    assert not have - wanted, (f"packages the Makefile installs that no tool of vnetbench/tools.py needs: "
                               f"{sorted(have - wanted)} (add the tool, or the package to SUPPORT_PACKAGES with why)")


def test_every_tool_named_anywhere_is_the_tables():
    table = {(t.command, t.package) for t in tools.ALL}
    named = {(t.command, t.package) for d in drivers().values() for t in d.requires}
    named |= {(t.command, t.package) for t in doctor.TOOLS}
    named |= set(initramfs.REQUIRED_TOOLS) | set(initramfs.optional_tools()) | set(engines.image_tools())
    assert named <= table, sorted(named - table)
    assert len({t.command for t in tools.ALL}) == len(tools.ALL)  # one entry per command


def test_nothing_installs_or_copies_a_tool_no_one_runs():
    # fping was installed, checked by doctor and copied into guests, and run by nothing.
    assert "fping" not in {t.command for t in tools.ALL} and "fping" not in makefile_packages()
    assert "fping" not in {c for c, _ in initramfs.optional_tools()}
