"""`docker` (and, through the same class, `podman`): endpoints as real containers of the engine, on a
user-defined bridge network of the engine's own.

::

    [ engine's network namespace (the host's, for a system dockerd) ]
      bridge vnb-<run>-b<k> 198.19.k.1, 2001:2:0:1kk::1   (made by dockerd: its veths, its iptables rules)
        ├── vethXXXX ──veth── eth0 198.19.k.2   container vnb-<run>-r   (image vnetbench-tools:<digest>)
        └── vethYYYY ──veth── eth0 198.19.k.3   container vnb-<run>-s1

Containers on one user-defined network reach each other at their own addresses, as users run them: the
path is the engine's bridge, veths and rules, not the lab's switch. Link conditions attach to that same
path: a receiver's bottleneck to the egress of its veth on the engine's bridge (toward it) and of its eth0
(from it), the link emulator spliced between the two, exactly as on the lab's switch.

With ``network = "host"`` there is no engine network: each container's own namespace is wired to the lab's
switch as a bare endpoint's is, and only the container itself (cgroup, seccomp, exec path) is measured.

Workload tools run inside the containers (`docker exec`, `podman --remote exec`: the engine's seccomp profile,
capabilities and cgroup apply to them) from the tools image built of this machine's files
(:mod:`vnetbench.lab.engines`).
Each container's network namespace is given a name (``ip netns attach``), so tc, ethtool and the ss
sampler (workloads/ss.py) reach it like any namespace of the lab; the engine's own namespace is attached under a name
`vnetbench clean` only unmounts (its processes are the engine's, never ours).
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Literal, Sequence

from pydantic import Field

from vnetbench.errors import EnvironmentUnavailable, LabError
from vnetbench.lab import cgroups, engines, netns
from vnetbench.lab.environments.base import (Attached, Capability, Endpoint, LabContext, NamespaceEnvironment,
                                             Subnet, register, wired_namespace)
from vnetbench.lab.environments.container import ContainerLimits, container_memory_problem, cpuset_problem
from vnetbench.lab.guest import initramfs
from vnetbench.lab.nodes import IFA_F_NODAD, Interface, Namespace, RunsCommands, placement_entry
from vnetbench.lab.teardown import Registry, atomic

DAD_WAIT_S = 5.0  # IPv6 addresses of a new container are tentative for about a second (duplicate detection)
IFA_F_TENTATIVE = 0x40


class EngineNode(RunsCommands):
    """A container as the lab sees a node: :class:`vnetbench.lab.nodes.NamespaceNode`'s interface, through the engine.
    A started command's input is a pipe this process holds (the Popen's), closed when the process is reaped or
    killed, which ends the command inside the container too (engines.EXEC_WRAPPER)."""

    stdin_of_started = subprocess.PIPE
    timed_by_wrapper = True  # the container's vnb-exec says a timed command's CPU time

    def __init__(self, name: str, engine: engines.Engine, container: Any, ns: Namespace, registry: Registry,
                 ipv4: str, ipv6: str, cpu: int | None, facts: dict[str, Any], iface: Interface,
                 published: tuple[str, str] | None = None):
        self.name, self.engine, self.container, self.ns, self.registry = name, engine, container, ns, registry
        self.ipv4, self.ipv6, self.cpu = ipv4, ipv6, cpu
        self.published = published  # the engine host's (v4, v6) addresses its servers are published on
        self.iface = iface
        self.env_facts = facts
        self.extra: dict[str, Any] = {}

    def address(self, ip_version: int) -> str:
        return self.ipv6 if ip_version == 6 else self.ipv4

    def service_address(self, ip_version: int) -> str:
        if self.published:  # through the engine: its userland proxy, or its NAT rules without one
            return self.published[1] if ip_version == 6 else self.published[0]
        return self.address(ip_version)  # a user-defined network: containers reach each other directly

    def echo_address(self, ip_version: int) -> str:
        return self.address(ip_version)  # the engine's host would answer echo requests to a published address

    def facts(self) -> dict[str, Any]:
        return dict(self.env_facts)

    def placement(self) -> dict[str, Any]:
        published = " ".join(a for a in (self.published or ()) if a) or None
        return placement_entry(f"{self.engine.kind} container {self.container.name} (namespace {self.ns.name})",
                               self.ipv4, self.ipv6, self.iface.name, self.cpu, published=published)

    def command(self, argv: Sequence[str], pin: bool = True, timed: bool = False) -> list[str]:
        cpus = str(self.cpu) if pin and self.cpu is not None else None
        return engines.exec_argv(self.engine, self.container.name, argv, cpus, timed)


class EngineOptions(ContainerLimits):
    """The container environment's limits, applied by the engine (docker run --cpus, --cpuset-cpus, --memory),
    published ports (docker run -p) and the engine network the containers are on (docker run --network)."""

    publish: bool | None = Field(default=None, description="env=docker or podman: reach the receiver's servers through "
                                 "ports published on the engine's host (docker run -p), as clients outside its network "
                                 "do: the engine's userland proxy or its NAT rules carry them")
    network: Literal["bridge", "host", "overlay"] | None = Field(
        default=None, description="env=docker or podman: the engine network the containers are on: 'bridge' (a "
        "user-defined bridge network, the default), 'host' (no engine network: each container has its endpoint's "
        "own host network on the lab's switch, as --network host on a machine of its own), 'overlay' (Docker's "
        "swarm VXLAN overlay; said unavailable on one engine, with the reason)")


class DockerOptions(EngineOptions):
    """A dockerd setting besides: Podman has no userland proxy."""

    userland_proxy: bool | None = Field(
        default=None, description="env=docker with publish = true: the engine must carry published ports through "
        "docker-proxy (true) or NAT rules only (false), as dockerd --userland-proxy; checked before the run "
        "(the setting is the daemon's: DOCKER_HOST chooses a daemon started with it)")


class EngineEnvironment(NamespaceEnvironment):
    """Endpoints as containers of a real engine: its `kind` names the engine (engines.DEFAULT_URLS) as well."""

    Options = EngineOptions
    setup_s = 0.5

    @classmethod
    def capabilities(cls, variant: Any | None, kernel: dict[str, str | None] | None) -> list[Capability]:
        engine, detail = engines.probe(cls.kind)
        if engine is None:
            what, _, fix = detail.partition(" -> ")
            return [Capability(cls.kind, False, what, fix)]
        caps = [Capability(cls.kind, True, detail)]
        # What the engine says its cgroups can limit (docker info), for the limits this variant sets.
        for option, key in (("cpu_quota", "CpuCfsQuota"), ("cpuset", "CPUSet"), ("memory_limit", "MemoryLimit")):
            if variant is not None and getattr(variant, option) is None:
                continue
            ok = bool(engine.info.get(key))
            caps.append(Capability(f"{cls.kind} {option}", ok, f"the engine {'can' if ok else 'cannot'} apply it "
                                   f"({cls.kind} info: {key} {engine.info.get(key)})",
                                   "" if ok else "a kernel and cgroup setup that gives the engine this controller"))
        why = cpuset_problem(variant.cpuset) if variant is not None else None
        if why:
            caps.append(Capability(f"{cls.kind} cpuset", False, why, "choose CPUs that exist"))
        if variant is not None:
            caps += cls.network_capabilities(variant, engine)
        return caps

    @classmethod
    def network_capabilities(cls, variant: Any, engine: engines.Engine) -> list[Capability]:
        """Whether this variant's network choices can be had from this engine, and why not."""
        caps = []
        if variant.network == "overlay":
            caps.append(Capability(f"{cls.kind} network=overlay", False, *OVERLAY_UNAVAILABLE[cls.kind]))
        if variant.network == "host" and variant.publish:
            caps.append(Capability(f"{cls.kind} network=host publish", False, "a container on its host's network has "
                                   "no ports to publish: its servers listen on the host's own addresses",
                                   "drop publish, or use network = \"bridge\""))
        if variant.userland_proxy is not None:
            actual = engine.userland_proxy()
            wanted = "true" if variant.userland_proxy else "false"
            ok = actual is variant.userland_proxy
            caps.append(Capability(
                f"{cls.kind} userland_proxy={wanted}", ok,
                f"the engine at {engine.url} runs with --userland-proxy="
                + ("(unreadable)" if actual is None else str(actual).lower()),
                "" if ok else f"start a dockerd with --userland-proxy={wanted} (or \"userland-proxy\": {wanted} in its "
                "daemon.json) and point DOCKER_HOST at it, or drop userland_proxy to measure the engine as it runs"))
        return caps

    @classmethod
    def memory_problem(cls, variant: Any, needed: int) -> str | None:
        return container_memory_problem(variant, needed)

    @classmethod
    def tool_problems(cls, variant: Any, tools: list[tuple[str, str]]) -> list[str]:
        return initramfs.guest_problems(tools, where="container image")

    def __init__(self, ctx: LabContext, variant: Any):
        super().__init__(ctx, variant)
        self.engine = engines.connect(self.kind)
        self.ulimits = self.engine.ulimits() or None  # the same for every container of this engine
        self.image: engines.ToolsImage | None = None
        self.network: Any = None
        self.subnet: Subnet | None = None
        self.engine_ns: Namespace | None = None
        self._next_host = 2
        self._senders = 0
        self.cpu_accounts: list[cgroups.CpuAccount] = []  # each container's cgroup, by endpoint
        # Each endpoint on the lab's network (host_namespace): its container and that container's pid
        self._lab_network_containers: dict[str, tuple[Any, int]] = {}

    # ------------------------------------------------------------ the network, once per variant

    def _prepare(self, mtu: int) -> None:
        ctx, reg = self.ctx, self.ctx.registry
        self.subnet = self._free_subnet()
        self.engine_ns = attach_namespace(netns.foreign_name(ctx.run_prefix, f"engine{self.subnet.index}"),
                                          self.engine.daemon_pid(), reg)
        import docker.types

        ipam = docker.types.IPAMConfig(pool_configs=[
            docker.types.IPAMPool(subnet=self.subnet.cidr4, gateway=self.subnet.v4(1)),
            docker.types.IPAMPool(subnet=self.subnet.cidr6, gateway=self.subnet.v6(1))])
        name = f"{ctx.run_prefix}-b{self.subnet.index}"  # also the bridge's name: at most 15 characters
        with atomic(), self._errors(f"creating network {name} ({self.subnet.cidr4}, {self.subnet.cidr6})"):
            self.network = self.engine.client.networks.create(
                name, driver="bridge", ipam=ipam, enable_ipv6=True, labels={engines.LABEL_RUN: ctx.run_prefix},
                options={"com.docker.network.bridge.name": name, "com.docker.network.driver.mtu": str(mtu)})
            reg.add(f"{self.kind} network {name}", lambda: _quietly_remove(self.network))
        if not self.engine_ns.has(name):
            self._make_bridge(name, mtu)
        self._prepare_bridge()
        engines.forget_cni_state(name)  # another run's of this name, long gone: allocation starts afresh

    def _make_bridge(self, name: str, mtu: int) -> None:
        """The network's bridge, made before any container joins it, for an engine whose network backend makes
        it only when a first container joins (Podman's CNI or netavark; Docker makes it with the network). The
        backend then takes this one as it finds it and gives it the gateway addresses; without duplicate
        address detection on it, the IPv6 one is usable at once. Otherwise a receiver that publishes ports and
        joins first races the detection: Podman binds the published ports on the gateway addresses right after
        the backend has set them up, and the bind fails while the address is tentative (seen: "cannot listen on
        the TCP port: listen tcp6 [2001:2:0:106::1]:5201: bind: cannot assign requested address")."""
        ns = self.engine_ns
        assert ns is not None
        with atomic():
            ns.ipr.link("add", ifname=name, kind="bridge", mtu=mtu)
            self.ctx.registry.add(f"bridge {name}", lambda: ns.has(name) and ns.ipr.link("del", index=ns.index(name)))
        ns.sysctl(f"net.ipv6.conf.{name}.accept_dad", "0")
        ns.link_up(name)

    def _prepare_bridge(self) -> None:
        # The bridge's gateway addresses are the engine host's on this network, where published ports listen
        # (Docker's userland proxy binds them as the container starts; Podman as it sets the container up).
        _without_duplicate_detection(self.engine_ns, f"bridge {self.network.name}", ifname=self.network.name)

    def _free_subnet(self) -> Subnet:
        """The lab's next subnet that no network of the engine overlaps (another run's, or the user's own)."""
        taken = [ipaddress.ip_network(pool["Subnet"], strict=False)
                 for net in self.engine.client.api.networks()
                 for pool in ((net.get("IPAM") or {}).get("Config") or []) if pool.get("Subnet")]
        while True:
            subnet = self.ctx.new_subnet()  # a LabError once 198.19.0.0/16 is used up
            mine = (ipaddress.ip_network(subnet.cidr4), ipaddress.ip_network(subnet.cidr6))
            if not any(m.version == t.version and m.overlaps(t) for m in mine for t in taken):
                return subnet

    # ------------------------------------------------------------ endpoints

    def on_lab_network(self) -> bool:
        """A container on an engine network (``network = "bridge"``) is on the engine's bridge, which the engine
        makes; one with its host's network (``network = "host"``, and every declared topology's host) is on
        the lab's, as a bare endpoint."""
        return self.variant.network == "host" or not self.ctx.engine_networks

    def host_namespace(self, endpoint: Endpoint) -> str:
        """A container on the lab's network is a container of its own with no engine network (`--network none`,
        as containerlab's nodes; Docker cannot join a namespace it did not make): the lab wires its links and
        addresses into the container's namespace, named here as the lab names an endpoint's. With
        ``network = "host"`` that is what `--network host` is on a machine of its own."""
        if self.image is None:
            self.image = engines.tools_image(self.engine)
        # Docker turns IPv6 off in a container without an IPv6 network; this one gets the lab's, so it is on.
        container, pid = self._start_container(endpoint, "none", sysctls={
            **container_sysctls(), "net.ipv6.conf.all.disable_ipv6": "0", "net.ipv6.conf.default.disable_ipv6": "0"})
        ns = attach_namespace(self.ctx.ns_name(endpoint.name), pid, self.ctx.registry)
        self._lab_network_containers[endpoint.name] = (container, pid)
        return ns.name

    def attach(self, endpoint: Endpoint) -> Attached:
        if self.image is None:
            self.image = engines.tools_image(self.engine)
        if endpoint.name in self._lab_network_containers:
            return self._attach_on_lab_network(endpoint)
        ctx, reg = self.ctx, self.ctx.registry
        if self.network is None:
            self._prepare(endpoint.mtu)
        assert self.subnet is not None and self.engine_ns is not None
        host_number = self._next_host
        self._next_host += 1
        v4, v6 = self.subnet.v4(host_number), self.subnet.v6(host_number)
        client = self.engine.client
        endpoint_config = client.api.create_endpoint_config(ipv4_address=v4, ipv6_address=v6)
        if not endpoint.receiver:
            self._senders += 1
            if self.variant.publish and self._senders > PUBLISHED_SENDERS:
                raise LabError(f"publish = true publishes iperf3's ports for {PUBLISHED_SENDERS} senders, and this lab "
                               f"has more: use at most {PUBLISHED_SENDERS} senders with it")
        published = (self.subnet.v4(1), self.subnet.v6(1)) if self.variant.publish and endpoint.receiver else None
        ports = server_ports() if published else []
        container, pid = self._start_container(
            endpoint, self.network.name, ports=ports,
            # On the engine host's address on this network only: nothing of the run is reachable from the
            # machine's own networks.
            port_bindings={f"{port}/{proto}": [(published[0], port), (published[1], port)]
                           for port, proto in ports} if published else None,
            networking_config=client.api.create_networking_config({self.network.name: endpoint_config}))
        ns = attach_namespace(ctx.ns_name(endpoint.name), pid, reg)
        uplink = Interface(ns, "eth0")
        port = Interface(self.engine_ns, _peer_name(ns, self.engine_ns))
        _without_duplicate_detection(ns, f"container {container.name}")
        facts = self._facts(container, pid, ns, v4, v6, network=self.network.name)
        if published:
            facts["published"] = {"address": list(published), "ports": [f"{p}/{proto}" for p, proto in ports],
                                  "userland_proxy": self.engine.userland_proxy(),
                                  "proxy_processes": len(_proxies_for(v4))}
        host = EngineNode(endpoint.name, self.engine, container, ns, reg, v4, v6, self._cpu(endpoint), facts,
                          uplink, published)
        bridge = Interface(self.engine_ns, self.network.name)
        att = Attached(node=host, port=port, uplink=uplink, offload_ifaces=[uplink, port, bridge])
        self.attached.append(att)
        return att

    def _attach_on_lab_network(self, endpoint: Endpoint) -> Attached:
        """The container :meth:`host_namespace` made, once the lab has wired its namespace."""
        container, pid = self._lab_network_containers[endpoint.name]
        wired = wired_namespace(self.ctx, endpoint.name)
        network = "host (its own namespace on the lab's switch, as a bare endpoint)" if self.variant.network == \
            "host" else "none of the engine's: a declared topology's host, its links in the container"
        facts = self._facts(container, pid, wired.ns, wired.ipv4, wired.ipv6, network=network)
        host = EngineNode(endpoint.name, self.engine, container, wired.ns, self.ctx.registry, wired.ipv4,
                          wired.ipv6, self._cpu(endpoint), facts, wired.iface)
        att = Attached(node=host, port=wired.port, uplink=wired.iface, offload_ifaces=[wired.iface])
        self.attached.append(att)
        return att

    def _start_container(self, endpoint: Endpoint, network_mode: str, **create: Any) -> tuple[Any, int]:
        """A container of the tools image for this endpoint, started (labelled, removed at teardown); its pid."""
        assert self.image is not None
        name = self.ctx.ns_name(endpoint.name)
        client = self.engine.client
        port_bindings, networking_config = create.pop("port_bindings", None), create.pop("networking_config", None)
        sysctls = create.pop("sysctls", container_sysctls())
        with atomic(), self._errors(f"creating container {name} from {self.image.tag}"):
            created = client.api.create_container(
                self.image.tag, command=["sleep", "2147483647"], name=name, hostname=endpoint.name,
                labels={engines.LABEL_RUN: self.ctx.run_prefix}, networking_config=networking_config,
                host_config=client.api.create_host_config(
                    init=True, network_mode=network_mode, sysctls=sysctls, cap_add=CAP_ADD,
                    ulimits=self.ulimits, port_bindings=port_bindings, **self._limits()),
                **create)
            container = client.containers.get(created["Id"])
            self.ctx.registry.add(f"{self.kind} container {name}", lambda: _quietly_remove(container))
        with self._errors(f"starting container {name}"):
            container.start()
            container.reload()
        pid = container.attrs["State"]["Pid"]
        if (account := cgroups.cpu_account(endpoint.name, pid)) is not None:
            self.cpu_accounts.append(account)
        return container, pid

    def _cpu(self, endpoint: Endpoint) -> int | None:
        # A cpuset confines the container's processes; pinning them elsewhere would contradict it.
        return None if self.variant.cpuset else endpoint.cpu

    def _facts(self, container: Any, pid: int, ns: Namespace, v4: str, v6: str, network: str) -> dict[str, Any]:
        assert self.image is not None
        facts = {"env": self.kind, "container": container.name, "container_id": container.id[:12],
                 "image": self.image.tag, "network": network, "address": [v4, v6], "netns": ns.name,
                 "cap_add": CAP_ADD, "engine": f"{self.engine.kind} {self.engine.version.get('Version')}"}
        if self._limits():
            applied = container.attrs["HostConfig"]
            facts["limits"] = {"engine": {k: applied.get(k) for k in ("NanoCpus", "CpusetCpus", "Memory")},
                               "cgroup": cgroups.read_limits(cgroups.dirs_of(pid))}
        return facts

    def _limits(self) -> dict[str, Any]:
        """The variant's limits as the engine's host configuration takes them."""
        v = self.variant
        out: dict[str, Any] = {}
        if v.cpu_quota is not None:
            out["nano_cpus"] = round(v.cpu_quota * 1e9)
        if v.cpuset:
            out["cpuset_cpus"] = v.cpuset
        if v.memory_limit:
            out["mem_limit"] = int(v.memory_limit)
        return out

    def _errors(self, doing: str) -> Any:
        return engine_errors(doing, self.kind)

    def cpu_parts(self) -> dict[str, list[Any]]:
        return {"container": list(self.cpu_accounts)}

    def cpu_part_of(self, endpoint: str) -> str | None:
        return "container" if any(account.label == endpoint for account in self.cpu_accounts) else None

    def facts(self) -> dict[str, Any]:
        return {"env": self.kind, "limits": self._limits(), "model": "the engine's own bridge network (user-defined), containers from "
                "the tools image", **self.engine.describe(),
                "network": self.network.name if self.network is not None else None,
                "subnets": [self.subnet.cidr4, self.subnet.cidr6] if self.subnet else None,
                "image": {"tag": self.image.tag, "id": self.image.id, **self.image.manifest} if self.image else None}


@register
class DockerEnvironment(EngineEnvironment):
    kind = "docker"
    tag = "d"
    Options = DockerOptions


# Why network = "overlay" cannot be measured on one engine: (what, what to do instead).
OVERLAY_UNAVAILABLE = {
    "docker": ("Docker's overlay needs swarm mode, and on one engine every container is on one node, where the "
               "overlay joins them with a plain bridge inside its own namespace: VXLAN is crossed only between two "
               "nodes, so nothing of the overlay's cost would be measured",
               "env = \"overlay\" measures VXLAN (and routed overlays) between the lab's own nodes; Docker's overlay "
               "between two engines needs two machines"),
    "podman": ("Podman has no overlay network driver (bridge, macvlan and ipvlan only)",
               "env = \"overlay\" measures VXLAN between the lab's own nodes"),
}


@contextmanager
def engine_errors(doing: str, kind: str = "docker") -> Iterator[None]:
    """The engine's refusal as one LabError line (what was being done, and the engine's own words)."""
    import docker.errors

    try:
        yield
    except docker.errors.APIError as e:
        raise LabError(f"{kind} refused {doing}: {e.explanation or e}") from None


PUBLISHED_SENDERS = 16  # iperf3 servers published (one per sender) when publish = true


def server_ports() -> list[tuple[int, str]]:
    """Every port a workload's server listens on (all on the receiver), TCP and UDP: what publish = true
    publishes. Kept to these (42 ports): with the userland proxy on, each is a docker-proxy process."""
    from vnetbench.workloads import ab, iperf3, irtt, sockperf, wrk

    ports = [*range(iperf3.BASE_PORT, iperf3.BASE_PORT + PUBLISHED_SENDERS), sockperf.UDP_PORT, sockperf.TCP_PORT,
             wrk.PORT, ab.PORT, irtt.PORT]
    return [(port, proto) for port in sorted(set(ports)) for proto in ("tcp", "udp")]


def _proxies_for(container_ip: str) -> list[int]:
    """The engine's docker-proxy processes forwarding to this container (none without the userland proxy)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"docker-proxy") and container_ip.encode() in argv:
            found.append(int(entry))
    return found


def container_sysctls() -> dict[str, str]:
    """Set through the engine, as a user would (`docker run --sysctl`): IPv6 addresses usable at once."""
    return {"net.ipv6.conf.all.accept_dad": "0", "net.ipv6.conf.default.accept_dad": "0"}


# Added to Docker's default capabilities: a socket may only choose a congestion control from the global
# net.ipv4.tcp_allowed_congestion_control (not settable per namespace) unless it has CAP_NET_ADMIN, so
# without it a scenario's `congestion_control = "cubic"` would fail in a container and run everywhere else.
# It changes what a process may configure, not the path its packets take.
CAP_ADD = ["NET_ADMIN"]


def attach_namespace(name: str, pid: int, registry: Registry) -> Namespace:
    """Give the network namespace of process `pid` a name (``ip netns attach``), for as long as the lab."""
    if netns.exists(name):
        raise LabError(f"namespace {name} already exists: a run with this id is active, or run `vnetbench clean`")
    with atomic():
        netns.attach(name, pid)
        registry.add(f"namespace name {name}", lambda: netns.remove(name))
        ipr = netns.open_iproute(name)
        registry.add(f"netlink socket of {name}", ipr.close)
    return Namespace(name, ipr)


def _peer_name(ns: Namespace, engine_ns: Namespace) -> str:
    """The engine-side end of the container's eth0: its veth on the bridge."""
    link = ns.ipr.get_links(ns.index("eth0"))[0]
    peer_index = link.get_attr("IFLA_LINK")
    found = engine_ns.ipr.get_links(peer_index)
    if not found:
        raise LabError(f"the peer of eth0 in {ns.name} (index {peer_index}) is not in the engine's namespace")
    return found[0].get_attr("IFLA_IFNAME")


def _without_duplicate_detection(ns: Namespace, what: str, ifname: str = "eth0") -> None:
    """Make an interface's IPv6 addresses usable now (a container's eth0, the network's bridge). The engine
    configures eth0 before the container's sysctls (accept_dad = 0) apply, so its addresses start tentative and
    wait 1-2 s for duplicate address detection (measured: 1.9 s of a 2.2 s bring-up per container); a published
    port cannot even be bound to the bridge's address meanwhile. Each tentative one is put back as it was, with the
    flag the lab's own addresses carry (no detection: the addresses are the lab's plan, unique by
    construction); what is still tentative after that is waited for, within DAD_WAIT_S."""
    index = ns.index(ifname)

    def tentative() -> list[Any]:
        return [a for a in ns.ipr.get_addr(index=index, family=10)
                if (a["flags"] | (a.get_attr("IFA_FLAGS") or 0)) & IFA_F_TENTATIVE]

    for a in tentative():
        address, prefixlen = a.get_attr("IFA_ADDRESS"), a["prefixlen"]
        ns.ipr.addr("del", index=index, address=address, prefixlen=prefixlen)
        ns.ipr.addr("add", index=index, address=address, prefixlen=prefixlen, flags=IFA_F_NODAD)
    deadline = time.monotonic() + DAD_WAIT_S
    while left := tentative():
        if time.monotonic() > deadline:
            raise EnvironmentUnavailable(f"{what}: {', '.join(a.get_attr('IFA_ADDRESS') for a in left)} "
                                         f"still tentative after {DAD_WAIT_S:g} s (IPv6 duplicate address detection)")
        time.sleep(0.05)


def _quietly_remove(obj: Any) -> None:
    """Remove a container (with its processes) or a network (with CNI's bookkeeping of its addresses); one
    already gone is fine."""
    import docker.errors

    try:
        if hasattr(obj, "kill"):
            obj.remove(force=True, v=True)
        else:
            obj.remove()
    except docker.errors.NotFound:
        pass
    if not hasattr(obj, "kill"):
        engines.forget_cni_state(obj.name)
