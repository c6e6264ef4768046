"""What a place to run is, as the runner sees it.

A run happens somewhere: in this machine's namespace lab, on real hosts over SSH, next on a Kubernetes cluster.
The runner talks to that place through this interface alone, in this order::

    prepare(loaded, configs) what the scenario needs, checked here before anything is stored or started
                            (tools, privileges, qdiscs, reachability); the configurations that run here
    hold(run_id, scenario)  the place's own locks (one run measures there at a time), and what can only be
                            read once they are held (the hosts' interfaces, clocks, fingerprints)
    facts()                 what the run's fingerprint records of the place
    calibrate(prefix)       the place's machine measured the same way before the bench is made and after it
                            is gone (runner/calibration.py; None where the place cannot)
    bench(prefix, configs)  the endpoints as nodes and the links as backends (an endpoint -> node mapping),
                            with how each configuration is prepared and each trial run
    release()               the locks let go (teardown of what the bench made is the bench's)

plus, for a stored run taken up again, ``check_resume``, and the commands a person types to resume the run or
clean what a killed run left (``resume_args``, ``clean_command``); and the place's own `vnetbench doctor` and
`vnetbench clean` (``doctor``, ``clean``), with the command-line options that choose it (``add_arguments``,
``from_args``).

A place is one module here and one line in :data:`vnetbench.runner.places.PLACES`.
"""

from __future__ import annotations

import argparse
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # every command builds its parser from the places: they import what runs a scenario on use
    from vnetbench.scenario.load import LoadedScenario
    from vnetbench.scenario.plan import Configuration


class Place(ABC):
    """Where a run's endpoints live (see the module docstring for the order the runner calls these in)."""

    name: str

    @classmethod
    @abstractmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, command: str) -> None:
        """The command-line options that choose this place and say how to reach it, for `command`
        (run, doctor, clean)."""

    @classmethod
    @abstractmethod
    def from_args(cls, args: argparse.Namespace) -> "Place | None":
        """This place, when the command line chose it; None otherwise."""

    @abstractmethod
    def prepare(self, loaded: LoadedScenario, configs: list[Configuration]
                ) -> tuple[list[Configuration], list[dict[str, object]]]:
        """Check what the scenario needs here before anything is stored or started (raises a VnetbenchError
        naming each lack and its fix); the configurations to run, and those left out with the reason (an
        `if_available` environment this place cannot make)."""

    def hold(self, run_id: str, scenario: str) -> None:
        """Take the place's locks for the run (and read what needs them held); raises when another run holds
        one. Nothing to do where the machine's run lock is the place's own (the local lab)."""

    def release(self) -> None:
        """Let the locks go."""

    def facts(self) -> dict[str, Any]:
        """What the run's fingerprint records of the place, beside the controller's own."""
        return {}

    def calibrate(self, run_prefix: str) -> dict[str, Any] | None:
        """The place's machine measured the same way every time (runner/calibration.py), before the run's lab
        is built and after it is gone; None where the place has no calibration yet."""
        return None

    def check_resume(self, fingerprint: dict[str, Any], run_id: str) -> None:
        """A stored run is taken up here: raise when it ran at another place."""

    @abstractmethod
    def bench(self, run_prefix: str, configs: list[Configuration]) -> Any:
        """The run's bench at this place: its endpoints as nodes, its links, servers, trials."""

    @abstractmethod
    def doctor(self, args: argparse.Namespace) -> int:
        """`vnetbench doctor` for this place: what it can do and what is missing, printed; 1 when something
        every run needs is missing."""

    @abstractmethod
    def clean(self, args: argparse.Namespace) -> int:
        """`vnetbench clean` for this place: what killed runs left there removed (`--dry-run`: listed;
        `--check`: exit 1 when anything is left), never what a live run uses."""

    def resume_args(self) -> str:
        """What `vnetbench run --resume RUN` needs after it to come back here ("" for the local lab)."""
        return ""

    def clean_command(self) -> str:
        """What removes what a killed run left at this place."""
        return "vnetbench clean"
