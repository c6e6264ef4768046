"""CPU and memory inside the environment (seed 002): sysbench's cpu and memory tests on one endpoint.

The test runs where the endpoint's processes run: in a container's cgroup
(``cpu_quota``, ``cpuset``, ``memory_limit`` apply), in a guest over SSH, or in
a bare namespace; so a container limited to half a CPU measures about half of
bare, and a guest under TCG measures QEMU's software CPU.

- ``cpu``: sysbench's prime-number loop (``--cpu-max-prime``), events per second;
- ``memory``: sequential writes of ``block_size`` blocks, MiB per second.

``tests = ["cpu", "memory"]`` runs them one after the other, ``duration`` each.
With one thread the process is pinned to the endpoint's CPU like every workload;
with more it may use any CPU the endpoint may (a container's cpuset still holds).

::

    [workload.cpu]
    tool = "sysbench"
    tests = ["cpu", "memory"]
    threads = 1
    duration = "10s"
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator

from vnetbench.metrics import HIGHER, Metric
from vnetbench.quantities import Size, WholeSeconds
from vnetbench.tools import SYSBENCH
from vnetbench.workloads.base import Measurement, Started, ToolFailed, TrialContext, Workload, WorkloadOptions
from vnetbench.workloads.registry import register

OVERHEAD_S = 10.0
_EVENTS = re.compile(r"events per second:\s*(?P<v>[0-9.]+)")
_MIB = re.compile(r"(?P<total>[0-9.]+) MiB transferred \((?P<v>[0-9.]+) MiB/sec\)")
_SECTION = "=== vnb: sysbench {} ==="


class Options(WorkloadOptions):
    """sysbench cpu and/or memory on one endpoint."""

    tool: Literal["sysbench"] = "sysbench"
    tests: list[Literal["cpu", "memory"]] = Field(default_factory=lambda: ["cpu"], min_length=1,
                                                  description="which sysbench tests run, one after the other")
    threads: int = Field(default=1, ge=1, le=1024, description="sysbench --threads")
    duration: WholeSeconds = Field(default=10.0, description="seconds per test (whole)")
    on: Literal["receiver", "sender"] = Field(default="receiver", description="the endpoint it runs on")
    cpu_max_prime: int = Field(default=10000, ge=3, le=10_000_000, description="cpu: primes up to this (sysbench "
                                                                               "--cpu-max-prime)")
    block_size: Size = Field(default=1024, description="memory: block size (sysbench --memory-block-size)")

    @field_validator("tests")
    @classmethod
    def _tests(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"{v}: each test once")
        return v


METRICS = (
    Metric("cpu.events_per_s", "1/s", HIGHER, "sysbench cpu: prime-number events per second, over all threads"),
    Metric("memory.write_mib_per_s", "MiB/s", HIGHER, "sysbench memory: sequential write bandwidth"),
)


def command(options: Options) -> list[str]:
    """The tests one after the other, each preceded by a marker line (one process: one output)."""
    parts = []
    for test in options.tests:
        args = [f"--threads={options.threads}", f"--time={int(options.duration)}"]
        if test == "cpu":
            args.append(f"--cpu-max-prime={options.cpu_max_prime}")
        else:
            # a total so large that --time ends the test
            args += [f"--memory-block-size={int(options.block_size)}", "--memory-total-size=1000000G"]
        parts.append(f"echo '{_SECTION.format(test)}'; sysbench {test} {' '.join(args)} run || exit $?")
    return ["sh", "-c", "; ".join(parts)]


def parse(text: str, tests: list[str]) -> dict[str, float]:
    """{test: events/s or MiB/s} from the sectioned output; a missing test's result is a failure."""
    out: dict[str, float] = {}
    sections = re.split(r"^=== vnb: sysbench (cpu|memory) ===$", text, flags=re.M)
    for name, body in zip(sections[1::2], sections[2::2]):
        found = (_EVENTS if name == "cpu" else _MIB).search(body)
        if found:
            out[name] = float(found["v"])
    missing = [t for t in tests if t not in out]
    if missing:
        snippet = " / ".join(x.strip() for x in text.strip().splitlines()[-3:])[-300:] or "(empty output)"
        raise ToolFailed(f"sysbench printed no result for {', '.join(missing)}: {snippet}")
    return out


@register
class Sysbench(Workload):
    tool = "sysbench"
    Options = Options
    requires = (SYSBENCH,)
    metrics = METRICS
    can_accompany = False  # it measures the endpoint's CPU: alone, or it measures the other workload too

    def timing(self, options: Options, config: Any) -> tuple[float, float]:
        return 0.0, float(options.duration * len(options.tests))

    def start(self, name: str, options: Options, ctx: TrialContext) -> Started:
        seconds = options.duration * len(options.tests)
        started = Started(name, measured_s=seconds, ends_by=seconds + OVERHEAD_S * len(options.tests))
        host = ctx.endpoints.receiver if options.on == "receiver" else ctx.endpoints.senders[0]
        started.procs[host.name], started.outputs[host.name] = ctx.popen(host, name, command(options),
                                                                         pin=options.threads == 1)
        return started

    def measure(self, started: Started, options: Options, ctx: TrialContext,
                outputs: dict[str, str]) -> Measurement:
        label, text = next(iter(outputs.items()))
        with started.quoting("sysbench", label):
            got = parse(text, options.tests)
        m = Measurement()
        if "cpu" in got:
            m.add("cpu.events_per_s", got["cpu"])
        if "memory" in got:
            m.add("memory.write_mib_per_s", got["memory"])
        return m
