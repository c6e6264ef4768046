"""Typed models of a scenario file.

A scenario says what lab to build, which parameters to sweep, which workloads to
run on every configuration, and how to repeat them::

    name = "congestion"

    [lab]                       # the testbed
    topology = "dumbbell"
    bottleneck = "100Mbit"
    buffer = "500kB"

    [matrix]                    # every combination is one configuration
    ratio = [0.6, 2.0]
    proto = ["udp", "tcp"]

    [workload.stream]           # the load
    tool = "iperf3"
    offered = "ratio * bottleneck / senders"

    [workload.probe]            # measured during the load
    tool = "ping"
    during = "stream"

    [repeat]
    repetitions = 5

Quantities are parsed here (see :mod:`vnetbench.units`) so the rest of the code
only sees numbers in base units: bits/s, bytes, seconds.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from vnetbench import units
from vnetbench.impair.model import LinkSpec, LossSpec, Schedule, lab_links, short_hand_conflicts

# Largest Ethernet frame at the default MTU; a buffer must hold at least one.
FULL_FRAME_BYTES = 1514
MATRIX_AXES_EXTRA = ("ratio",)


def _rate(v: Any) -> float:
    value = units.parse_rate(v)
    if value <= 0:
        raise ValueError(f"{v!r}: a rate must be positive")
    return value


def _size(v: Any) -> float:
    value = units.parse_size(v)
    if value <= 0:
        raise ValueError(f"{v!r}: a size must be positive")
    return value


def _duration(v: Any) -> float:
    value = units.parse_duration(v)
    if value < 0:
        raise ValueError(f"{v!r}: a duration cannot be negative")
    return value


Rate = Annotated[float, BeforeValidator(_rate)]
Size = Annotated[float, BeforeValidator(_size)]
Duration = Annotated[float, BeforeValidator(_duration)]


class Buffer(BaseModel):
    """A queue limit, in bytes or as time at the link rate ("500kB" or "40ms")."""

    model_config = ConfigDict(frozen=True)
    bytes: float | None = None
    seconds: float | None = None

    @model_validator(mode="before")
    @classmethod
    def _parse(cls, v: Any) -> Any:
        if isinstance(v, (dict, Buffer)):
            return v
        return units.parse_buffer(v)

    def in_bytes(self, rate_bps: float) -> float:
        return self.bytes if self.bytes is not None else self.seconds * rate_bps / 8.0

    def __str__(self) -> str:
        return units.format_size(self.bytes) if self.bytes is not None else units.format_duration(self.seconds)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class LabSpec(Strict):
    """The testbed: a dumbbell whose endpoints attach through an environment.

    ``senders = "auto"`` follows the thesis' algorithms 1 and 2: two senders up
    to ratio 2, three up to ratio 3, four above. ``bottleneck = "unlimited"``
    installs no shaping (environment comparisons measure the path itself).

    ``env`` says how every endpoint (receiver and senders) attaches to the
    switch (see :mod:`vnetbench.lab.environments`); the options after it apply
    to one environment each and are rejected elsewhere. Being lab fields they
    are sweepable; a matrix value that is an inline table sets several at once:
    ``env = [{env="bare"}, {env="vm", nic="e1000"}, {env="overlay", overlay="routed"}]``.
    """

    topology: Literal["dumbbell"] = "dumbbell"
    senders: int | Literal["auto"] = "auto"
    bottleneck: float | None = Field(default=100e6, description="rate of the switch port toward the receiver, "
                                                                "or 'unlimited' (no shaping)")
    mtu: int = Field(default=1500, ge=576, le=9000)
    buffer: Buffer = Field(default_factory=lambda: Buffer(bytes=500_000))
    qdisc: Literal["tbf", "htb"] = "tbf"
    shape: Literal["forward", "reverse", "both"] = "forward"
    ip_version: Literal[4, 6] = 4
    pin_cpus: bool = True
    # Link conditions (vnetbench.impair.model). Short-hands for the "bottleneck" link (the switch port toward
    # the receiver), in the `shape` direction(s); [lab.link.NAME] gives any link conditions per direction.
    delay: Duration = Field(default=0.0, description="one-way delay added on the bottleneck, in each `shape` "
                                                     "direction (forward: the RTT grows by delay)")
    jitter: Duration = Field(default=0.0, description="delay variation on the bottleneck (normal, sd = jitter)")
    loss: LossSpec = Field(default_factory=LossSpec, description="loss on the bottleneck: '1%' (Bernoulli) or "
                                                                 "{model = \"gilbert_elliott\", p = ..., r = ...}")
    backend: Literal["auto", "tbf", "htb", "netem", "userspace"] = Field(
        default="auto", description="who emulates the bottleneck: auto = tbf/htb for rate and buffer alone, netem "
                                    "where the kernel has it, else the userspace emulator vnb-link")
    bottleneck_schedule: str | None = Field(default=None, description="the bottleneck's rate over time: "
                                            "'100Mbit/5s 20Mbit/5s' (repeating) or 'trace:FILE' (Mahimahi)")
    link: dict[str, LinkSpec] = Field(default_factory=dict, description="conditions per link and direction: "
                                      "[lab.link.bottleneck], [lab.link.s1], ... (forward = the stream's way)")
    env: Literal["bare", "container", "vm", "overlay"] = Field(default="bare", description="how endpoints attach")
    offload: Literal["on", "off"] = Field(default="on", description="TSO, GSO, GRO and checksum offload on the "
                                                                    "endpoints' interfaces (host and guest side)")
    overlay: Literal["vxlan", "routed"] | None = Field(default=None, description="env=overlay: VXLAN (Docker "
                                                       "overlay, Flannel, Weave) or routing (Calico); default vxlan")
    nic: Literal["virtio-net", "e1000", "rtl8139"] | None = Field(default=None, description="env=vm: guest NIC "
                                                                   "model; default virtio-net")
    vcpus: int | None = Field(default=None, ge=1, le=64, description="env=vm: guest vCPUs")
    memory: Size | None = Field(default=None, description="env=vm: guest RAM")
    cpu_quota: float | None = Field(default=None, description="env=container: CPU limit, '50%' of one CPU or a "
                                                              "number of CPUs (cgroup cpu.max)")
    cpuset: str | None = Field(default=None, description="env=container: CPUs the container may use, e.g. '1' "
                                                         "or '0-1' (cgroup cpuset.cpus)")
    memory_limit: Size | None = Field(default=None, description="env=container: memory limit (cgroup memory.max)")

    # Which environment each option belongs to.
    ENV_OPTIONS: ClassVar[dict[str, str]] = {
        "overlay": "overlay", "nic": "vm", "vcpus": "vm", "memory": "vm",
        "cpu_quota": "container", "cpuset": "container", "memory_limit": "container",
    }

    @field_validator("bottleneck", mode="before")
    @classmethod
    def _bottleneck(cls, v: Any) -> Any:
        if v is None or (isinstance(v, str) and v.strip().lower() in ("unlimited", "none")):
            return None
        return _rate(v)

    @field_validator("cpu_quota", mode="before")
    @classmethod
    def _cpu_quota(cls, v: Any) -> Any:
        if v is None:
            return None
        text = str(v).strip()
        try:
            cpus = float(text[:-1]) / 100 if text.endswith("%") else float(text)
        except ValueError:
            raise ValueError(f"{v!r} is not a CPU quota: write a percentage of one CPU ('50%') or a number "
                             "of CPUs (1.5)") from None
        if not 0.01 <= cpus <= 1024:
            raise ValueError(f"{v!r}: a CPU quota must be between 1% (0.01) and 1024 CPUs")
        return cpus

    @field_validator("cpuset")
    @classmethod
    def _cpuset(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*", str(v)):
            raise ValueError(f"{v!r} is not a CPU list: write e.g. '1', '0-1' or '0,2'")
        return v

    @model_validator(mode="after")
    def _env_options(self) -> "LabSpec":
        wrong = [f"{k} = {getattr(self, k)!r}" for k, env in self.ENV_OPTIONS.items()
                 if getattr(self, k) is not None and env != self.env]
        if wrong:
            owners = sorted({self.ENV_OPTIONS[w.split(" ")[0]] for w in wrong})
            raise ValueError(
                f"{', '.join(wrong)} {'applies' if len(wrong) == 1 else 'apply'} to env = "
                f"{' / '.join(repr(o) for o in owners)} only, but env = {self.env!r}: remove it, or set it together "
                f"with its environment in one matrix entry, e.g. env = [{{env = \"bare\"}}, "
                f"{{env = \"{owners[0]}\", {wrong[0].replace(' = ', ' = ', 1)}}}]"
            )
        return self

    @field_validator("senders")
    @classmethod
    def _senders(cls, v: Any) -> Any:
        if isinstance(v, int) and not 1 <= v <= 64:
            raise ValueError(f"{v}: senders must be between 1 and 64 (or \"auto\")")
        return v

    @field_validator("link")
    @classmethod
    def _link_names(cls, v: dict[str, LinkSpec]) -> dict[str, LinkSpec]:
        bad = [n for n in v if not re.fullmatch(r"bottleneck|s[1-9][0-9]?", n)]
        if bad:
            raise ValueError(f"no link named {', '.join(map(repr, bad))}: a dumbbell's links are \"bottleneck\" "
                             "(switch -> receiver) and \"s1\", \"s2\", ... (each sender -> switch)")
        return v

    @field_validator("bottleneck_schedule")
    @classmethod
    def _bottleneck_schedule(cls, v: str | None) -> str | None:
        if v is not None and v.strip().lower() not in ("", "none"):
            Schedule.model_validate(Schedule.parse_text(v))
            return v
        return None

    @model_validator(mode="after")
    def _links(self) -> "LabSpec":
        from vnetbench.errors import ScenarioError
        from vnetbench.impair.backends import check_expressible

        defaults = {k: (f.default_factory() if f.default_factory else f.default)
                    for k, f in type(self).model_fields.items()}
        problems = short_hand_conflicts(self, defaults)
        if problems:
            raise ValueError("; ".join(problems))
        for name, spec in lab_links(self).items():
            try:
                check_expressible(spec, where=f"link {name}: ")
            except ScenarioError as e:
                raise ValueError(str(e)) from None
        return self

    @field_validator("buffer")
    @classmethod
    def _buffer_holds_a_packet(cls, v: Buffer, info: ValidationInfo) -> Buffer:
        rate, mtu = info.data.get("bottleneck"), info.data.get("mtu", 1500)
        if rate is None:
            return v  # the bottleneck itself is invalid; that error is reported
        size = v.in_bytes(rate)
        if size < mtu + 14:
            raise ValueError(
                f"{v} is {size:.0f} B at {units.format_rate(rate)}, smaller than one full-size frame "
                f"({mtu + 14} B): nothing could be queued; give at least {units.format_size(mtu + 14)}"
            )
        return v


class FlowTiming(Strict):
    """When one sender's flow runs, relative to the trial's start."""

    start: Duration = 0.0
    duration: Duration | None = None  # None: the stream's duration

    @field_validator("duration")
    @classmethod
    def _whole(cls, v: float | None) -> float | None:
        if v is not None and v < 1:
            raise ValueError(f"{v}s: iperf3 measures in whole seconds; give at least 1s")
        return v


class StreamWorkload(Strict):
    """Bulk flows with iperf3, one per active sender, all to the receiver."""

    tool: Literal["iperf3"] = "iperf3"
    proto: Literal["udp", "tcp"] = "tcp"
    duration: Duration = 10.0
    omit: Duration = 1.0
    ratio: float | None = Field(default=None, description="over-subscription ratio, used by `offered`")
    offered: str = Field(default="unlimited", description="per-sender target rate: a rate, 'unlimited', or an expression")
    congestion_control: str = "cubic"
    length: Size | Literal["auto"] = "auto"
    parallel: int = Field(default=1, ge=1, le=128)
    reverse: bool = False
    timeout: Duration | Literal["auto"] = "auto"
    window: Size | None = Field(default=None, description="socket buffer / window (iperf3 --window): caps TCP at "
                                                          "window / RTT, the thesis' bandwidth-delay-product limit")
    flows: list[FlowTiming] = Field(default_factory=list, description="per sender, in order: when its flow starts "
                                    "and how long it runs, e.g. [{start=\"0s\", duration=\"30s\"}, "
                                    "{start=\"5s\", duration=\"15s\"}] (seed 001's window scaling test)")

    @property
    def span(self) -> float:
        """Seconds from the first flow's start to the last flow's end (omit not counted)."""
        return max([self.duration] + [f.start + (f.duration or self.duration) for f in self.flows])

    def timing(self, sender_index: int) -> tuple[float, float]:
        """(start delay, duration) of the i-th sender's flow."""
        if sender_index < len(self.flows):
            f = self.flows[sender_index]
            return f.start, f.duration or self.duration
        return 0.0, self.duration

    @field_validator("ratio")
    @classmethod
    def _ratio(cls, v: float | None) -> float | None:
        if v is not None and v <= 0:
            raise ValueError(f"{v}: an over-subscription ratio must be above 0")
        return v

    @field_validator("duration")
    @classmethod
    def _duration(cls, v: float) -> float:
        if v < 1:
            raise ValueError(f"{v}s: iperf3 measures in whole seconds; give at least 1s")
        return v

    @field_validator("congestion_control")
    @classmethod
    def _cc(cls, v: str) -> str:
        if not v.isidentifier():
            raise ValueError(f"{v!r} is not a congestion control name (e.g. cubic, reno, bbr)")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "StreamWorkload":
        if self.omit >= self.duration:
            raise ValueError(f"omit ({self.omit:g}s) must be shorter than duration ({self.duration:g}s)")
        if self.timeout != "auto" and self.timeout <= self.span + self.omit:
            raise ValueError(f"timeout ({self.timeout:g}s) must be longer than omit + duration "
                             f"({self.omit + self.span:g}s), or every trial would time out")
        for i, f in enumerate(self.flows):
            if (f.duration or self.duration) <= self.omit:
                raise ValueError(f"flows[{i}] lasts {f.duration or self.duration:g}s, not longer than omit "
                                 f"({self.omit:g}s): "
                                 "it would measure nothing")
        if self.length != "auto" and self.proto == "udp" and not 16 <= self.length <= 65507:
            raise ValueError(f"length {self.length:g} B: a UDP datagram carries 16 to 65507 bytes")
        return self


class ProbeWorkload(Strict):
    """Latency probe with ping while another workload runs."""

    tool: Literal["ping"] = "ping"
    interval: Duration = 0.001
    size: int = Field(default=1450, ge=16, le=65000, description="ICMP payload bytes, as ping -s")
    during: str = "stream"

    @field_validator("interval")
    @classmethod
    def _interval(cls, v: float) -> float:
        if v < 0.0001:
            raise ValueError(f"{v * 1e6:g}us: ping cannot send faster than every 100us")
        return v


class SsWorkload(Strict):
    """TCP state of the stream's flows (cwnd, smoothed RTT, delivery rate,
    retransmissions), sampled with ``ss -ti`` on the sending hosts every
    `interval` while another workload runs (workloads/tcpinfo.py)."""

    tool: Literal["ss"] = "ss"
    interval: Duration = 0.02
    during: str = "stream"

    @field_validator("interval")
    @classmethod
    def _interval(cls, v: float) -> float:
        if not 0.010 - 1e-9 <= v <= 0.100 + 1e-9:
            raise ValueError(f"{v * 1e3:g}ms: ss samples every 10ms to 100ms (each sample is one ss call)")
        return v


Workload = Annotated[StreamWorkload | ProbeWorkload | SsWorkload, Field(discriminator="tool")]


def _fraction(v: Any) -> Any:
    """'5%', '0.05' or 0.05 -> 0.05 (range checked by the field validator)."""
    if v is None or isinstance(v, (int, float)) and not isinstance(v, bool):
        return v
    text = str(v).strip()
    try:
        return float(text[:-1]) / 100.0 if text.endswith("%") else float(text)
    except ValueError:
        raise ValueError(f"{v!r} is not a fraction; write a percentage (\"5%\") or a fraction (0.05)") from None


class RepeatSpec(Strict):
    """How often each configuration runs.

    Fixed: ``repetitions = N`` trials per configuration. Adaptive: with
    ``target_ci`` (e.g. "5%") each configuration repeats, in interleaved
    rounds, until the exact 95% CI of the median of every ``key_metrics``
    entry is narrower than ``target_ci`` of the median, at least ``min`` and
    at most ``max`` times. ``max`` defaults to 20; ``min`` to ``repetitions``
    when the file gives one (a scenario written for a fixed count becomes "at
    least that many"), else 5. A ``repetitions`` outside an explicit min..max
    is a contradiction and an error.
    """

    repetitions: int = Field(default=5, ge=1, le=1000)
    min: int | None = Field(default=None, ge=1, le=1000, description="adaptive: fewest trials per configuration")
    max: int | None = Field(default=None, ge=1, le=1000, description="adaptive: most trials per configuration")
    target_ci: Annotated[float | None, BeforeValidator(_fraction)] = Field(
        default=None, description="adaptive: target relative width of the median's 95% CI, e.g. \"5%\"")
    key_metrics: list[str] = Field(default_factory=lambda: ["throughput.rx_mbps"],
                                   description="adaptive: the metrics whose precision decides when to stop")
    order: Literal["interleaved", "sequential"] = "interleaved"
    seed: int = 1
    warmup: bool = True

    DEFAULT_MIN: ClassVar[int] = 5
    DEFAULT_MAX: ClassVar[int] = 20

    @field_validator("target_ci")
    @classmethod
    def _target(cls, v: float | None) -> float | None:
        if v is not None and not 0 < v < 1:
            raise ValueError(f"{v:g} is not a relative CI width between 0 and 1 (exclusive): write e.g. \"5%\" or 0.05")
        return v

    @field_validator("key_metrics")
    @classmethod
    def _key_metrics(cls, v: list[str]) -> list[str]:
        from vnetbench.metrics import METRICS

        if not v:
            raise ValueError("give at least one key metric, e.g. [\"throughput.rx_mbps\"]")
        unknown = [m for m in v if m not in METRICS]
        if unknown:
            raise ValueError(f"unknown metric(s) {', '.join(unknown)}; known: {', '.join(METRICS)}")
        return list(dict.fromkeys(v))

    @model_validator(mode="after")
    def _consistent(self) -> "RepeatSpec":
        given = self.model_fields_set
        if self.target_ci is None:
            if self.min is not None or self.max is not None:
                raise ValueError(
                    f"min/max ({self.min}..{self.max}) bound adaptive repetition, which also needs target_ci "
                    f"(e.g. target_ci = \"5%\"); for a fixed count give only repetitions = N "
                    f"(now {self.repetitions})")
            return self
        lo, hi = self.n_min, self.n_max
        if lo > hi:
            raise ValueError(f"min ({lo}) is larger than max ({hi}): raise max or lower min")
        if "repetitions" in given and not lo <= self.repetitions <= hi:
            raise ValueError(
                f"repetitions = {self.repetitions} (a fixed count) contradicts target_ci = {100 * self.target_ci:g}%, "
                f"which repeats adaptively between min {lo} and max {hi}: make min <= repetitions <= max "
                f"(e.g. --set repetitions={lo}), "
                "or drop target_ci for a fixed count")
        return self

    @property
    def adaptive(self) -> bool:
        return self.target_ci is not None

    @property
    def n_min(self) -> int:
        """Fewest trials per configuration (the fixed count when not adaptive)."""
        if not self.adaptive:
            return self.repetitions
        if self.min is not None:
            return self.min
        lo = self.repetitions if "repetitions" in self.model_fields_set else self.DEFAULT_MIN
        # (method bodies see the builtins min/max, not the fields of the same name)
        return lo if self.max is None else min(lo, self.max)

    @property
    def n_max(self) -> int:
        """Most trials per configuration (the fixed count when not adaptive)."""
        if not self.adaptive:
            return self.repetitions
        if self.max is not None:
            return self.max
        return max(self.DEFAULT_MAX, self.n_min)


class Scenario(Strict):
    name: str = Field(min_length=1, max_length=80)
    description: str = ""
    lab: LabSpec = Field(default_factory=LabSpec)
    matrix: dict[str, list[Any]] = Field(default_factory=dict)
    workload: dict[str, Workload]
    repeat: RepeatSpec = Field(default_factory=RepeatSpec)

    @field_validator("matrix")
    @classmethod
    def _matrix(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for axis, values in v.items():
            if not values:
                raise ValueError(f"matrix.{axis} is empty: give at least one value")
            if len({repr(x) for x in values}) != len(values):
                raise ValueError(f"matrix.{axis} lists a value twice: {values}")
        return v

    @model_validator(mode="after")
    def _workloads(self) -> "Scenario":
        streams = [n for n, w in self.workload.items() if isinstance(w, StreamWorkload)]
        if len(streams) != 1:
            raise ValueError(f"exactly one iperf3 workload is needed (found {len(streams)}: {streams})")
        for name, w in self.workload.items():
            if isinstance(w, (ProbeWorkload, SsWorkload)) and w.during not in streams:
                raise ValueError(f"workload.{name}.during = {w.during!r} names no iperf3 workload (have {streams})")
        return self

    @property
    def stream(self) -> tuple[str, StreamWorkload]:
        return next((n, w) for n, w in self.workload.items() if isinstance(w, StreamWorkload))

    @property
    def probes(self) -> list[tuple[str, ProbeWorkload]]:
        return [(n, w) for n, w in self.workload.items() if isinstance(w, ProbeWorkload)]

    @property
    def samplers(self) -> list[tuple[str, SsWorkload]]:
        return [(n, w) for n, w in self.workload.items() if isinstance(w, SsWorkload)]
