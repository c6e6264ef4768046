"""The place seam (runner/places): the runner talks to a Place, whichever it is."""

from __future__ import annotations

import inspect
import shlex

import pytest

from vnetbench import cli
from vnetbench.errors import VnetbenchError
from vnetbench.runner import places, run
from vnetbench.runner.places.base import Place
from vnetbench.runner.places.hosts import HostsPlace
from vnetbench.runner.places.lab import LabPlace

INVENTORY = """all:
  hosts:
    server-a: {ansible_host: 198.18.0.1}
    client-1: {ansible_host: 198.18.0.2}
"""


def test_the_runner_names_no_place():
    """execute and resume go through the Place interface alone: no branch on where the run happens."""
    for function in (run.execute, run.resume, run._TrialRunner.__call__):
        source = inspect.getsource(function)
        for word in ("hosts", "Hosts", "inventory", "DumbbellBench(", "for_configs", "HostAccess"):
            assert word not in source, f"{function.__qualname__} names {word!r}"


def test_every_place_is_a_place_and_the_lab_answers_last():
    assert all(issubclass(p, Place) for p in places.PLACES)
    assert places.PLACES[-1] is LabPlace
    for place in places.PLACES:
        for abstract in ("prepare", "bench", "doctor", "clean"):
            assert not getattr(getattr(place, abstract), "__isabstractmethod__", False), (place, abstract)


@pytest.mark.parametrize("command", ["run", "doctor", "clean"])
def test_the_command_line_chooses_the_place(tmp_path, command):
    inventory = tmp_path / "inv.yml"
    inventory.write_text(INVENTORY)
    parser = cli.build_parser()
    extra = ["quick"] if command == "run" else []
    assert type(places.from_args(parser.parse_args([command, *extra]))) is LabPlace
    chosen = places.from_args(parser.parse_args([command, *extra, "--hosts", str(inventory)]))
    assert type(chosen) is HostsPlace and chosen.access.inventory.path == inventory
    assert chosen.resume_args() == f" --hosts {inventory}"
    assert chosen.clean_command() == f"vnetbench clean --hosts {inventory}"
    with pytest.raises(VnetbenchError, match="go with --hosts"):
        places.from_args(parser.parse_args([command, *extra, "--accept-new-host-keys"]))


def test_the_commands_printed_for_an_inventory_anywhere_are_quoted(tmp_path):
    # a fix command the user copies must name the inventory it names, whatever its path holds
    odd = tmp_path / "my lab; rm -rf ~ $(x) 'q'"
    odd.mkdir()
    inventory = odd / "inv.yml"
    inventory.write_text(INVENTORY)
    chosen = places.from_args(cli.build_parser().parse_args(["run", "quick", "--hosts", str(inventory)]))
    assert shlex.split(chosen.resume_args()) == ["--hosts", str(inventory)]
    assert shlex.split(chosen.clean_command()) == ["vnetbench", "clean", "--hosts", str(inventory)]


def test_a_run_of_the_lab_is_not_resumed_on_hosts_and_back():
    with pytest.raises(VnetbenchError, match="resume it with --hosts INVENTORY"):
        LabPlace().check_resume({"hosts": {"server-a": {}}, "inventory": "inv.yml"}, "abc")
    LabPlace().check_resume({}, "abc")


def test_link_backend_names_come_from_one_registry():
    """The scenario's `backend` values, doctor's qdisc probes and fixes, and a host's qdisc checks are all the
    backend registry's (issue 30: each concept declared once)."""
    from typing import get_args

    from vnetbench import doctor
    from vnetbench.hosts import preflight
    from vnetbench.impair.backends import REGISTRY
    from vnetbench.impair.model import BACKENDS, LinkSpec
    from vnetbench.scenario.model import LabSpec

    assert set(BACKENDS) == {"auto", *REGISTRY}
    for model in (LinkSpec, LabSpec):
        assert get_args(model.model_fields["backend"].annotation) == BACKENDS
    kernel = {name for name, kind in REGISTRY.items() if kind.kernel}
    assert kernel == set(preflight.QDISC_MODULES) and kernel <= set(doctor.QDISCS)
    assert all(REGISTRY[name].fix and doctor.QDISC_FIXES[name].startswith(REGISTRY[name].fix) for name in kernel)
    assert "userspace" not in kernel


def test_a_bench_that_cannot_be_made_lets_the_run_lock_and_the_place_go(tmp_path):
    """A place whose bench fails to be made (an empty configuration list reached it once: IndexError) ended the
    run with its machine-wide lock still held, and every later run in the process was refused as concurrent."""
    from vnetbench import runlock
    from vnetbench.scenario import load
    from vnetbench.store.db import Store

    released = []

    class BrokenBench(LabPlace):
        def prepare(self, loaded, configs):
            return configs, []

        def bench(self, run_prefix, configs):
            raise RuntimeError("no bench today")

        def release(self):
            released.append(True)

    store = Store(tmp_path / "r.db")
    loaded = load.load("quick", ["ratios=[0.6]", "protos=[udp]"])
    with pytest.raises(RuntimeError, match="no bench today"):
        # allow_concurrent: the lock is taken all the same (and must be let go), but another run live on this
        # machine, a benchmark say, does not refuse this one
        run.execute(loaded, store, place=BrokenBench(), progress=False, allow_concurrent=True)
    (stored,) = store.runs()
    assert stored["status"] == "failed" and "no bench today" in (stored["status_reason"] or "")
    assert not [r for r in runlock.live_runs() if r.run_id == stored["id"]]
    assert not runlock.is_live(stored["id"]) and released == [True]


def test_a_stop_while_the_bench_is_made_is_an_interrupted_run_that_resume_finishes(tmp_path):
    """Outside a lab the signal's handler raises wherever the main thread is: a SIGTERM while the bench was made
    (3.29 s into a run on a slow CI machine) stored the run as failed, as if the bench had a bug."""
    from vnetbench.lab.teardown import Interrupted
    from vnetbench.scenario import load
    from vnetbench.store.db import Store

    class StoppedWhileMaking(LabPlace):
        def prepare(self, loaded, configs):
            return configs, []

        def bench(self, run_prefix, configs):
            raise Interrupted("SIGTERM", lab_up=False)

    store = Store(tmp_path / "r.db")
    loaded = load.load("quick", ["ratios=[0.6]", "protos=[udp]"])
    with pytest.raises(Interrupted):
        run.execute(loaded, store, place=StoppedWhileMaking(), progress=False, allow_concurrent=True)
    (stored,) = store.runs()
    assert stored["status"] == "interrupted", stored["status_reason"]
    assert f"vnetbench run --resume {stored['id']}" in stored["status_reason"]


def test_the_parser_and_clean_import_nothing_that_runs_a_scenario():
    """Every command builds its parser from the places; what runs a scenario (its models, the benches, the
    cluster's client: most of a second) is imported by the commands that run one, not by clean, show or
    --version."""
    import subprocess
    import sys

    code = ("import sys; from vnetbench import cli; cli.build_parser(); from vnetbench.lab import clean; "
            "print('\\n'.join(sys.modules))")
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
                 .stdout.split())
    heavy = {"vnetbench.scenario.load", "vnetbench.runner.bench", "vnetbench.runner.hosts_bench",
             "vnetbench.kube.bench", "vnetbench.hosts.ssh", "kubernetes", "pydantic", "numpy"}
    assert "vnetbench.runner.places.kube" in loaded and not loaded & heavy, sorted(loaded & heavy)
