"""Shared test helpers: run the CLI as a user would, and make sure labs leave nothing behind."""

from __future__ import annotations

import os

import pytest

from vnetbench.lab.clean import leftovers

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
    if os.geteuid() != 0:
        skip = pytest.mark.skip(reason="lab tests build network namespaces: run as root (make test does)")
        for item in items:
            if "lab" in item.keywords:
                item.add_marker(skip)
