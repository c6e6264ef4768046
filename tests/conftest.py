"""Shared test helpers: run the CLI as a user would, and make sure labs leave nothing behind."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from vnetbench.impair.capacity import STATE_DIR_ENV
from vnetbench.lab.clean import leftovers

# The machine's measured link capacity (doctor --fidelity's, in /var/lib/vnetbench) changes the rates of
# scenarios with a [scale] table: the tests, and the CLI they run, see an empty state directory of their own
# unless a test gives one (tests/unit/test_scale.py).
_STATE_DIR = tempfile.mkdtemp(prefix="vnbtest-state-")
os.environ[STATE_DIR_ENV] = _STATE_DIR


def pytest_unconfigure(config):
    shutil.rmtree(_STATE_DIR, ignore_errors=True)

@pytest.fixture
def no_leftovers():
    """Fail a lab test that leaves any vnb-* namespace behind."""
    # vnb-emu-* belong to the emulator's own end-to-end script, which may run alongside.
    ours = lambda: {n for n in leftovers() if not n.startswith("vnb-emu-")}
    before = ours()
    yield
    left = ours() - before
    assert not left, f"namespaces left behind: {sorted(left)}"


def pytest_collection_modifyitems(config, items):
    if "campaign" not in (config.getoption("-m") or ""):
        skip = pytest.mark.skip(reason="a campaign: run it with `pytest -m campaign`")
        for item in items:
            if "campaign" in item.keywords:
                item.add_marker(skip)
    if os.geteuid() != 0:
        skip = pytest.mark.skip(reason="lab tests build network namespaces: run as root (make test does)")
        for item in items:
            if "lab" in item.keywords:
                item.add_marker(skip)
