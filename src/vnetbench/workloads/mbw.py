"""Memory bandwidth inside the environment (seed 002): mbw copies an array ``loops`` times.

Seed 002 used a 300 MB array, ten loops, and the three methods: ``memcpy``
(libc memcpy), ``dumb`` (``b[i] = a[i]``) and ``mcblock`` (memcpy in fixed
blocks). The figure is mbw's own average over the loops, in MiB/s; each loop's
figure is kept as a series. Runs on one endpoint, pinned to its CPU, inside its
cgroup or guest like every workload.

::

    [workload.mem]
    tool = "mbw"
    size = "300MiB"
    loops = 10
    methods = ["memcpy", "dumb", "mcblock"]
"""

from __future__ import annotations

import re
from typing import Any, Literal

import numpy as np
from pydantic import Field, field_validator

from vnetbench.metrics import HIGHER, Metric
from vnetbench.quantities import Size
from vnetbench.tools import MBW
from vnetbench.workloads.base import Measurement, Started, ToolFailed, TrialContext, Workload, WorkloadOptions
from vnetbench.workloads.registry import register

METHOD_FLAG = {"memcpy": "-t0", "dumb": "-t1", "mcblock": "-t2"}
METHOD_NAME = {"memcpy": "MEMCPY", "dumb": "DUMB", "mcblock": "MCBLOCK"}
#: mbw's speed of a loop on this class of machine is GiB/s: a loop over even 1 GiB takes well under a second,
#: so the time limit is generous rather than derived.
SECONDS_PER_GIB_LOOP = 2.0
#: What `plan` expects a copy to take (not a limit): 17-19 GiB/s on bare and in containers on this project's
#: VM (docker-vs-kvm's full run: 30 copies of 300 MiB in 0.7 s); a quarter of that covers slower memory.
EXPECTED_COPY_BYTES_PER_S = 4 * 2**30
_ROW = re.compile(r"^(?P<i>\d+|AVG)\s+Method:\s+(?P<m>\w+)\s+Elapsed:\s+(?P<s>[0-9.]+)\s+MiB:\s+(?P<mib>[0-9.]+)\s+"
                  r"Copy:\s+(?P<v>[0-9.]+|inf) MiB/s")


class Options(WorkloadOptions):
    """mbw on one endpoint."""

    tool: Literal["mbw"] = "mbw"
    size: Size = Field(default=256 * 2**20, description="array size (mbw allocates two of them)")
    loops: int = Field(default=10, ge=1, le=10_000, description="copies per method (mbw -n)")
    methods: list[Literal["memcpy", "dumb", "mcblock"]] = Field(
        default_factory=lambda: ["memcpy"], min_length=1,
        description="memcpy (libc memcpy), dumb (b[i] = a[i]), mcblock (memcpy in fixed blocks)")
    on: Literal["receiver", "sender"] = Field(default="receiver", description="the endpoint it runs on")

    @field_validator("size")
    @classmethod
    def _size(cls, v: float) -> float:
        if v < 2**20 or v > 64 * 2**30:
            raise ValueError(f"{v:g} B: mbw's array is given in whole MiB, 1 MiB to 64 GiB")
        return v

    @field_validator("methods")
    @classmethod
    def _methods(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"{v}: each method once")
        return v

    @property
    def mib(self) -> int:
        return int(self.size // 2**20)


METRICS = tuple(
    Metric(f"memory.mbw_{m}_mib_per_s", "MiB/s", HIGHER, f"mbw {m} copy bandwidth, mbw's average over the loops")
    for m in METHOD_FLAG)


def command(options: Options) -> list[str]:
    flags = [METHOD_FLAG[m] for m in options.methods]
    return ["mbw", "-q", "-n", str(options.loops), *flags, str(options.mib)]


def parse(text: str) -> dict[str, dict[str, Any]]:
    """{method: {"avg": MiB/s, "loops": [MiB/s, ...], "elapsed": [s, ...]}} from mbw's rows."""
    out: dict[str, dict[str, Any]] = {}
    by_name = {v: k for k, v in METHOD_NAME.items()}
    for line in text.splitlines():
        row = _ROW.match(line.strip())
        if not row or row["m"] not in by_name:
            continue
        entry = out.setdefault(by_name[row["m"]], {"avg": None, "loops": [], "elapsed": []})
        value = float(row["v"])
        if row["i"] == "AVG":
            entry["avg"] = value
        else:
            entry["loops"].append(value)
            entry["elapsed"].append(float(row["s"]))
    return out


@register
class Mbw(Workload):
    tool = "mbw"
    Options = Options
    requires = (MBW,)
    metrics = METRICS
    can_accompany = False

    def timing(self, options: Options, config: Any) -> tuple[float, float]:
        return 0.0, options.loops * len(options.methods) * options.size / EXPECTED_COPY_BYTES_PER_S

    def memory_bytes(self, options: Options) -> int:
        return 2 * int(options.size)  # mbw copies one array of `size` into another

    @staticmethod
    def _budget(options: Options) -> float:
        return 10.0 + SECONDS_PER_GIB_LOOP * options.loops * len(options.methods) * max(1.0, options.size / 2**30)

    def start(self, name: str, options: Options, ctx: TrialContext) -> Started:
        started = Started(name, measured_s=0.0, ends_by=self._budget(options))
        host = ctx.endpoints.receiver if options.on == "receiver" else ctx.endpoints.senders[0]
        started.procs[host.name], started.outputs[host.name] = ctx.popen(host, name, command(options))
        return started

    def measure(self, started: Started, options: Options, ctx: TrialContext,
                outputs: dict[str, str]) -> Measurement:
        label, text = next(iter(outputs.items()))
        got = parse(text)
        missing = [m for m in options.methods if not got.get(m) or got[m]["avg"] is None]
        if missing:
            said = started.error_text(label) or text.strip()[-300:] or "(empty output)"
            raise ToolFailed(f"mbw printed no average for {', '.join(missing)}: {said}")
        m = Measurement()
        t = started.measured_from
        for method in options.methods:
            m.add(f"memory.mbw_{method}_mib_per_s", got[method]["avg"])
            # each loop at the time it ended, counting copy time only (mbw's own clock)
            ends = t + np.cumsum(got[method]["elapsed"])
            m.add_series(f"mbw_mib_per_s/{method}", "MiB/s", ends, got[method]["loops"])
            t = float(ends[-1]) if len(ends) else t
        return m
