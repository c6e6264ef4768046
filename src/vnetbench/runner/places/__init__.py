"""The places a run can happen (runner/places/base.py says what a place is).

A new place is a module of its own and one line in PLACES: the command line chooses the first place whose
``from_args`` answers; the local lab, last, answers always.
"""

from __future__ import annotations

import argparse

from vnetbench.runner.places.base import Place
from vnetbench.runner.places.hosts import HostsPlace
from vnetbench.runner.places.kube import KubePlace
from vnetbench.runner.places.lab import LabPlace

PLACES: tuple[type[Place], ...] = (
    HostsPlace,
    KubePlace,
    LabPlace,
)


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """Every place's options for `command` (run, doctor, clean)."""
    for place in PLACES:
        place.add_arguments(parser, command)


def from_args(args: argparse.Namespace) -> Place:
    """The place the command line chose."""
    for place in PLACES:
        chosen = place.from_args(args)
        if chosen is not None:
            return chosen
    raise AssertionError("the local lab is always a place")  # LabPlace.from_args never answers None


__all__ = ["PLACES", "Place", "add_arguments", "from_args"]
