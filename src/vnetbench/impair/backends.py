"""Who realises a link's conditions, and how the choice is made.

==========  =====================================================  ==========================
backend     can do                                                 needs
==========  =====================================================  ==========================
tbf, htb    rate and buffer (drop-tail)                            the kernel qdisc
netem       rate + buffer (tbf/htb child), delay, jitter           sch_netem in the kernel
            (normal/uniform/pareto/paretonormal, in order or
            reordering), Bernoulli and Gilbert-Elliott loss,
            reorder, duplicate, corrupt
userspace   everything, plus drop-head/CoDel/RED/PIE queues,       vnb-link (``make setup``)
            schedules and Mahimahi traces; any kernel
==========  =====================================================  ==========================

``auto`` takes the kernel shaper when only rate and buffer are asked, netem
when the kernel has it and netem can express the request, else the userspace
emulator. An explicit backend that cannot express the request is an error that
says why and what would work, raised before anything is built.

Capabilities are detected by trying, once per process: the qdiscs are installed
on a veth pair in a throw-away namespace (as ``vnetbench doctor`` does).
"""

from __future__ import annotations

import functools
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from vnetbench.errors import EnvironmentProblem, ScenarioError
from vnetbench.impair.model import CAPABILITY_TEXT, LinkSpec, capability_list

if TYPE_CHECKING:
    from vnetbench.lab.nodes import Interface

SHAPER_NEEDS = frozenset({"rate", "buffer"})
NETEM_NEEDS = SHAPER_NEEDS | {"overhead", "delay", "jitter", "jitter:pareto", "jitter:paretonormal", "loss",
                              "loss:gilbert_elliott", "reorder", "duplicate", "corrupt"}
USERSPACE_NEEDS = frozenset(CAPABILITY_TEXT)

CAN: dict[str, frozenset[str]] = {
    "tbf": SHAPER_NEEDS,
    "htb": SHAPER_NEEDS,
    "netem": frozenset(NETEM_NEEDS),
    "userspace": USERSPACE_NEEDS,
}
LABEL = {
    "tbf": "'tbf' (kernel token bucket)",
    "htb": "'htb' (kernel hierarchical token bucket)",
    "netem": "'netem' (kernel network emulator)",
    "userspace": "'userspace' (vnb-link)",
}
PROBE_QDISCS = {
    "tbf": "tbf rate 10mbit burst 32kb limit 100kb",
    "htb": "htb default 1",
    "netem": "netem delay 1ms",
}
VNB_LINK = "vnb-link"
PROJECT_ROOT = Path(__file__).resolve().parents[3]
BINARY_IN_TREE = PROJECT_ROOT / "emulator" / "target" / "release" / VNB_LINK


@dataclass(frozen=True)
class Capabilities:
    """What this machine offers: kernel qdiscs (None = works, else the kernel's
    error) and the emulator binary."""

    qdiscs: dict[str, str | None] = field(default_factory=dict)
    vnb_link: str | None = None

    def available(self, backend: str) -> bool:
        if backend == "userspace":
            return self.vnb_link is not None
        return self.qdiscs.get(backend, "not probed") is None

    def why_not(self, backend: str) -> str:
        if backend == "userspace":
            return missing_binary_message()
        err = self.qdiscs.get(backend, "not probed")
        return f"the kernel has no {backend} qdisc ({err})"


def find_binary() -> str | None:
    """vnb-link: $VNB_LINK, the project's cargo build, or PATH."""
    env = os.environ.get("VNB_LINK")
    if env:
        return env if os.access(env, os.X_OK) else None
    if os.access(BINARY_IN_TREE, os.X_OK):
        return str(BINARY_IN_TREE)
    return shutil.which(VNB_LINK)


def missing_binary_message() -> str:
    return (f"the userspace emulator vnb-link is not built: run `make setup` (or `cargo build --release "
            f"--manifest-path {PROJECT_ROOT / 'emulator' / 'Cargo.toml'}`), or put vnb-link on PATH "
            "or in $VNB_LINK")


def require_binary() -> str:
    path = find_binary()
    if path is None:
        raise EnvironmentProblem(missing_binary_message())
    return path


@functools.cache
def probe_kernel_qdiscs() -> dict[str, str | None]:
    """{qdisc: None if the kernel accepts it, else its error}; probed once per process."""
    if os.geteuid() != 0:
        return {k: "not probed: needs root" for k in PROBE_QDISCS}
    from vnetbench.lab import netns

    return netns.probe_qdiscs(PROBE_QDISCS)


def capabilities() -> Capabilities:
    return Capabilities(qdiscs=dict(probe_kernel_qdiscs()), vnb_link=find_binary())


def unable(backend: str, needs: Iterable[str]) -> set[str]:
    """What of `needs` this backend cannot express."""
    return set(needs) - CAN[backend]


def expressible_by(needs: Iterable[str]) -> list[str]:
    needs = set(needs)
    return [b for b in ("tbf", "htb", "netem", "userspace") if needs <= CAN[b]]


def check_expressible(spec: LinkSpec, where: str = "", caps: Capabilities | None = None) -> None:
    """An explicit backend must be able to express what is asked of it. Without
    `caps` (scenario validation: nothing probed) netem is offered "where the
    kernel has it"; with them, only what this machine has."""
    if spec.backend == "auto":
        return
    missing = unable(spec.backend, spec.needs())
    if missing:
        alternatives = []
        for b in expressible_by(spec.needs()):
            if b == spec.backend or (caps is not None and not caps.available(b)):
                continue
            alternatives.append(LABEL[b] + (" where the kernel has it" if b == "netem" and caps is None else ""))
        alternatives.append("'auto'")
        raise ScenarioError(f"{where}backend '{spec.backend}' cannot emulate {capability_list(missing)}: "
                            f"use {' or '.join(alternatives)}")


def choose(request: LinkSpec, backend: str | None = None, caps: Capabilities | None = None,
           shaper: str = "tbf", where: str = "") -> str:
    """The backend that realises `request`: the explicit one if it can (else an
    error that says why and what would work), or the automatic choice.

    `shaper` is the kernel rate limiter (tbf or htb) `auto` uses when only rate
    and buffer are asked. Returns the backend's name.
    """
    backend = backend or request.backend
    needs = request.needs()
    if backend != "auto":
        caps = caps or capabilities()
        check_expressible(request.model_copy(update={"backend": backend}), where, caps)
        if not caps.available(backend):
            options = [LABEL[b] for b in expressible_by(needs) if b != backend and caps.available(b)] + ["'auto'"]
            raise EnvironmentProblem(f"{where}backend '{backend}' is not available here: {caps.why_not(backend)}; "
                                     f"use {' or '.join(options)}")
        return backend
    if needs <= SHAPER_NEEDS:
        caps = caps or capabilities()
        if caps.available(shaper) or not needs:
            return shaper
    caps = caps or capabilities()
    if caps.available("netem") and needs <= CAN["netem"]:
        return "netem"
    if caps.vnb_link is None:
        netem_note = ("" if not caps.available("netem") else
                      f" (netem cannot emulate {capability_list(unable('netem', needs))})")
        raise EnvironmentProblem(f"{where}{request.describe()} needs the userspace emulator{netem_note}, and "
                                 f"{missing_binary_message()}")
    return "userspace"


# ------------------------------------------------------------------ realising


@dataclass
class LabLink:
    """One link of a lab, seen from the backends.

    ``switch_end`` is the veth end in the switch's namespace, ``host_end`` its
    peer in the host's. ``host_upstream`` says which way `forward` (the stream's
    data) flows: from the host toward the switch (a sender's link) or from the
    switch toward the host (the receiver's link, "bottleneck").
    """

    name: str
    switch_end: Interface
    host_end: Interface
    host_upstream: bool

    def egress(self, direction: str) -> Interface:
        """The interface whose egress carries `direction` (where a qdisc goes)."""
        forward_from_host = self.host_upstream
        if direction == "forward":
            return self.host_end if forward_from_host else self.switch_end
        return self.switch_end if forward_from_host else self.host_end


@dataclass
class TrialCounters:
    """What a backend counted during one trial, per direction."""

    per_direction: dict[str, dict[str, float]] = field(default_factory=dict)

    def get(self, direction: str, key: str, default: float = 0.0) -> float:
        return float(self.per_direction.get(direction, {}).get(key, default))


class Backend:
    """Realises a LinkSpec on one LabLink. Subclasses: shaper (tbf/htb), netem, userspace."""

    name = "?"

    def __init__(self, link: LabLink, mtu: int = 1500, shaper: str = "tbf"):
        self.link = link
        self.mtu = mtu
        self.shaper = shaper

    # structure -----------------------------------------------------------
    def install(self) -> None:
        """Change the lab's structure if this backend needs to (the emulator's namespace)."""

    def uninstall(self) -> None:
        """Undo install() so another backend can take the link over."""

    # conditions ----------------------------------------------------------
    def apply(self, spec: LinkSpec) -> dict:
        """Make the link behave as `spec`; return the settings as applied (for the record)."""
        raise NotImplementedError

    def qdiscs(self) -> list[dict]:
        """Kernel qdiscs on the link's interfaces, as the kernel reports them."""
        return []

    # trials --------------------------------------------------------------
    def start_trial(self, spec: LinkSpec, seconds: float) -> None:
        """Called right before a trial's flows start (schedules count from here)."""

    def failure(self) -> str | None:
        """Why the link stopped working during the trial, or None."""
        return None

    def end_trial(self) -> TrialCounters:
        return TrialCounters()

    def clear(self) -> None:
        """Remove every condition this backend installed."""

    def healthy(self) -> bool:
        """False when what apply() set up is gone (an emulator that died): apply again."""
        return True

    def idle(self) -> None:
        """The link is not in use for a while (another environment's trials run)."""


class ShaperBackend(Backend):
    """Kernel tbf or htb (+ bfifo) on the egress of each direction: rate and buffer only."""

    def __init__(self, link: LabLink, mtu: int = 1500, shaper: str = "tbf"):
        super().__init__(link, mtu, shaper)
        self.name = shaper
        self._before: dict[str, dict[str, int]] = {}

    def apply(self, spec: LinkSpec) -> dict:
        from vnetbench.impair import tc

        out: dict[str, Any] = {"backend": self.name, "directions": {}}
        for d in ("forward", "reverse"):
            cond = spec.direction(d)
            iface = self.link.egress(d)
            if not cond.rate:
                tc.clear(iface)
                out["directions"][d] = {"plain": True}
                continue
            buffer = cond.buffer_bytes() or 1000 * (self.mtu + 14)
            tc.apply(iface, tc.Shaping(rate_bps=cond.rate, buffer_bytes=buffer, qdisc=self.name, mtu=self.mtu))
            out["directions"][d] = {"qdiscs": [q for q in tc.read_back(iface) if q["kind"] != "noqueue"]}
        return out

    def qdiscs(self) -> list[dict]:
        from vnetbench.impair import tc

        out = []
        for iface in (self.link.switch_end, self.link.host_end):
            out.extend(q for q in tc.read_back(iface) if q["kind"] not in ("noqueue",))
        return out

    def start_trial(self, spec: LinkSpec, seconds: float) -> None:
        from vnetbench.impair import tc

        self._before = {d: tc.counters(self.link.egress(d)) for d in ("forward", "reverse")}

    def end_trial(self) -> TrialCounters:
        from vnetbench.impair import tc

        out = TrialCounters()
        for d, before in self._before.items():
            after = tc.counters(self.link.egress(d))
            out.per_direction[d] = {"dropped_queue": after["drops"] - before["drops"],
                                    "packets": after["packets"] - before["packets"]}
        return out

    def clear(self) -> None:
        from vnetbench.impair import tc

        for iface in (self.link.switch_end, self.link.host_end):
            tc.clear(iface)


def backend_class(name: str) -> type[Backend]:
    if name in ("tbf", "htb"):
        return ShaperBackend
    if name == "netem":
        from vnetbench.impair.netem import NetemBackend

        return NetemBackend
    if name == "userspace":
        from vnetbench.impair.userspace import UserspaceBackend

        return UserspaceBackend
    raise ValueError(f"unknown backend {name!r}; known: tbf, htb, netem, userspace")
