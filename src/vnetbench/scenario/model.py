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

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from vnetbench import units

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
        try:
            return {"bytes": units.parse_size(v)}
        except units.UnitError:
            pass
        try:
            return {"seconds": units.parse_duration(v)}
        except units.UnitError:
            raise ValueError(
                f"{v!r} is neither a size ({units.SIZE_UNITS}) nor a time at the link rate ({units.DURATION_UNITS})"
            ) from None

    def in_bytes(self, rate_bps: float) -> float:
        return self.bytes if self.bytes is not None else self.seconds * rate_bps / 8.0

    def __str__(self) -> str:
        return units.format_size(self.bytes) if self.bytes is not None else units.format_duration(self.seconds)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class LabSpec(Strict):
    """The testbed. Only the dumbbell exists today; environments come later.

    ``senders = "auto"`` follows the thesis' algorithms 1 and 2: two senders up
    to ratio 2, three up to ratio 3, four above.
    """

    topology: Literal["dumbbell"] = "dumbbell"
    senders: int | Literal["auto"] = "auto"
    bottleneck: Rate = Field(default=100e6, description="rate of the switch port toward the receiver")
    mtu: int = Field(default=1500, ge=576, le=9000)
    buffer: Buffer = Field(default_factory=lambda: Buffer(bytes=500_000))
    qdisc: Literal["tbf", "htb"] = "tbf"
    shape: Literal["forward", "reverse", "both"] = "forward"
    ip_version: Literal[4, 6] = 4
    pin_cpus: bool = True

    @field_validator("senders")
    @classmethod
    def _senders(cls, v: Any) -> Any:
        if isinstance(v, int) and not 1 <= v <= 64:
            raise ValueError(f"{v}: senders must be between 1 and 64 (or \"auto\")")
        return v

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
        if self.timeout != "auto" and self.timeout <= self.duration + self.omit:
            raise ValueError(f"timeout ({self.timeout:g}s) must be longer than omit + duration "
                             f"({self.omit + self.duration:g}s), or every trial would time out")
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


Workload = Annotated[StreamWorkload | ProbeWorkload, Field(discriminator="tool")]


class RepeatSpec(Strict):
    repetitions: int = Field(default=5, ge=1, le=1000)
    order: Literal["interleaved", "sequential"] = "interleaved"
    seed: int = 1
    warmup: bool = True


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
            if isinstance(w, ProbeWorkload) and w.during not in streams:
                raise ValueError(f"workload.{name}.during = {w.during!r} names no iperf3 workload (have {streams})")
        return self

    @property
    def stream(self) -> tuple[str, StreamWorkload]:
        return next((n, w) for n, w in self.workload.items() if isinstance(w, StreamWorkload))

    @property
    def probes(self) -> list[tuple[str, ProbeWorkload]]:
        return [(n, w) for n, w in self.workload.items() if isinstance(w, ProbeWorkload)]
