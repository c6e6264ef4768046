"""What a link backend is, and the registry the backends join (:mod:`vnetbench.impair.backends` chooses).

A backend is one module: a :class:`Backend` subclass that realises a
:class:`~vnetbench.impair.model.LinkSpec` on a :class:`LabLink`, registered
with :func:`register` under each name a scenario's ``backend`` can give it, with
what it can emulate and how to probe whether this machine has it::

    @register("netem", "'netem' (kernel network emulator)", can=NETEM_CAN, probe_qdisc="netem delay 1ms")
    class NetemBackend(Backend): ...

This module names no backend; the backends import it, never each other.
"""

from __future__ import annotations

import functools
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from vnetbench.errors import EnvironmentProblem
from vnetbench.impair.model import BACKENDS, LinkSpec

if TYPE_CHECKING:
    from vnetbench.lab.nodes import Interface

# What a rate qdisc (tbf, htb) can do: the rest of the LinkSpec needs netem or the emulator.
RATE_QDISC_NEEDS = frozenset({"rate", "buffer"})

VNB_LINK = "vnb-link"
PROJECT_ROOT = Path(__file__).resolve().parents[3]
BINARY_IN_TREE = PROJECT_ROOT / "emulator" / "target" / "release" / VNB_LINK


@dataclass(frozen=True)
class BackendKind:
    """One name a scenario's ``backend`` can take."""

    name: str
    label: str  # for messages: "'netem' (kernel network emulator)"
    can: frozenset[str]  # the LinkSpec capabilities it expresses (LinkSpec.needs())
    cls: type["Backend"]
    probe_qdisc: str | None = None  # a kernel qdisc: available when the kernel accepts this; None: the emulator
    fix: str = ""  # what makes it available where it is not (doctor, host preflight)

    @property
    def kernel(self) -> bool:
        """A kernel qdisc (what a real host can have), not the local emulator."""
        return self.probe_qdisc is not None


REGISTRY: dict[str, BackendKind] = {}


def register(name: str, label: str, can: frozenset[str] | set[str], probe_qdisc: str | None = None,
             fix: str = "") -> Callable[[type["Backend"]], type["Backend"]]:
    """Class decorator: the class realises the backend `name` (one class may register several names)."""
    def add(cls: type[Backend]) -> type[Backend]:
        if name in REGISTRY:
            raise TypeError(f"two link backends are registered as {name!r}")
        if name not in BACKENDS:
            # the scenario model validates `backend` against BACKENDS before any backend module is imported
            raise TypeError(f"link backend {name!r} must also be listed in vnetbench.impair.model.BACKENDS")
        REGISTRY[name] = BackendKind(name, label, frozenset(can), cls, probe_qdisc, fix)
        return cls
    return add


@dataclass(frozen=True)
class Capabilities:
    """What this machine offers: kernel qdiscs (None = works, else the kernel's
    error) and the emulator binary."""

    qdiscs: dict[str, str | None] = field(default_factory=dict)
    vnb_link: str | None = None

    def available(self, backend: str) -> bool:
        if REGISTRY[backend].probe_qdisc is None:
            return self.vnb_link is not None
        return self.qdiscs.get(backend, "not probed") is None

    def why_not(self, backend: str) -> str:
        if REGISTRY[backend].probe_qdisc is None:
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
    """{qdisc: None if the kernel accepts it, else its error} for every registered kernel backend;
    probed once per process."""
    probes = {k.name: k.probe_qdisc for k in REGISTRY.values() if k.probe_qdisc}
    if os.geteuid() != 0:
        return {k: "not probed: needs root" for k in probes}
    from vnetbench.lab import netns

    return netns.probe_qdiscs(probes)


def capabilities() -> Capabilities:
    return Capabilities(qdiscs=dict(probe_kernel_qdiscs()), vnb_link=find_binary())


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
    """Realises a LinkSpec on one LabLink. Subclasses: rate qdisc (tbf/htb), netem, userspace; on real hosts hosts.shaping.HostLinkBackend."""

    name = "?"

    def __init__(self, link: LabLink, mtu: int = 1500, rate_qdisc: str = "tbf"):
        self.link = link
        self.mtu = mtu
        self.rate_qdisc = rate_qdisc

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

    def check(self, spec: LinkSpec) -> list[str]:
        """What the link holds now, read back from the kernel (and the emulator), against `spec` as apply()
        realised it: one line per difference, none when they agree."""
        raise NotImplementedError

    def endpoints_offload(self, on: bool) -> bool:
        """The endpoints' offloads are now on (or off): a backend whose own settings depend on that adjusts
        them. Whether anything changed (what apply() returned is then out of date)."""
        return False

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

    def processes(self) -> list[int]:
        """The processes of this machine that carry the link's packets now (an emulator's); none for the
        kernel's qdiscs, whose work is softirq."""
        return []

    def idle(self) -> None:
        """The link is not in use for a while (another environment's trials run)."""
