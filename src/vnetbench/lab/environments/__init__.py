"""How an endpoint attaches to the lab: `bare`, `container`, `vm`, `overlay`.

An *environment* is chosen by the scenario's lab fields (``env`` and the
options that belong to it); one set of values is a :class:`Variant`. The
topology asks the variant's environment for each of its endpoints, then lets
it join them::

    env = create(variant, ctx)          # ctx: LabContext (switch, registry, run prefix, subnets)
    a = env.attach(Endpoint("r", 1, cpu=1, mtu=1500))    # -> Attached(host, port, uplink, ...)
    b = env.attach(Endpoint("s1", 2, cpu=0, mtu=1500))
    env.finish()                        # join them (overlay routes/FDB; wait for guests to boot)
    env.set_offload(False)              # TSO/GSO/GRO/checksum on the variant's interfaces -> read-back
    env.facts()                         # for the record

``attach`` returns :class:`~vnetbench.lab.environments.base.Attached`: the
host workloads run on and the switch link impairments attach to. The host has
:class:`~vnetbench.lab.nodes.Host`'s interface, whatever runs it:
``command/popen/run`` execute a tool in the endpoint, ``address(v)`` is its
own address, ``service_address(v)`` the one other hosts must use to reach its
servers (a container's node address, whose published ports are DNAT'ed; its
own address everywhere else), ``facts()`` what the environment records about
it. Workloads never learn which environment they run in.

Every environment creates its things through the lab's registry, inside
``atomic()``, like the rest of the lab. ``vm`` lives in
:mod:`vnetbench.lab.environments.vm` (QEMU guests) and is loaded on demand.

What the machine can provide is said before anything is built:
:func:`problems` for a run's variants (preflight), :func:`availability` for
`vnetbench doctor`.
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
from dataclasses import dataclass, fields
from functools import lru_cache
from typing import Any, Protocol

from vnetbench.errors import EnvironmentProblem
from vnetbench.lab import cgroups, netns
from vnetbench.lab.environments.base import Attached, Endpoint, LabContext

KINDS = ("bare", "container", "vm", "overlay")


@dataclass(frozen=True)
class Variant:
    """The structural choices one set of endpoints is built with (offload is set per trial)."""

    env: str = "bare"
    overlay: str | None = None
    nic: str | None = None
    vcpus: int | None = None
    memory: float | None = None
    cpu_quota: float | None = None
    cpuset: str | None = None
    memory_limit: float | None = None
    mtu: int = 1500

    @classmethod
    def from_lab(cls, lab: Any) -> "Variant":
        return cls(**{f.name: getattr(lab, f.name) for f in fields(cls)})

    @property
    def options(self) -> dict[str, Any]:
        """The environment options that are set (for names, messages and facts)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in ("env", "mtu") and getattr(self, f.name) is not None}

    def __str__(self) -> str:
        opts = ", ".join(f"{k}={v}" for k, v in self.options.items())
        return f"{self.env}({opts})" if opts else self.env


class Environment(Protocol):
    kind: str

    def attach(self, endpoint: Endpoint) -> Attached: ...

    def finish(self) -> None: ...

    def set_offload(self, on: bool) -> list[dict[str, Any]]: ...

    def facts(self) -> dict[str, Any]: ...


def _classes() -> dict[str, Any]:
    from vnetbench.lab.environments.bare import BareEnvironment
    from vnetbench.lab.environments.container import ContainerEnvironment
    from vnetbench.lab.environments.overlay import OverlayEnvironment

    return {"bare": BareEnvironment, "container": ContainerEnvironment, "overlay": OverlayEnvironment}


def _vm_module() -> Any | None:
    try:
        return importlib.import_module("vnetbench.lab.environments.vm")
    except ModuleNotFoundError as e:
        if e.name == "vnetbench.lab.environments.vm":
            return None
        raise


def create(variant: Variant, ctx: LabContext) -> Environment:
    if variant.env == "vm":
        module = _vm_module()
        if module is None:
            raise EnvironmentProblem(VM_MISSING)
        return module.VmEnvironment(ctx, variant)
    try:
        cls = _classes()[variant.env]
    except KeyError:
        raise EnvironmentProblem(f"unknown environment {variant.env!r}; known: {', '.join(KINDS)}") from None
    return cls(ctx, variant)


# ------------------------------------------------------------ what this machine can do

VM_MISSING = ("env = \"vm\" needs the QEMU guest support (vnetbench.lab.environments.vm), which this "
              "installation does not have yet")


@dataclass(frozen=True)
class Capability:
    name: str  # "container", "overlay (vxlan)", "vm (e1000)", ...
    ok: bool
    detail: str
    fix: str = ""


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


def _container_caps(variant: Variant | None, kernel: dict[str, str | None] | None) -> list[Capability]:
    caps = []
    if shutil.which("nft") is None:
        caps.append(Capability("container", False, "nft (nftables) is missing: no NAT or published ports",
                               "apt-get install nftables"))
    elif kernel is not None and kernel.get("nft_nat"):
        caps.append(Capability("container", False, f"the kernel refuses an nftables NAT table: {kernel['nft_nat']}",
                               "a kernel with nf_tables and nft_masq/nft_nat (CONFIG_NFT_NAT, CONFIG_NFT_MASQ)"))
    else:
        caps.append(Capability("container", True, "namespace + docker0 bridge + veth, nftables NAT/DNAT"))
    limits = cgroups.availability()
    wanted = {"cpu": variant.cpu_quota, "cpuset": variant.cpuset, "memory": variant.memory_limit} if variant else \
        {c: True for c in limits}
    for controller, err in limits.items():
        if not wanted.get(controller):
            continue
        option = {"cpu": "cpu_quota", "cpuset": "cpuset", "memory": "memory_limit"}[controller]
        caps.append(Capability(f"container {option}", err is None,
                               f"cgroup {controller} controller" + (f": {err}" if err else
                                                                     f" ({cgroups.mount_for(controller).path})"),
                               "" if err is None else "boot with the controller enabled (cgroup_enable=...)"))
    if variant and variant.cpuset:
        allowed = os.sched_getaffinity(0)
        for part in variant.cpuset.split(","):
            lo, _, hi = part.partition("-")
            missing = [c for c in range(int(lo), int(hi or lo) + 1) if c not in allowed]
            if missing:
                caps.append(Capability("container cpuset", False,
                                       f"cpuset = {variant.cpuset!r} names CPU {missing[0]}, which this machine "
                                       f"does not have (CPUs: {sorted(allowed)})", "choose CPUs that exist"))
                break
    return caps


def _overlay_caps(mode: str | None, kernel: dict[str, str | None] | None) -> list[Capability]:
    caps = []
    if mode in (None, "vxlan"):
        err = kernel.get("vxlan") if kernel is not None else None
        caps.append(Capability("overlay (vxlan)", err is None,
                               "VXLAN devices (UDP 4789) in a per-node bridge" if err is None else
                               f"the kernel cannot create a VXLAN device: {err}",
                               "" if err is None else "a kernel with CONFIG_VXLAN (module vxlan)"))
    if mode in (None, "routed"):
        caps.append(Capability("overlay (routed)", True, "per-node container blocks, static routes"))
    return caps


def _vm_caps(variant: Variant | None) -> list[Capability]:
    module = _vm_module()
    if module is None:
        qemu = shutil.which("qemu-system-x86_64")
        return [Capability("vm", False, VM_MISSING + (f"; {qemu} is installed" if qemu else ""),
                           "" if qemu else "apt-get install qemu-system-x86 linux-image-amd64")]
    check = getattr(module, "capabilities", None)
    if check is None:
        return [Capability("vm", True, "QEMU guests (the vm module gives no details)")]
    try:
        found = check(variant)
    except Exception as e:  # a check that cannot even run says so, rather than taking doctor down with it
        return [Capability("vm", False, f"checking what guests need failed: {type(e).__name__}: {e}",
                           "see `vnetbench doctor`")]
    return [Capability(*c) if not isinstance(c, Capability) else c for c in found]


def availability(probe: bool = True) -> list[Capability]:
    """Every environment and whether this machine can provide it (for `vnetbench doctor`)."""
    kernel = probe_kernel() if probe and os.geteuid() == 0 else None
    caps = [Capability("bare", True, "namespace on the switch (the reference)")]
    caps += _container_caps(None, kernel)
    caps += _overlay_caps(None, kernel)
    caps += _vm_caps(None)
    return caps


def problems(variants: list[Variant]) -> list[str]:
    """What stops these variants from being built here, each with what to do (empty: all can be)."""
    kernel = probe_kernel() if any(v.env in ("container", "overlay") for v in variants) else None
    out: list[str] = []
    for v in variants:
        if v.env == "bare":
            caps: list[Capability] = []
        elif v.env == "container":
            caps = _container_caps(v, kernel)
        elif v.env == "overlay":
            caps = _overlay_caps(v.overlay or "vxlan", kernel)
        elif v.env == "vm":
            caps = _vm_caps(v)
        else:
            caps = [Capability(v.env, False, f"unknown environment {v.env!r}")]
        for c in caps:
            if not c.ok:
                out.append(f"env {v}: {c.detail}" + (f" -> {c.fix}" if c.fix else ""))
    return list(dict.fromkeys(out))


def check(variants: list[Variant]) -> None:
    """Raise EnvironmentProblem naming every environment this machine cannot provide."""
    found = problems(variants)
    if found:
        raise EnvironmentProblem("this machine cannot provide the environment(s) the run needs (nothing was built):\n  "
                                 + "\n  ".join(found))
