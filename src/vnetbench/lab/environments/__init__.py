"""How an endpoint attaches to the lab: `bare`, `container`, `docker`, `podman`, `vm`, `overlay`.

An *environment* is chosen by the scenario's lab fields (``env`` and the
options that belong to it); one set of values is a :class:`Variant`. The
topology asks the variant's environment for each of its endpoints, then lets
it join them::

    env = create(variant, ctx)          # ctx: LabContext (switch, registry, run prefix, subnets)
    a = env.attach(Endpoint("r", 1, cpu=1, mtu=1500))    # -> Attached(node, port, uplink, ...)
    b = env.attach(Endpoint("s1", 2, cpu=0, mtu=1500))
    env.finish()                        # join them (overlay routes/FDB; wait for guests to boot)
    env.set_offload(False)              # TSO/GSO/GRO/checksum on the variant's interfaces -> read-back
    env.facts()                         # for the record

``attach`` returns :class:`~vnetbench.lab.environments.base.Attached`: the
host workloads run on and the switch link impairments attach to. The host has
:class:`~vnetbench.lab.nodes.NamespaceNode`'s interface, whatever runs it:
``command/popen/run`` execute a tool in the endpoint, ``address(v)`` is its
own address, ``service_address(v)`` the one other hosts must use to reach its
servers (a container's node address, whose published ports are DNAT'ed; its
own address everywhere else), ``facts()`` what the environment records about
it. Workloads never learn which environment they run in.

Every environment creates its things through the lab's registry, inside
``atomic()``, like the rest of the lab.

An environment is one module: its class inherits
:class:`~vnetbench.lab.environments.base.EnvironmentType`, declares its
``kind``, host-name ``tag``, the lab options it owns (``Options``, a model of their own: the scenario's
``[lab]`` table and :data:`Variant` are made from them) and what it needs from
the machine (``capabilities``), and is ``@register``-ed. Importing this package
imports every module of :data:`MODULES`; nothing else names an environment.

What the machine can provide is said before anything is built:
:func:`problems` for a run's variants (preflight), :func:`availability` for
`vnetbench doctor`.
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
from dataclasses import field, fields, make_dataclass
from functools import lru_cache
from typing import Any, Protocol

from pydantic.fields import FieldInfo

from vnetbench.errors import EnvironmentProblem
from vnetbench.lab import netns
from vnetbench.lab.environments.base import REGISTRY, Attached, Capability, Endpoint, EnvironmentType, LabContext

# The environment modules, in the order `vnetbench doctor` lists them; each registers itself on import.
MODULES = ("bare", "container", "docker", "podman", "overlay", "vm")
for _module in MODULES:
    importlib.import_module(f"vnetbench.lab.environments.{_module}")

KINDS = tuple(REGISTRY)


def kind(name: str) -> type[EnvironmentType]:
    try:
        return REGISTRY[name]
    except KeyError:
        raise EnvironmentProblem(f"unknown environment {name!r}; known: {', '.join(KINDS)}") from None


def option_owners() -> dict[str, tuple[str, ...]]:
    """Every environment option (a lab field) and the environments that take it: {"nic": ("vm",),
    "cpu_quota": ("container", "docker", "podman"), ...}. An option two environments share means the same there (a
    container's CPU limit, whether vnetbench's model or the engine applies it)."""
    owners: dict[str, tuple[str, ...]] = {}
    for cls in REGISTRY.values():
        for option in cls.options:
            owners[option] = (*owners.get(option, ()), cls.kind)
    return owners


def option_fields() -> dict[str, FieldInfo]:
    """Every environment option as its module declares it (type, default, description, checks), in the order
    of MODULES: the scenario's ``[lab]`` table takes them as its fields (scenario/model.py LabSpec)."""
    out: dict[str, FieldInfo] = {}
    for cls in REGISTRY.values():
        for name, info in cls.Options.model_fields.items():
            known = out.setdefault(name, info)
            if (known.annotation, known.description) != (info.annotation, info.description):
                raise TypeError(f"environment option {name!r} is declared twice, differently ({cls.kind}): two "
                                "environments that share an option share its model (one inherits the other's)")
    return out


class _VariantBehaviour:
    """What a Variant does; its fields are made from the registered environments' options (below)."""

    env: str
    mtu: int

    @classmethod
    def from_lab(cls, lab: Any) -> "Variant":
        return cls(**{f.name: getattr(lab, f.name) for f in fields(cls)})  # type: ignore[arg-type]

    @property
    def options(self) -> dict[str, Any]:
        """The environment options that are set (for names, messages and facts)."""
        return {f.name: getattr(self, f.name) for f in fields(self)  # type: ignore[arg-type]
                if f.name not in ("env", "mtu") and getattr(self, f.name) is not None}

    def __str__(self) -> str:
        opts = ", ".join(f"{k}={v}" for k, v in self.options.items())
        return f"{self.env}({opts})" if opts else self.env


# The structural choices one set of endpoints is built with (offload is set per trial): ``env``, every registered
# environment's options (None: not set) and ``mtu``; hashable, so that a lab keeps one group of endpoints each.
# ``Variant("vm", nic="e1000")``.
Variant = make_dataclass(
    "Variant",
    [("env", str, field(default="bare")), *((name, Any, field(default=None)) for name in option_fields()),
     ("mtu", int, field(default=1500))],
    bases=(_VariantBehaviour,), frozen=True, namespace={"__module__": __name__})


class Environment(Protocol):
    kind: str

    def attach(self, endpoint: Endpoint) -> Attached: ...

    def finish(self) -> None: ...

    def set_offload(self, on: bool) -> list[dict[str, Any]]: ...

    def facts(self) -> dict[str, Any]: ...

    def counters(self) -> Any: ...


def create(variant: Variant, ctx: LabContext) -> Environment:
    return kind(variant.env)(ctx, variant)  # type: ignore[call-arg, return-value]


# ------------------------------------------------------------ what this machine can do

@lru_cache(maxsize=1)
def probe_kernel() -> dict[str, str | None]:
    """Try what environments need in a throw-away namespace: {feature: None if it works, else the error}.

    Needs root. Features: ``vxlan`` (a VXLAN device), ``nft_nat`` (an nftables NAT ruleset).
    """
    name = f"vnb-probe-{os.getpid()}"
    out: dict[str, str | None] = {}
    netns.create(name)
    try:
        r = subprocess.run(["ip", "-n", name, "link", "add", "vx0", "type", "vxlan", "id", "42", "dstport", "4789",
                            "local", "198.18.0.1"], capture_output=True, text=True)
        out["vxlan"] = None if r.returncode == 0 else (r.stderr.strip() or "failed")
        if shutil.which("nft"):
            ruleset = ("table ip vnb_probe {\n  chain p {\n    type nat hook postrouting priority srcnat;\n"
                       "    ip saddr 198.19.0.0/16 masquerade\n  }\n}\n")
            r = subprocess.run(["ip", "netns", "exec", name, "nft", "-f", "-"], input=ruleset, capture_output=True,
                               text=True)
            errors = [line for line in r.stderr.splitlines() if "Error" in line] or r.stderr.splitlines() or ["failed"]
            out["nft_nat"] = None if r.returncode == 0 else errors[0].strip()
        else:
            out["nft_nat"] = "nft is not installed"
    finally:
        netns.remove(name)
    return out


def availability(probe: bool = True) -> list[Capability]:
    """Every environment and whether this machine can provide it (for `vnetbench doctor`)."""
    kernel = probe_kernel() if probe and os.geteuid() == 0 else None
    return [c for cls in REGISTRY.values() for c in cls.capabilities(None, kernel)]


def problems(variants: list[Variant], probe: bool = True) -> list[str]:
    """What stops these variants from being built here, each with what to do (empty: all can be).
    `probe` False: what needs trying in a throw-away namespace (root) is not checked."""
    if any(v.env not in REGISTRY for v in variants):
        return [f"env {v}: unknown environment {v.env!r}; known: {', '.join(KINDS)}" for v in variants
                if v.env not in REGISTRY]
    kernel = probe_kernel() if probe and any(REGISTRY[v.env].probes_kernel for v in variants) else None
    found = [f"env {v}: {c.detail}" + (f" -> {c.fix}" if c.fix else "")
             for v in variants for c in REGISTRY[v.env].capabilities(v, kernel) if not c.ok]
    return list(dict.fromkeys(found))


def tool_problems(variants: dict[Variant, list[tuple[str, str]]]) -> list[str]:
    """For each variant, the tools its workloads need, (command, package): which it cannot run."""
    found = [f"env {v}: {p}" for v, tools in variants.items() if v.env in REGISTRY
             for p in REGISTRY[v.env].tool_problems(v, tools)]
    return list(dict.fromkeys(found))


def check(variants: list[Variant], tools: dict[Variant, list[tuple[str, str]]] | None = None) -> None:
    """Raise EnvironmentProblem naming every environment this machine cannot provide, and every tool a
    variant's workloads need that it cannot run (`tools`: per variant, (command, package))."""
    found = problems(variants)
    found += tool_problems(tools or {}) if not found else []
    if found:
        raise EnvironmentProblem("this machine cannot provide the environment(s) the run needs (nothing was built):\n  "
                                 + "\n  ".join(found))
