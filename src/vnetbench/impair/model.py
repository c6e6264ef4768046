"""Link conditions as data: what one direction of a link does to packets, a
schedule that changes it over time, and which capabilities a request needs.

::

    [lab.link.bottleneck]                  # the switch port toward the receiver
    backend = "auto"                       # auto | tbf | htb | netem | userspace
    forward = {rate = "100Mbit", buffer = "20ms", delay = "15ms", loss = "0.1%"}
    reverse = {delay = "15ms"}
    schedule = "100Mbit/5s 20Mbit/5s"      # or steps, or "trace:FILE" (Mahimahi)

Units are parsed here (:mod:`vnetbench.units`): rates in bit/s, sizes in
bytes, durations in seconds, probabilities as fractions ("1%" = 0.01).

Order of effects on a packet (netem's, and vnb-link's): loss, duplicate,
corrupt, reorder mark, queue (buffer + discipline), serialisation at the rate,
delay + jitter.

A model dumps only the fields that were given (``model_dump`` drops defaults
nobody wrote), so a partial setting, e.g. a schedule step that changes only
the rate, stays partial when a scenario is re-validated after matrix expansion.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Annotated, Any, Iterable, Literal

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer,
                      model_validator)

from vnetbench import limits, quantities, units
from vnetbench.impair.trace import OPPORTUNITY_BYTES, MahimahiTrace, read_mahimahi

DIRECTIONS = ("forward", "reverse")
SCHEDULE_DIRECTIONS = ("forward", "reverse", "both")
# The names a scenario's `backend` can take. Listed here, below the backends (the scenario model validates
# them before any backend module is imported); a backend module registering a name not listed is refused
# (impair/backend.register), so the two cannot drift.
BACKENDS = ("auto", "tbf", "htb", "netem", "userspace")
FRAME_OVERHEAD = 14  # Ethernet header on top of the MTU: a full frame is MTU + 14 bytes
# A queue without a declared size holds as many full frames as Linux's default txqueuelen.
DEFAULT_QUEUE_FRAMES = 1000


def frame_bytes(mtu: int) -> int:
    """A full-size Ethernet frame on a link of this MTU (what a qdisc's byte counters count)."""
    return mtu + FRAME_OVERHEAD


def default_buffer_bytes(mtu: int) -> int:
    """The queue of a link whose conditions declare no buffer."""
    return DEFAULT_QUEUE_FRAMES * frame_bytes(mtu)

MAHIMAHI_OPPORTUNITY_BYTES = OPPORTUNITY_BYTES
MAHIMAHI_MAX_BYTES = limits.TRACE_BYTES.value
#: The compact schedule form: at most this many characters, and steps of at least a millisecond (the
#: emulator's and the kernel's timers do not change a link faster).
SCHEDULE_MAX_TEXT = limits.SCHEDULE_TEXT.value
SCHEDULE_MIN_STEP_S = 1e-3
#: A trial's schedule is unrolled this far past the trial's own seconds (flows end a little late); at most
#: limits.SCHEDULE_STEPS steps in all.
SCHEDULE_MARGIN_S = 5.0


# --------------------------------------------------------------------- parsing


# The kernel's rate qdiscs keep a rate in bytes/s and a queue limit in bytes in 32-bit fields (tbf, htb, bfifo,
# netem's rate): beyond these pyroute2 overflows. The emulator follows the same limits, so that a scenario
# means the same whatever backend realises it; a delay beyond a minute is no network's.
MAX_LINK_RATE_BPS = (2**32 - 1) * 8  # 34.36 Gbit/s
MAX_BUFFER_BYTES = 2**32 - 1
MAX_DELAY_S = 60.0


def link_rate(value: float, text: Any) -> float:
    if value > MAX_LINK_RATE_BPS:
        raise ValueError(f"{units.brief(text)}: a link's rate is at most {units.format_rate(MAX_LINK_RATE_BPS)} (the kernel's "
                         "rate qdiscs count bytes/s in 32 bits); for no shaping write 'unlimited'")
    return value


def buffer_bytes_in_range(size: float, text: Any) -> float:
    if size > MAX_BUFFER_BYTES:
        raise ValueError(f"{text}: a queue holds at most 4 GiB (the kernel's qdiscs count bytes in 32 bits)")
    return size


def _rate(v: Any) -> Any:
    if v is None:
        return None
    if isinstance(v, str) and v.strip().lower() in ("unlimited", "none", "0"):
        return None
    value = units.parse_rate(v)
    if value < 0:
        raise ValueError(f"{units.brief(v)}: a rate cannot be negative")
    return link_rate(value, v) or None


def _delay(v: Any) -> float:
    value = quantities.duration(v)
    if value > MAX_DELAY_S:
        raise ValueError(f"{units.brief(v)}: a delay or jitter is at most {MAX_DELAY_S:g}s")
    return value


def _probability(v: Any) -> Any:
    """'1%', '0.01' or 0.01 -> 0.01; must lie in [0, 1]."""
    if isinstance(v, bool):
        raise ValueError(f"{v!r} is not a probability; write a percentage (\"1%\") or a fraction (0.01)")
    if isinstance(v, (int, float)):
        try:
            value = float(v)
        except OverflowError:  # an integer of hundreds of digits: no probability either
            raise ValueError(f"{units.brief(v)} is not a probability between 0 and 1 (0% and 100%)") from None
    else:
        try:
            value = units.parse_percent(str(v))
        except units.UnitError:
            raise ValueError(f"{units.brief(v)} is not a probability; write a percentage (\"1%\") or a fraction "
                             "(0.01)") from None
    if not 0.0 <= value <= 1.0 or math.isnan(value):
        raise ValueError(f"{units.brief(v)} is not a probability between 0 and 1 (0% and 100%)")
    return value


Rate = Annotated[float | None, BeforeValidator(
    _rate, json_schema_input_type=quantities.WrittenRate | quantities.UnlimitedText)]
Duration = quantities.Duration
Delay = Annotated[float, BeforeValidator(_delay, json_schema_input_type=quantities.WrittenDuration)]
Probability = Annotated[float, BeforeValidator(_probability, json_schema_input_type=quantities.WrittenFraction)]
_Bytes = Annotated[float | None, BeforeValidator(lambda v: None if v is None else units.parse_size(v),
                                                 json_schema_input_type=quantities.WrittenSize)]


class _Partial(BaseModel):
    """Strict, frozen, and dumps only the fields that were given."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_serializer(mode="wrap")
    def _only_given(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if k in self.model_fields_set}
        return data


class LinkBuffer(_Partial):
    """A queue limit in bytes ("500kB") or as time at the link's rate ("20ms")."""

    model_config = ConfigDict(json_schema_extra=quantities.written_also_as(
        {"type": "number", "description": "bytes"}, quantities.text_schema(units.SIZE_PATTERN),
        quantities.text_schema(units.DURATION_PATTERN)))

    bytes: float | None = Field(default=None, description="the limit in bytes")
    seconds: float | None = Field(default=None, description="the limit as a time at the link's rate")

    @model_validator(mode="before")
    @classmethod
    def _parse(cls, v: Any) -> Any:
        if isinstance(v, (dict, LinkBuffer)):
            return v
        return units.parse_buffer(v)

    @model_validator(mode="after")
    def _one(self) -> "LinkBuffer":
        if (self.bytes is None) == (self.seconds is None):
            raise ValueError("a buffer is either bytes or seconds, not both or neither")
        if (self.bytes or 0) < 0 or (self.seconds or 0) < 0:
            raise ValueError("a buffer cannot be negative")
        if self.bytes is not None:
            buffer_bytes_in_range(self.bytes, self)
        return self

    def in_bytes(self, rate_bps: float | None) -> float:
        if self.bytes is not None:
            return self.bytes
        if not rate_bps:
            raise ValueError(f"a buffer of {units.format_duration(self.seconds)} is a time at the link's rate, but "
                             "this direction has no rate: give the buffer in bytes (e.g. \"500kB\") or set a rate")
        return self.seconds * rate_bps / 8.0

    def __str__(self) -> str:
        return units.format_size(self.bytes) if self.bytes is not None else units.format_duration(self.seconds)


QUEUE_KINDS = ("drop_tail", "drop_head", "codel", "red", "pie", "fq")


class QueueSpec(_Partial):
    """The bottleneck queue's discipline, on top of the buffer limit.

    ``"drop_tail"`` (default), ``"drop_head"``, ``"codel"`` (target 5 ms,
    interval 100 ms), ``"red"`` (min, max in bytes, p_max 0.1), ``"pie"``
    (target 15 ms), ``"fq"`` (fair queueing: a FIFO per flow, served by
    deficit round robin a quantum of 1514 bytes at a time, the buffer shared,
    a full buffer dropping from the head of the flow that holds the most; the
    userspace emulator). A string names the kind with its defaults; a table sets
    parameters: ``queue = {kind = "codel", target = "2ms"}``.
    """

    model_config = ConfigDict(json_schema_extra=quantities.written_also_as(
        quantities.text_schema(units.any_case(*QUEUE_KINDS, "droptail", "drophead")),
        spelled={"kind": units.any_case(*QUEUE_KINDS, "droptail", "drophead")}))

    kind: Literal["drop_tail", "drop_head", "codel", "red", "pie", "fq"] = Field(default="drop_tail",
                                                                                  description="the discipline")
    target: Duration | None = Field(default=None, description="codel (5 ms) and pie (15 ms): the target delay")
    interval: Duration | None = Field(default=None, description="codel: its interval (100 ms)")
    min: _Bytes = Field(default=None, description="red: the average queue (bytes) where dropping starts (required)")
    max: _Bytes = Field(default=None, description="red: the average queue (bytes) where dropping reaches p_max "
                        "(required)")
    p_max: Probability | None = Field(default=None, description="red: the drop probability at max (0.1)")
    quantum: _Bytes = Field(default=None, description="fq: the bytes a flow may send in its turn (1514: a "
                            "full frame), 64 B to 64 KiB")

    @model_validator(mode="before")
    @classmethod
    def _parse(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = {"kind": v}
        if isinstance(v, dict) and isinstance(v.get("kind"), str):
            v = {**v, "kind": v["kind"].strip().lower().replace("-", "_").replace("droptail", "drop_tail")
                 .replace("drophead", "drop_head")}
        return v

    @model_validator(mode="after")
    def _params_fit_kind(self) -> "QueueSpec":
        allowed = {"drop_tail": set(), "drop_head": set(), "codel": {"target", "interval"},
                   "red": {"min", "max", "p_max"}, "pie": {"target"}, "fq": {"quantum"}}[self.kind]
        extra = sorted(k for k in ("target", "interval", "min", "max", "p_max", "quantum")
                       if getattr(self, k) is not None and k not in allowed)
        if extra:
            raise ValueError(f"queue kind {self.kind!r} takes no {', '.join(extra)}"
                             + (f" (its parameters: {', '.join(sorted(allowed))})" if allowed else ""))
        if self.kind == "red":
            if self.min is None or self.max is None:
                raise ValueError("a RED queue needs min and max (average queue thresholds in bytes), "
                                 "e.g. queue = {kind = \"red\", min = \"30kB\", max = \"90kB\"}")
            if not self.min < self.max:
                raise ValueError(f"RED min ({self.min:g} B) must be below max ({self.max:g} B)")
        for k in ("target", "interval"):
            if getattr(self, k) is not None and getattr(self, k) <= 0:
                raise ValueError(f"queue {k} must be positive")
        if self.quantum is not None and not 64 <= self.quantum <= 65536:
            raise ValueError(f"fq quantum {self.quantum:g} B: give 64 B to 64 KiB (a full frame, 1514 B, is usual)")
        return self


LOSS_MODELS = ("none", "bernoulli", "gilbert_elliott")
LOSS_MODEL_ALIASES = {"ge": "gilbert_elliott", "gemodel": "gilbert_elliott", "gilbert": "gilbert_elliott",
                      "random": "bernoulli"}


NETEM_CORRELATION_DRAWS = 400_000


@functools.lru_cache(maxsize=256)
def correlated_rate(p: float, correlation: float) -> float:
    """How often netem's correlated draw falls below `p`: the rate of a `loss P C` or `reorder P C`.

    netem (get_crandom) draws 32-bit values, each ``(fresh * (2^32 - rho) + last * rho) >> 32`` with ``rho =
    C * (2^32 - 1) + 1``: an average of uniform values, no longer uniform itself, so far below a small p less
    often than p. By this very arithmetic `loss 1% 25%` loses 0.0005 % of packets, `loss 10% 50%` 0.11 %,
    `loss 25% 50%` 7 %; only p = 50 % keeps its rate. For bursty loss at a given rate, Gilbert-Elliott is the
    model that works. The userspace emulator draws the same way; both are checked against this rate, computed
    here by running netem's arithmetic (400,000 draws, fixed seed)."""
    if correlation <= 0 or p <= 0 or p >= 1:
        return p
    import numpy as np

    fresh = np.random.default_rng(20260101).integers(0, 1 << 32, NETEM_CORRELATION_DRAWS, dtype=np.uint64)
    rho = int(correlation * 0xFFFFFFFF) + 1
    threshold = int(p * 0xFFFFFFFF)
    last, hits = int(fresh[0]), 0
    keep, weight = (1 << 32) - rho, rho
    for value in fresh[1:].tolist():
        last = (value * keep + last * weight) >> 32
        hits += last <= threshold
    return hits / (NETEM_CORRELATION_DRAWS - 1)


class LossSpec(_Partial):
    """Packet loss at ingress: none, Bernoulli, or Gilbert-Elliott.

    ``loss = "1%"`` (Bernoulli), ``loss = {model = "gilbert_elliott", p = "1%",
    r = "30%", loss_bad = "100%", loss_good = "0%"}``: p is Good->Bad, r
    Bad->Good, loss_bad (netem's 1-h) and loss_good (1-k) the loss
    probabilities in each state, as netem's ``gemodel p r 1-h 1-k``.
    """

    model_config = ConfigDict(json_schema_extra=quantities.written_also_as(
        {"type": "number", "minimum": 0, "maximum": 1}, quantities.text_schema(units.PERCENT_PATTERN),
        quantities.text_schema(units.any_case("none", "off")),
        spelled={"model": units.any_case(*LOSS_MODELS, *LOSS_MODEL_ALIASES)}))

    model: Literal["none", "bernoulli", "gilbert_elliott"] = Field(default="none", description="the loss model")
    p: Probability = Field(default=0.0, description="bernoulli: the loss probability; gilbert_elliott: Good->Bad")
    r: Probability | None = Field(default=None, description="gilbert_elliott: Bad->Good (required there)")
    loss_bad: Probability = Field(default=1.0, description="gilbert_elliott: loss probability in the Bad state "
                                  "(netem's 1-h)")
    loss_good: Probability = Field(default=0.0, description="gilbert_elliott: loss probability in the Good state "
                                   "(netem's 1-k)")
    correlation: Probability = Field(default=0.0, description="bernoulli: netem's correlation (`loss 1% 25%`): each "
                                     "draw is this much of the previous draw and the rest a fresh one. As in netem, "
                                     "it also lowers the loss rate below p (expected_rate gives the rate it makes)")

    @model_validator(mode="before")
    @classmethod
    def _parse(cls, v: Any) -> Any:
        if v is None:
            return {"model": "none"}
        if isinstance(v, str) and v.strip().lower() in ("none", "off"):
            return {"model": "none"}
        if isinstance(v, (int, float, str)) and not isinstance(v, bool):
            p = _probability(v)
            return {"model": "bernoulli", "p": p} if p > 0 else {"model": "none"}
        if isinstance(v, dict) and isinstance(v.get("model"), str):
            name = v["model"].strip().lower().replace("-", "_")
            name = LOSS_MODEL_ALIASES.get(name, name)
            v = {**v, "model": name}
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "LossSpec":
        if self.model == "gilbert_elliott" and self.r is None:
            raise ValueError("Gilbert-Elliott loss needs r (Bad->Good transition probability) as well as p")
        if self.model != "gilbert_elliott" and ({"r", "loss_bad", "loss_good"} & self.model_fields_set):
            raise ValueError(f"r, loss_bad and loss_good belong to model = \"gilbert_elliott\", not {self.model!r}")
        if self.correlation > 0 and self.model != "bernoulli":
            raise ValueError(f"correlation belongs to model = \"bernoulli\" (netem's `loss random P C`), not "
                             f"{self.model!r}: Gilbert-Elliott's states are its correlation")
        return self

    @property
    def active(self) -> bool:
        if self.model == "bernoulli":
            return self.p > 0
        if self.model == "gilbert_elliott":
            return self.loss_bad > 0 or self.loss_good > 0
        return False

    def mean_loss(self) -> float:
        """Long-run loss probability (the GE chain's stationary mix; a correlated Bernoulli's rate as netem's
        correlated draws make it, :func:`correlated_rate`)."""
        if self.model == "bernoulli":
            return correlated_rate(self.p, self.correlation)
        if self.model == "gilbert_elliott":
            r = self.r or 0.0
            bad = self.p / (self.p + r) if self.p + r > 0 else 0.0
            return bad * self.loss_bad + (1 - bad) * self.loss_good
        return 0.0


CAPABILITY_TEXT = {
    "rate": "a rate limit",
    "buffer": "a buffer limit",
    "overhead": "per-frame overhead bytes",
    "delay": "delay",
    "jitter": "jitter",
    "jitter:pareto": "Pareto jitter",
    "jitter:paretonormal": "Pareto-normal jitter",
    "loss": "random loss",
    "loss:gilbert_elliott": "Gilbert-Elliott loss",
    "reorder": "reordering",
    "loss:correlation": "correlated loss (netem's `loss P C`)",
    "reorder:correlation": "correlated reordering (netem's `reorder P C`)",
    "duplicate": "duplication",
    "corrupt": "corruption",
    "queue:drop_head": "a drop-head queue",
    "queue:codel": "a CoDel queue",
    "queue:red": "a RED queue",
    "queue:pie": "a PIE queue",
    "queue:fq": "a fair queue (a FIFO per flow, round robin)",
    "schedule": "a schedule (conditions that change during a trial)",
    "trace": "a Mahimahi rate trace",
}


class LinkConditions(_Partial):
    """What one direction of a link does to packets. Nothing given: a plain wire."""

    rate: Rate = Field(default=None, description="bottleneck rate, e.g. \"100Mbit\"; none = line speed")
    buffer: LinkBuffer | None = Field(default=None, description="queue limit: bytes, or time at the rate")
    queue: QueueSpec = Field(default_factory=QueueSpec, description="queue discipline")
    delay: Delay = Field(default=0.0, description="one-way propagation delay")
    jitter: Delay = Field(default=0.0, description="delay variation: the standard deviation (normal, pareto, "
                                                      "paretonormal) or half-width (uniform)")
    distribution: Literal["normal", "uniform", "pareto", "paretonormal"] = Field(
        default="normal", description="the jitter's distribution")
    jitter_reorders: bool = Field(default=False, description="false: packets keep their order (a packet never "
                                                             "leaves before the one ahead of it)")
    loss: LossSpec = Field(default_factory=LossSpec, description="packet loss: \"1%\" (Bernoulli) or a "
                           "Gilbert-Elliott table")
    reorder: Probability = Field(default=0.0, description="probability a packet skips the delay (netem reorder)")
    reorder_correlation: Probability = Field(default=0.0, description="netem's correlation of the reorder draws "
                                             "(`reorder 25% 50%`); as in netem it also lowers the rate below "
                                             "reorder (see loss's correlation)")
    duplicate: Probability = Field(default=0.0, description="probability a packet is sent twice")
    corrupt: Probability = Field(default=0.0, description="probability of one flipped bit after the Ethernet header")
    overhead: int = Field(default=0, ge=0, le=1000, description="bytes added per frame for serialisation only "
                                                                "(24 = preamble + IFG + FCS)")

    @model_validator(mode="after")
    def _consistent(self) -> "LinkConditions":
        if self.buffer is not None and self.buffer.seconds is not None and not self.rate \
                and "rate" in self.model_fields_set:
            raise ValueError(f"buffer = {self.buffer} is a time at the link's rate, but rate is unlimited: "
                             "give the buffer in bytes")
        if self.buffer is not None and self.buffer.seconds is not None and self.rate:
            buffer_bytes_in_range(self.buffer.in_bytes(self.rate), f"buffer = {self.buffer} at "
                                                                   f"{units.format_rate(self.rate)}")
        return self

    def given(self) -> set[str]:
        return set(self.model_fields_set)

    def is_plain(self) -> bool:
        """True when this direction changes nothing."""
        return not self.needs()

    def needs(self) -> set[str]:
        """Capabilities this direction uses (see CAPABILITY_TEXT)."""
        out: set[str] = set()
        if self.rate:
            out.add("rate")
        if self.buffer is not None:
            out.add("buffer")
        if self.overhead:
            out.add("overhead")
        if self.queue.kind != "drop_tail":
            out.add(f"queue:{self.queue.kind}")
        if self.delay > 0:
            out.add("delay")
        if self.jitter > 0:
            out.add("jitter")
            if self.distribution in ("pareto", "paretonormal"):
                out.add(f"jitter:{self.distribution}")
        if self.loss.active:
            out.add("loss:gilbert_elliott" if self.loss.model == "gilbert_elliott" else "loss")
            if self.loss.correlation > 0:
                out.add("loss:correlation")
        if self.reorder > 0 and self.reorder_correlation > 0:
            out.add("reorder:correlation")
        for k in ("reorder", "duplicate", "corrupt"):
            if getattr(self, k) > 0:
                out.add(k)
        return out

    def buffer_bytes(self, rate_bps: float | None = None) -> float | None:
        if self.buffer is None:
            return None
        return self.buffer.in_bytes(rate_bps if rate_bps is not None else self.rate)

    def merged(self, other: "LinkConditions") -> "LinkConditions":
        """These conditions with every field `other` gives replaced."""
        data = {k: getattr(self, k) for k in self.model_fields_set}
        data.update({k: getattr(other, k) for k in other.model_fields_set})
        return LinkConditions.model_validate(data)

    def describe(self) -> str:
        """One line, as a person would write it: 'rate 100Mbit, buffer 20ms, delay 15ms'."""
        parts = []
        if self.rate:
            parts.append(f"rate {units.format_rate(self.rate)}")
        if self.buffer is not None:
            parts.append(f"buffer {self.buffer}")
        if self.queue.kind != "drop_tail":
            parts.append(f"queue {self.queue.kind}")
        if self.delay:
            parts.append(f"delay {units.format_duration(self.delay)}")
        if self.jitter:
            parts.append(f"jitter {units.format_duration(self.jitter)} {self.distribution}"
                         + (" (reorders)" if self.jitter_reorders else ""))
        if self.loss.active:
            if self.loss.correlation > 0:
                parts.append(f"loss {self.loss.model} {100 * self.loss.p:.3g}% correlation "
                             f"{100 * self.loss.correlation:.3g}% (rate {100 * self.loss.mean_loss():.3g}%)")
            else:
                parts.append(f"loss {self.loss.model} {100 * self.loss.mean_loss():.3g}%")
        for k in ("reorder", "duplicate", "corrupt"):
            if getattr(self, k):
                parts.append(f"{k} {100 * getattr(self, k):.3g}%")
                if k == "reorder" and self.reorder_correlation > 0:
                    parts[-1] += f" correlation {100 * self.reorder_correlation:.3g}%"
        return ", ".join(parts) or "plain"


# -------------------------------------------------------------------- schedule


class ScheduleStep(_Partial):
    """At time `at` (from the start of the trial's flows), change the given fields."""

    at: Duration = Field(description="when, from the start of the trial's flows")
    forward: LinkConditions | None = Field(default=None, description="what changes in the forward direction")
    reverse: LinkConditions | None = Field(default=None, description="what changes in the reverse direction")
    both: LinkConditions | None = Field(default=None, description="what changes in both (a direction's own keys "
                                        "win)")

    def for_direction(self, direction: str) -> LinkConditions | None:
        parts = [p for p in (self.both, getattr(self, direction)) if p is not None]
        if not parts:
            return None
        out = parts[0]
        for p in parts[1:]:
            out = out.merged(p)
        return out


_CYCLE_ITEM = re.compile(r"^\s*(?P<rate>[^/\s]+)\s*/\s*(?P<dur>[^/\s]+)\s*$")


def mahimahi_mean_rate(trace: MahimahiTrace) -> float:
    """Average rate of a looping trace, bit/s."""
    return trace.mean_rate


class Schedule(_Partial):
    """Conditions that change during a trial.

    - steps: ``[{at = "5s", forward = {rate = "20Mbit"}}, {at = "10s", forward = {rate = "100Mbit"}}]``
    - repeating: the same with ``every = "10s"`` (steps' times within one period)
    - compact rate cycle: ``"100Mbit/5s 20Mbit/5s"`` (rate for a time, repeating)
    - a Mahimahi trace for the rate: ``"trace:path/to/file"`` or ``{trace = "file"}``

    `direction` says where the compact and trace forms apply (forward by
    default). Times count from the start of the trial's flows.
    """

    model_config = ConfigDict(json_schema_extra=quantities.written_also_as(
        lambda table: {**table["properties"]["steps"], "description": "the steps alone"},
        {"type": "string", "description": "a rate cycle \"100Mbit/5s 20Mbit/5s\" or \"trace:FILE\""},
        keys={"cycle": {"type": "string", "description": "a rate cycle, \"100Mbit/5s 20Mbit/5s\", in `direction`"}}))

    steps: list[ScheduleStep] = Field(default_factory=list, description="changes at given times, in time order")
    every: Duration | None = Field(default=None, description="repeat the steps with this period")
    trace: str | None = Field(default=None, description="a Mahimahi trace file for the rate (a regular file of at "
                              "most 64 MiB)")
    direction: Literal[SCHEDULE_DIRECTIONS] = Field(  # type: ignore[valid-type]
        default="forward", description="where the compact and trace forms apply")

    @model_validator(mode="before")
    @classmethod
    def _parse(cls, v: Any) -> Any:
        if isinstance(v, list):
            return {"steps": v}
        if isinstance(v, str):
            return cls.parse_text(v)
        if isinstance(v, dict) and isinstance(v.get("cycle"), str):
            parsed = cls.parse_text(v["cycle"], v.get("direction", "forward"))
            return {**{k: x for k, x in v.items() if k != "cycle"}, **parsed}
        return v

    @staticmethod
    def parse_text(text: str, direction: Any = "forward") -> dict[str, Any]:
        if not isinstance(direction, str) or direction not in SCHEDULE_DIRECTIONS:  # a table is no direction
            raise ValueError(f"direction = {units.brief(direction)}: a schedule applies in one of "
                             f"{', '.join(SCHEDULE_DIRECTIONS)}")
        t = text.strip()
        if t.lower().startswith("trace:"):
            return {"trace": t[6:].strip(), "direction": direction}
        if len(t) > SCHEDULE_MAX_TEXT:
            raise ValueError(f"a schedule of {len(t):,} characters: write at most {SCHEDULE_MAX_TEXT:,}, or give "
                             "the rates as a Mahimahi trace (\"trace:FILE\")")
        # "100Mbit / 5s, 20Mbit/5s": spaces around "/" go first, then items are split at commas and spaces
        # (two linear passes; a lookahead split here was cubic on a long run of separators)
        items = [x for x in re.split(r"[,\s]+", re.sub(r"\s*/\s*", "/", t)) if x]
        steps, at = [], 0.0
        for item in items:
            m = _CYCLE_ITEM.match(item)
            if not m:
                raise ValueError(f"schedule {units.brief(text)}: {units.brief(item)} is not RATE/TIME; write e.g. \"100Mbit/5s 20Mbit/5s\" "
                                 "(each rate for its time, repeating), a list of steps, or \"trace:FILE\"")
            try:
                rate = units.parse_rate(m["rate"])
                dur = units.parse_duration(m["dur"])
            except units.UnitError as e:
                raise ValueError(f"schedule {units.brief(text)}: {e}") from None
            if dur < SCHEDULE_MIN_STEP_S:
                raise ValueError(f"schedule {units.brief(text)}: {units.brief(item)} lasts {units.format_duration(dur)}: a step "
                                 "lasts at least 1ms")
            steps.append({"at": at, direction: {"rate": rate}})
            at += dur
        if not steps:
            raise ValueError(f"schedule {units.brief(text)} is empty")
        return {"steps": steps, "every": at, "direction": direction}

    @model_validator(mode="after")
    def _consistent(self) -> "Schedule":
        if self.trace is not None:
            read_mahimahi(self.trace)  # fail at validation, naming the file and line
        times = [s.at for s in self.steps]
        if times != sorted(times):
            raise ValueError(f"schedule steps must be in time order (have {', '.join(f'{t:g}s' for t in times)})")
        if self.every is not None:
            if self.every <= 0:
                raise ValueError("schedule every must be positive")
            if self.every < SCHEDULE_MIN_STEP_S:  # `every = "1us"` unrolled a million steps per second of trial
                raise ValueError(f"every = {units.format_duration(self.every)}: a schedule repeats at most every "
                                 f"{units.format_duration(SCHEDULE_MIN_STEP_S)} (the emulator's and the kernel's "
                                 "timers do not change a link faster): make it longer")
            if any(t >= self.every for t in times):
                raise ValueError(f"with every = {self.every:g}s each step's time must lie within one period "
                                 f"(0 <= at < {self.every:g}s)")
        if not self.steps and self.trace is None:
            raise ValueError("a schedule needs steps or a trace")
        return self

    def needs(self) -> set[str]:
        out = {"schedule"} if self.steps else set()
        if self.trace:
            out.add("trace")
        for s in self.steps:
            for d in (s.forward, s.reverse, s.both):
                if d is not None:
                    out |= d.needs()
        return out

    def unrolled(self, until: float) -> float:
        """How many steps `expand(until)` gives at most, without making them (a float: `every = "1ns"` over
        a day is more than an int should be asked to count)."""
        if self.every is None:
            return float(len(self.steps))
        return (math.floor(until / self.every) + 1.0) * len(self.steps) if until / self.every < 1e15 else math.inf

    def too_long(self, until: float) -> str | None:
        """Why unrolling this schedule up to `until` seconds is refused (over limits.SCHEDULE_STEPS), or None."""
        count = self.unrolled(until)
        if count <= limits.SCHEDULE_STEPS.value:
            return None
        many = f"{count:,.0f}" if math.isfinite(count) else "countless"
        period = f" every {units.format_duration(self.every)}" if self.every is not None else ""
        return (f"{len(self.steps):,} step{'s' if len(self.steps) != 1 else ''}{period} over a trial of "
                f"{units.format_duration(until)} (with its margin) are {many} steps, over {limits.SCHEDULE_STEPS}: "
                "make the steps longer or fewer, or the trial shorter")

    def expand(self, until: float) -> list[ScheduleStep]:
        """The steps in time order up to `until` seconds (repeating ones unrolled)."""
        problem = self.too_long(until)
        if problem is not None:  # `plan` refuses it first; this keeps a trial from unrolling it whatever calls
            raise ValueError(f"schedule: {problem}")
        if self.every is None:
            return [s for s in self.steps if s.at <= until]
        out = []
        base = 0.0
        while base <= until:
            for s in self.steps:
                t = base + s.at
                if t > until:
                    break
                if t == 0 and base == 0:
                    out.append(s)
                else:
                    out.append(s.model_copy(update={"at": t}))
            base += self.every
        return out

    def initial(self, direction: str) -> LinkConditions | None:
        """What a step at time 0 sets in `direction` (it holds from the start)."""
        zero = [s for s in self.steps if s.at == 0]
        out = None
        for s in zero:
            c = s.for_direction(direction)
            if c is not None:
                out = c if out is None else out.merged(c)
        return out

    def trace_directions(self) -> tuple[str, ...]:
        if self.trace is None:
            return ()
        return DIRECTIONS if self.direction == "both" else (self.direction,)

    def describe(self) -> str:
        if self.trace:
            return f"trace {self.trace} ({self.direction})"
        if self.every is not None and all(s.for_direction(self.direction if self.direction != "both" else "forward")
                                          is not None for s in self.steps):
            d = self.direction if self.direction != "both" else "forward"
            parts = []
            for i, s in enumerate(self.steps):
                end = self.steps[i + 1].at if i + 1 < len(self.steps) else self.every
                c = s.for_direction(d)
                parts.append(f"{c.describe()} for {units.format_duration(end - s.at)}")
            return "repeat: " + "; ".join(parts)
        return f"{len(self.steps)} steps"


# ----------------------------------------------------------------- one link


class LinkSpec(_Partial):
    """Conditions on one link of the lab, per direction, and who realises them.

    `forward` is the direction of the stream's data (toward the receiver),
    `reverse` the way back (ACKs, ping replies). `both` is a short-hand merged
    under each direction (a direction's own keys win).
    """

    model_config = ConfigDict(json_schema_extra=quantities.written_also_as(keys={"both": lambda table: {
        **table["properties"]["forward"], "description": "conditions merged under forward and reverse"}}))

    backend: Literal[BACKENDS] = Field(  # type: ignore[valid-type]
        default="auto", description="who realises the conditions: auto = tbf/htb for rate and buffer alone, netem "
        "where the kernel has it, else the userspace emulator vnb-link")
    forward: LinkConditions = Field(default_factory=LinkConditions, description="the stream's direction "
                                    "(toward the receiver)")
    reverse: LinkConditions = Field(default_factory=LinkConditions, description="the way back (ACKs, ping "
                                    "replies)")
    schedule: Schedule | None = Field(default=None, description="conditions that change during a trial")
    seed: int = Field(default=1, ge=0, le=2**63 - 1, description="seed of the loss/jitter/... random streams")

    @model_validator(mode="before")
    @classmethod
    def _both(cls, v: Any) -> Any:
        if isinstance(v, dict) and "both" in v:
            v = dict(v)
            both = v.pop("both") or {}
            if not isinstance(both, dict):
                raise ValueError("both must be a table of link conditions, e.g. both = {delay = \"5ms\"}")
            for d in DIRECTIONS:
                own = v.get(d) or {}
                if isinstance(own, LinkConditions):
                    own = {k: getattr(own, k) for k in own.model_fields_set}
                if not isinstance(own, dict):  # merged under `both`, so it must be a table too
                    raise ValueError(f"{d} = {units.brief(own)} must be a table of link conditions, as both is, "
                                     f"e.g. {d} = {{rate = \"100Mbit\"}}")
                v[d] = {**both, **own}
        return v

    def direction(self, name: str) -> LinkConditions:
        return self.forward if name == "forward" else self.reverse

    def needs(self) -> set[str]:
        out = self.forward.needs() | self.reverse.needs()
        if self.schedule is not None:
            out |= self.schedule.needs()
        return out

    def is_plain(self) -> bool:
        return not self.needs()

    def describe(self) -> str:
        parts = [f"{d}: {self.direction(d).describe()}" for d in DIRECTIONS if not self.direction(d).is_plain()]
        if self.schedule is not None:
            parts.append(f"schedule: {self.schedule.describe()}")
        return "; ".join(parts) or "plain"

    def request(self) -> dict[str, Any]:
        """The request as data, for the record (base units)."""
        return self.model_dump(mode="json")

    def reversed(self) -> "LinkSpec":
        """The same link seen from its other end: what it does forward is what this does in reverse (a flow
        that crosses a link from its b end to its a end meets the link's reverse conditions on the way)."""
        schedule = self.schedule
        if schedule is not None:
            swap = {"forward": "reverse", "reverse": "forward"}
            schedule = schedule.model_copy(update={
                "steps": [step.model_copy(update={"forward": step.reverse, "reverse": step.forward})
                          for step in schedule.steps],
                "direction": swap.get(schedule.direction, schedule.direction)})
        return self.model_copy(update={"forward": self.reverse, "reverse": self.forward, "schedule": schedule})


# ------------------------------------------------- lab-level short-hands


def shaped_directions(shape: str) -> tuple[str, ...]:
    return DIRECTIONS if shape == "both" else (shape,)


def bottleneck_from_lab(lab: Any) -> LinkSpec:
    """The link named "bottleneck" from a LabSpec: its short-hands (bottleneck,
    buffer, delay, jitter, loss, backend, bottleneck_schedule, in the `shape`
    direction(s)) with ``[lab.link.bottleneck]`` on top (its keys win)."""
    explicit: LinkSpec | None = (getattr(lab, "link", None) or {}).get("bottleneck")
    short: dict[str, Any] = {}
    rate = getattr(lab, "bottleneck", None)
    if rate:
        short["rate"] = rate
        short["buffer"] = LinkBuffer(bytes=lab.buffer.in_bytes(rate))
    if getattr(lab, "delay", 0):
        short["delay"] = lab.delay
    if getattr(lab, "jitter", 0):
        short["jitter"] = lab.jitter
    loss = getattr(lab, "loss", None)
    if loss is not None and loss.active:
        short["loss"] = loss
    data: dict[str, Any] = {}
    for d in DIRECTIONS:
        own = explicit.direction(d) if explicit is not None else LinkConditions()
        base = LinkConditions.model_validate(short) if d in shaped_directions(lab.shape) else LinkConditions()
        data[d] = base.merged(own)
    backend = explicit.backend if explicit is not None and "backend" in explicit.model_fields_set \
        else getattr(lab, "backend", "auto")
    data["backend"] = backend
    schedule = explicit.schedule if explicit is not None and explicit.schedule is not None else None
    text = getattr(lab, "bottleneck_schedule", None)
    if schedule is None and text:
        parsed = Schedule.parse_text(text, lab.shape) if isinstance(text, str) else text
        schedule = Schedule.model_validate(parsed)
    if schedule is not None:
        data["schedule"] = schedule
    if explicit is not None and "seed" in explicit.model_fields_set:
        data["seed"] = explicit.seed
    return LinkSpec.model_validate(data)


def short_hand_conflicts(lab: Any, defaults: dict[str, Any]) -> list[str]:
    """Short-hands given a non-default value that `[lab.link.bottleneck]` sets too
    in a shaped direction: one of them would be silently ignored."""
    explicit: LinkSpec | None = (getattr(lab, "link", None) or {}).get("bottleneck")
    if explicit is None:
        return []
    pairs = {"bottleneck": "rate", "buffer": "buffer", "delay": "delay", "jitter": "jitter", "loss": "loss"}
    out = []
    for short, key in pairs.items():
        value = getattr(lab, short, None)
        if value is None or same_value(value, defaults.get(short)):
            continue
        for d in shaped_directions(lab.shape):
            if key in explicit.direction(d).model_fields_set:
                out.append(f"lab.{short} and lab.link.bottleneck.{d}.{key} both set the bottleneck's {d} {key}: "
                           f"keep one")
    if getattr(lab, "bottleneck_schedule", None) and explicit.schedule is not None:
        out.append("lab.bottleneck_schedule and lab.link.bottleneck.schedule both give a schedule: keep one")
    if getattr(lab, "backend", "auto") != "auto" and "backend" in explicit.model_fields_set \
            and explicit.backend != lab.backend:
        out.append(f"lab.backend = {lab.backend!r} and lab.link.bottleneck.backend = {explicit.backend!r} disagree: "
                   "keep one")
    return out


def same_value(a: Any, b: Any) -> bool:
    """Equal as values: two models by their fields."""
    if isinstance(a, BaseModel) and isinstance(b, BaseModel):
        return a.model_dump() == b.model_dump()
    return a == b


def capability_list(needs: Iterable[str]) -> str:
    items = [CAPABILITY_TEXT.get(n, n) for n in sorted(needs)]
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def lab_links(lab: Any) -> dict[str, LinkSpec]:
    """Every link of a LabSpec that has conditions (or a named backend), by name;
    "bottleneck" always (it carries the lab-level short-hands)."""
    out = {"bottleneck": bottleneck_from_lab(lab)}
    for name, spec in (getattr(lab, "link", None) or {}).items():
        if name != "bottleneck":
            out[name] = spec
    return out


def slowest_rate(lab: Any) -> float | None:
    """The lowest rate (bits/s) any of the lab's links is limited to, either direction, any step of a schedule;
    None when every link runs at line rate: what a burst of packets queues behind."""
    rates = []
    for spec in lab_links(lab).values():
        conditions = [spec.forward, spec.reverse]
        if spec.schedule is not None:
            conditions += [c for s in spec.schedule.steps for c in (s.forward, s.reverse, s.both) if c is not None]
        rates += [c.rate for c in conditions if c.rate]
    return min(rates, default=None)


def base_rtt(lab: Any) -> float:
    """Seconds the lab's links add to an empty path's round trip: their fixed delay in both directions (no
    jitter, no schedule). The base of the queueing-delay theory and of the standing-queue metric."""
    return sum(spec.direction(d).delay for spec in lab_links(lab).values() for d in ("forward", "reverse"))
