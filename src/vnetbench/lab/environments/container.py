"""`container`: Docker's default bridge network, built from its parts.

::

    [ container ns ]                 [ node ns (the Docker host) ]
      eth0 198.19.k.2 ──veth── veth0 ─ docker0 198.19.k.1    eth0 198.18.0.x ──veth── [ switch ]
      default via .1                   nftables: DNAT published ports -> container,
                                                 MASQUERADE container -> node address
      processes in cgroup vnb-<run>-<node> (cpu quota, cpuset, memory), when limits are set

As with Docker, traffic between hosts goes through the node's address and its
NAT: a client in one container reaches a server in another at the server's
*node* address on a published port (DNAT), and the server sees the client's
*node* address (MASQUERADE). IPv6 follows Docker's ``ip6tables`` mode (the
default since Docker 27): a ULA-like /64 behind NAT66, the same rules.

One deliberate difference: ICMP echo requests to the node are forwarded to the
container too (Docker answers them on the host), so the ping probe crosses the
same NAT, bridge and veth as the streams it runs beside.
"""

from __future__ import annotations

import os
import re
import shutil
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field

from vnetbench import quantities, units
from vnetbench.lab import cgroups, netns
from vnetbench.lab.environments.base import (EnvironmentOptions, SUBNET_V4_PREFIXLEN, SUBNET_V6_PREFIXLEN, Attached, Capability,
                                             Endpoint, LabContext, NamespaceEnvironment, add_default_routes,
                                             wired_namespace, enable_forwarding, namespace_node, new_namespace,
                                             register)
from vnetbench.lab.nodes import Interface, Link

BRIDGE = "docker0"
# Every workload server's port (iperf3 from 5201 up, one per sender; sockperf 5301-5302; ...) is in this range.
PUBLISHED_PORTS = (5201, 5399)

RULESET = """\
# vnetbench container NAT for {node}: Docker's bridge model (DOCKER chain + MASQUERADE)
table ip vnb_docker {{
  chain prerouting {{
    type nat hook prerouting priority dstnat; policy accept;
    ip daddr {node_v4} meta l4proto {{ tcp, udp }} th dport {p0}-{p1} dnat to {ctr_v4}
    ip daddr {node_v4} icmp type echo-request dnat to {ctr_v4}
  }}
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    ip saddr {net_v4} oifname != "{bridge}" masquerade
  }}
}}
table ip6 vnb_docker {{
  chain prerouting {{
    type nat hook prerouting priority dstnat; policy accept;
    ip6 daddr {node_v6} meta l4proto {{ tcp, udp }} th dport {p0}-{p1} dnat to {ctr_v6}
    ip6 daddr {node_v6} icmpv6 type echo-request dnat to {ctr_v6}
  }}
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    ip6 saddr {net_v6} oifname != "{bridge}" masquerade
  }}
}}
"""


# Each resource limit: the lab option that sets it and the cgroup controller that enforces it.
CONTAINER_OWN_BYTES = 16 * 2**20  # the tool's own binary, libraries and stack, charged to the same cgroup
LIMIT_CONTROLLERS = {"cpu_quota": "cpu", "cpuset": "cpuset", "memory_limit": "memory"}


def _cpu_quota(v: Any) -> Any:
    if v is None:
        return None
    try:
        cpus = units.parse_percent(str(v))
    except units.UnitError:
        raise ValueError(f"{units.brief(v)} is not a CPU quota: write a percentage of one CPU ('50%') or a number "
                         "of CPUs (1.5)") from None
    if not 0.01 <= cpus <= 1024:
        raise ValueError(f"{units.brief(v)}: a CPU quota must be between 1% (0.01) and 1024 CPUs")
    return cpus


def _cpuset(v: str | None) -> str | None:
    if v is not None and not re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*", str(v)):
        raise ValueError(f"{units.brief(v)} is not a CPU list: write e.g. '1', '0-1' or '0,2'")
    return v


class ContainerLimits(EnvironmentOptions):
    """A container's limits: vnetbench's own cgroup (env = container) or the engine's flags (docker, podman)."""

    cpu_quota: Annotated[float | None, BeforeValidator(_cpu_quota, json_schema_input_type=quantities.WrittenFraction)] \
        = Field(default=None, description="env=container, docker or podman: CPU limit, '50%' of one CPU or a number "
                                          "of CPUs (cgroup cpu.max; docker --cpus)")
    cpuset: Annotated[str | None, AfterValidator(_cpuset)] = Field(
        default=None, description="env=container, docker or podman: CPUs the container may use, e.g. '1' or '0-1' "
                                  "(cgroup cpuset.cpus; docker --cpuset-cpus)")
    memory_limit: quantities.Size | None = Field(default=None, description="env=container, docker or podman: memory "
                                                 "limit (cgroup memory.max; docker --memory)")


def container_memory_problem(variant: Any, needed: int) -> str | None:
    """A tool that needs more than a container's memory_limit leaves for it (vnetbench's model or an engine's)."""
    limit = getattr(variant, "memory_limit", None)
    if not limit or needed + CONTAINER_OWN_BYTES <= int(limit):
        return None
    return (f"needs {units.format_binary_size(needed)} of memory in a container limited to "
            f"{units.format_binary_size(int(limit))} (memory_limit): the kernel would kill it; raise memory_limit to "
            f"at least {units.format_binary_size(needed + CONTAINER_OWN_BYTES)}, or ask the tool for less")


def cpuset_problem(cpuset: str | None) -> str | None:
    """A cpuset naming a CPU this machine does not offer."""
    if not cpuset:
        return None
    allowed = os.sched_getaffinity(0)
    for part in cpuset.split(","):
        lo, _, hi = part.partition("-")
        missing = [c for c in range(int(lo), int(hi or lo) + 1) if c not in allowed]
        if missing:
            return f"cpuset = {units.brief(cpuset)} names CPU {missing[0]}, which this machine does not have (CPUs: {sorted(allowed)})"
    return None


@register
class ContainerEnvironment(NamespaceEnvironment):
    kind = "container"
    tag = "c"
    Options = ContainerLimits
    probes_kernel = True

    @classmethod
    def memory_problem(cls, variant: Any, needed: int) -> str | None:
        return container_memory_problem(variant, needed)

    @classmethod
    def capabilities(cls, variant: Any | None, kernel: dict[str, str | None] | None) -> list[Capability]:
        """NAT from nftables, and the cgroup controllers of the limits `variant` sets (None: all)."""
        caps = []
        if shutil.which("nft") is None:
            caps.append(Capability("container", False, "nft (nftables) is missing: no NAT or published ports",
                                   "apt-get install nftables"))
        elif kernel is not None and kernel.get("nft_nat"):
            caps.append(Capability("container", False, "the kernel refuses an nftables NAT table: "
                                   f"{kernel['nft_nat']}", "a kernel with nf_tables and nft_masq/nft_nat "
                                   "(CONFIG_NFT_NAT, CONFIG_NFT_MASQ)"))
        else:
            caps.append(Capability("container", True, "namespace + docker0 bridge + veth, nftables NAT/DNAT"))
        limits = cgroups.availability()
        for option, controller in LIMIT_CONTROLLERS.items():
            if controller not in limits or (variant is not None and getattr(variant, option) is None):
                continue
            err = limits[controller]
            caps.append(Capability(f"container {option}", err is None,
                                   f"cgroup {controller} controller" + (f": {err}" if err else
                                                                         f" ({cgroups.mount_for(controller).path})"),
                                   "" if err is None else "boot with the controller enabled (cgroup_enable=...)"))
        why = cpuset_problem(variant.cpuset) if variant is not None else None
        if why:
            caps.append(Capability("container cpuset", False, why, "choose CPUs that exist"))
        return caps

    def __init__(self, ctx: LabContext, variant: Any):
        super().__init__(ctx, variant)
        self.limits = cgroups.Limits(
            cpu_quota=variant.cpu_quota, cpuset=variant.cpuset,
            memory_bytes=int(variant.memory_limit) if variant.memory_limit else None)

    def attach(self, endpoint: Endpoint) -> Attached:
        ctx, reg = self.ctx, self.ctx.registry
        node = wired_namespace(ctx, endpoint.name)
        ctr = new_namespace(ctx, f"{endpoint.name}-ctr")
        subnet = ctx.new_subnet()
        gw4, gw6, c4, c6 = subnet.v4(1), subnet.v6(1), subnet.v4(2), subnet.v6(2)

        node.ns.ipr.link("add", ifname=BRIDGE, kind="bridge")
        bridge = Interface(node.ns, BRIDGE)
        if endpoint.mtu != 1500:
            bridge.set_mtu(endpoint.mtu)
        bridge.add_address(f"{gw4}/{SUBNET_V4_PREFIXLEN}")
        bridge.add_address(f"{gw6}/{SUBNET_V6_PREFIXLEN}")
        bridge.up()
        link = Link.connect(node.ns, "veth0", ctr, "eth0", reg, mtu=endpoint.mtu)
        node.ns.ipr.link("set", index=link.a.index, master=bridge.index)
        link.b.add_address(f"{c4}/{SUBNET_V4_PREFIXLEN}")
        link.b.add_address(f"{c6}/{SUBNET_V6_PREFIXLEN}")
        add_default_routes(ctr, link.b, gw4, gw6)
        enable_forwarding(node.ns)
        ruleset = RULESET.format(node=node.ns.name, node_v4=node.ipv4, node_v6=node.ipv6, ctr_v4=c4, ctr_v6=c6,
                                 net_v4=subnet.cidr4, net_v6=subnet.cidr6, bridge=BRIDGE,
                                 p0=PUBLISHED_PORTS[0], p1=PUBLISHED_PORTS[1])
        netns.apply_ruleset(node.ns.name, ruleset)

        wrapper: tuple[str, ...] = ()
        group = None
        if self.limits:
            group = cgroups.CGroup.create(ctx.ns_name(endpoint.name), self.limits, reg)
            wrapper = tuple(group.wrapper())
        facts: dict[str, Any] = {
            "env": "container", "node_netns": node.ns.name, "container_netns": ctr.name,
            "container_address": [c4, c6], "node_address": [node.ipv4, node.ipv6],
            "published_ports": f"{PUBLISHED_PORTS[0]}-{PUBLISHED_PORTS[1]}/tcp+udp, icmp echo",
        }
        if group:
            facts["cgroup"] = {"dirs": {k: str(v) for k, v in group.dirs.items()}, "limits": group.read()}
        # A cpuset confines the container's processes; pinning them elsewhere would contradict it.
        cpu = None if self.limits.cpuset else endpoint.cpu
        host = namespace_node(endpoint, ctr, reg, link.b, c4, c6, public_ipv4=node.ipv4, public_ipv6=node.ipv6,
                              wrapper=wrapper, env_facts=facts)
        host.cpu = cpu
        host.extra.update({"node": node, "cgroup": group, "ruleset": ruleset})
        att = Attached(node=host, port=node.port, uplink=node.iface,
                       offload_ifaces=[link.b, link.a, bridge, node.iface])
        self.attached.append(att)
        return att

    def facts(self) -> dict[str, Any]:
        limits = {k: v for k, v in (("cpu_quota", self.limits.cpu_quota), ("cpuset", self.limits.cpuset),
                                    ("memory_bytes", self.limits.memory_bytes)) if v is not None}
        return {"env": "container", "model": "docker bridge: veth + docker0 + nftables NAT/DNAT",
                "limits": limits, "cgroups": cgroups.describe() if limits else None}
