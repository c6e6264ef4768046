"""Shared test helpers: run the CLI as a user would, and make sure labs leave nothing behind."""

from __future__ import annotations

import os
import re
import shutil
import stat
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

def _ours() -> set[str]:
    # vnb-emu-* belong to the emulator's own end-to-end script, which may run alongside.
    return {n for n in leftovers() if not n.startswith("vnb-emu-")}


def _runs_namespaces() -> set[str]:
    # A run's (vnb-<6 hex>-...), made and torn down within one `run` or execute(): a test fixture's own lab
    # (vnb-fid..., vnb-e...) may live for its module and grow during its first test.
    return {n for n in _ours() if re.match(r"vnb-[0-9a-f]{6}-", n)}


@pytest.fixture(autouse=True)
def leaves_the_machine_as_it_found_it(request):
    """Every lab test: no new namespace of a run after it (one a test leaves is otherwise found, or worse used,
    by a later one). Every test: /dev/null still the device (a test that replaced it with a file broke every later
    `>/dev/null`, and tmux could not start, while passing itself). The namespace check is for lab tests only,
    so that the unit tests can run while a lab is up."""
    lab = request.node.get_closest_marker("lab") is not None
    before = _runs_namespaces() if lab else set()
    yield
    if lab:
        left = _runs_namespaces() - before
        assert not left, f"namespaces of a run left behind by this test: {sorted(left)}"
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode), "/dev/null is no longer the null device after this test"


@pytest.fixture
def no_leftovers():
    """Fail a lab test that leaves any vnb-* namespace behind."""
    before = _ours()
    yield
    left = _ours() - before
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


@pytest.fixture(scope="session")
def kube_cluster():
    """The test Kubernetes cluster (tests/kubecluster.py), started once for the tests marked `kube` that ask
    for it, stopped after the last."""
    import kubecluster

    with kubecluster.cluster() as cluster:
        yield cluster
