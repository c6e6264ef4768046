"""Who realises a link's conditions, and how the choice is made.

==========  =====================================================  ==========================
backend     can do                                                 needs
==========  =====================================================  ==========================
tbf, htb    rate and buffer (drop-tail)                            the kernel qdisc
netem       rate + buffer (tbf/htb child), delay, jitter           sch_netem in the kernel
            (normal/uniform/pareto/paretonormal, in order or
            reordering), Bernoulli and Gilbert-Elliott loss,
            reorder, duplicate, corrupt
userspace   everything, plus drop-head/CoDel/RED/PIE/fq queues,       vnb-link (``make setup``)
            schedules and Mahimahi traces; any kernel
==========  =====================================================  ==========================

``auto`` takes the rate qdisc when only rate and buffer are asked, netem
when the kernel has it and netem can express the request, else the userspace
emulator. An explicit backend that cannot express the request is an error that
says why and what would work, raised before anything is built.

Each backend is a module that registers itself (:mod:`vnetbench.impair.backend`):
``tbf``/``htb`` in :mod:`~vnetbench.impair.rate_qdisc`, ``netem`` in
:mod:`~vnetbench.impair.netem`, ``userspace`` in :mod:`~vnetbench.impair.userspace`.
This module imports them and holds the policy that picks one.

Capabilities are detected by trying, once per process: the qdiscs are installed
on a veth pair in a throw-away namespace (as ``vnetbench doctor`` does).
"""

from __future__ import annotations

import importlib
from typing import Iterable

from vnetbench.errors import EnvironmentProblem, ScenarioError
from vnetbench.impair.backend import (REGISTRY, RATE_QDISC_NEEDS, Backend, BackendKind, Capabilities, LabLink,
                                      TrialCounters, capabilities, find_binary, missing_binary_message,
                                      probe_kernel_qdiscs, require_binary)
from vnetbench.impair.model import LinkSpec, capability_list

# The backend modules; importing one registers it. Cheapest first: `expressible_by` lists them in this order.
MODULES = ("rate_qdisc", "netem", "userspace")
for _module in MODULES:
    importlib.import_module(f"vnetbench.impair.{_module}")

__all__ = ["REGISTRY", "RATE_QDISC_NEEDS", "Backend", "BackendKind", "Capabilities", "LabLink", "TrialCounters",
           "auto_choice", "backend_class", "capabilities", "check_expressible", "choose", "expressible_by",
           "find_binary", "missing_binary_message", "probe_kernel_qdiscs", "require_binary", "unable"]


def unable(backend: str, needs: Iterable[str]) -> set[str]:
    """What of `needs` this backend cannot express."""
    return set(needs) - REGISTRY[backend].can


def expressible_by(needs: Iterable[str]) -> list[str]:
    needs = set(needs)
    return [b for b, kind in REGISTRY.items() if needs <= kind.can]


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
            alternatives.append(REGISTRY[b].label + (" where the kernel has it" if b == "netem" and caps is None else ""))
        alternatives.append("'auto'")
        raise ScenarioError(f"{where}backend '{spec.backend}' cannot emulate {capability_list(missing)}: "
                            f"use {' or '.join(alternatives)}")


def choose(request: LinkSpec, backend: str | None = None, caps: Capabilities | None = None,
           rate_qdisc: str = "tbf", where: str = "") -> str:
    """The backend that realises `request`: the explicit one if it can (else an
    error that says why and what would work), or the automatic choice.

    `rate_qdisc` is the kernel rate limiter (tbf or htb) `auto` uses when only rate
    and buffer are asked. Returns the backend's name.
    """
    backend = backend or request.backend
    needs = request.needs()
    if backend != "auto":
        caps = caps or capabilities()
        check_expressible(request.model_copy(update={"backend": backend}), where, caps)
        if not caps.available(backend):
            options = [REGISTRY[b].label for b in expressible_by(needs) if b != backend and caps.available(b)] + ["'auto'"]
            raise EnvironmentProblem(f"{where}backend '{backend}' is not available here: {caps.why_not(backend)}; "
                                     f"use {' or '.join(options)}")
        return backend
    return auto_choice(needs, caps or capabilities(), rate_qdisc, f"{where}{request.describe()}")


def auto_choice(needs: set[str], caps: Capabilities, rate_qdisc: str, what: str) -> str:
    """`auto`: the rate qdisc for rate and buffer alone, netem where the kernel has it and it can
    express `needs`, else the userspace emulator (an error naming `what` when it is not built)."""
    if not needs or (needs <= RATE_QDISC_NEEDS and caps.available(rate_qdisc)):
        return rate_qdisc
    if caps.available("netem") and needs <= REGISTRY["netem"].can:
        return "netem"
    if caps.vnb_link is None:
        netem_note = ("" if not caps.available("netem") else
                      f" (netem cannot emulate {capability_list(unable('netem', needs))})")
        raise EnvironmentProblem(f"{what} needs the userspace emulator{netem_note}, and {missing_binary_message()}")
    return "userspace"


def backend_class(name: str) -> type[Backend]:
    try:
        return REGISTRY[name].cls
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; known: {', '.join(REGISTRY)}") from None
