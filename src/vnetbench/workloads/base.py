"""What every workload driver produces, and the check that its tool is present."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vnetbench.errors import EnvironmentProblem
from vnetbench.metrics import metric
from vnetbench.store.db import SampleRecord, SeriesRecord


@dataclass(frozen=True)
class Tool:
    command: str
    package: str  # the Debian package that provides it
    version_args: tuple[str, ...] = ("--version",)

    def path(self) -> str | None:
        return shutil.which(self.command)

    def version(self) -> str | None:
        exe = self.path()
        if exe is None:
            return None
        try:
            out = subprocess.run([exe, *self.version_args], capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            return None
        text = (out.stdout or out.stderr).strip().splitlines()
        return text[0].strip() if text else None


IPERF3 = Tool("iperf3", "iperf3")
PING = Tool("ping", "iputils-ping", ("-V",))
TASKSET = Tool("taskset", "util-linux", ("--version",))
IP = Tool("ip", "iproute2", ("-V",))
SS = Tool("ss", "iproute2", ("-V",))
ETHTOOL = Tool("ethtool", "ethtool", ("--version",))


def require(tools: list[Tool]) -> None:
    """Fail before anything is built if a tool is missing, naming its package."""
    missing = [t for t in tools if t.path() is None]
    if missing:
        pkgs = sorted({t.package for t in missing})
        names = ", ".join(t.command for t in missing)
        raise EnvironmentProblem(
            f"missing tool{'s' if len(missing) > 1 else ''}: {names}; install with: apt-get install {' '.join(pkgs)}"
        )


@dataclass
class Measurement:
    """A workload's parsed result for one trial."""

    samples: list[SampleRecord] = field(default_factory=list)
    series: list[SeriesRecord] = field(default_factory=list)

    def add(self, name: str, value: float) -> None:
        m = metric(name)
        self.samples.append(SampleRecord(name, float(value), m.unit, m.direction))

    def add_series(self, name: str, unit: str, t: Any, v: Any) -> None:
        self.series.append(SeriesRecord(name, unit, np.asarray(t, dtype=float), np.asarray(v, dtype=float)))

    def extend(self, other: "Measurement") -> None:
        self.samples.extend(other.samples)
        self.series.extend(other.series)


class ToolFailed(Exception):
    """The tool ran but produced no usable result; the message quotes it."""
