"""Typed models of a scenario file (:class:`Scenario` shows a whole one).

Quantities are parsed here (see :mod:`vnetbench.units`) so the rest of the code
only sees numbers in base units: bits/s, bytes, seconds.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, create_model, field_validator,
                      model_validator)

from vnetbench import quantities, units
from vnetbench.impair.model import (BACKENDS, Delay, LinkBuffer, LinkSpec, LossSpec, Schedule, buffer_bytes_in_range,
                                    frame_bytes, lab_links, link_rate, same_value, short_hand_conflicts)
from vnetbench.lab import environments
from vnetbench.errors import ScenarioError
from vnetbench.scenario.names import RULE, require_name
from vnetbench.topology.spec import TopologySpec
from vnetbench.workloads import iperf3, ping, registry, ss

MATRIX_AXES_EXTRA = ("ratio",)


_rate, _size, _duration = quantities.rate, quantities.size, quantities.duration
Rate, Size, Duration = quantities.Rate, quantities.Size, quantities.Duration


# The lab's buffer is a link buffer: bytes, or time at the bottleneck's rate ("500kB", "40ms").
Buffer = LinkBuffer


IPV6_MIN_MTU = 1280


# The lab's keys that condition the link named "bottleneck" (impair.model.bottleneck_from_lab).
BOTTLENECK_SHORT_HANDS = ("bottleneck", "buffer", "delay", "jitter", "loss", "backend", "bottleneck_schedule", "shape")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class _Lab(Strict):
    """The testbed: a dumbbell whose endpoints attach through an environment.

    ``senders = "auto"`` follows the thesis' algorithms 1 and 2: two senders up
    to ratio 2, three up to ratio 3, four above. ``bottleneck = "unlimited"``
    installs no shaping (environment comparisons measure the path itself).

    ``env`` says how every endpoint (receiver and senders) attaches to the
    switch (see :mod:`vnetbench.lab.environments`); the options after it apply
    to one environment each and are rejected elsewhere. Being lab fields they
    are sweepable; a matrix value that is an inline table sets several at once:
    ``env = [{env="bare"}, {env="vm", nic="e1000"}, {env="overlay", overlay="routed"}]``.
    An entry with ``if_available = true`` (``{env="docker", if_available=true}``)
    runs where this machine can build it and is left out, said so, elsewhere.
    """

    topology: Literal["dumbbell"] = Field(default="dumbbell", description="senders -> switch -> bottleneck port "
                                          "-> receiver (a [topology] table declares any other)")
    senders: int | Literal["auto"] = Field(default="auto", description="how many senders (1 to 64); auto: 2 up to "
                                           "ratio 2, 3 up to 3, 4 above")
    bottleneck: float | None = Field(default=100e6, description="rate of the switch port toward the receiver, "
                                                                "or 'unlimited' (no shaping); default 100 Mbit/s, "
                                                                "and unlimited for a scenario with a [hosts] table")
    mtu: int = Field(default=1500, ge=576, le=9000, description="MTU of every link of the lab (IPv6 needs 1280 "
                                                                "or more)")
    buffer: Buffer = Field(default_factory=lambda: Buffer(bytes=500_000), description="the bottleneck's queue "
                           "limit: bytes (\"500kB\") or a time at its rate (\"40ms\")")
    qdisc: Literal["tbf", "htb"] = Field(default="tbf", description="the kernel qdisc that holds a link's rate and "
                                         "buffer (its rate qdisc): tbf, or htb with a byte FIFO")
    shape: Literal["forward", "reverse", "both"] = Field(
        default="forward", description="the direction(s) of the bottleneck link the lab-level short-hands "
        "(bottleneck, buffer, delay, jitter, loss, bottleneck_schedule) apply to; forward = the stream's way")
    ip_version: Literal[4, 6] = Field(default=4, description="which of the lab's addresses the workloads use "
                                      "(IPv4 198.18.0.0/15 and IPv6 2001:2::/48 are both configured)")
    pin_cpus: bool = Field(default=True, description="pin workload processes: the receiver on the last CPU, "
                           "senders on the others (the whole run's: not a matrix axis)")
    idle_cores: Literal["pm-qos", "poll"] = Field(
        default="pm-qos", description="what the machine's idle cores do while the lab is up: pm-qos asks the "
        "kernel for 0 us of wake-up latency (honoured where it has a cpuidle driver; without one, as on many VMs, "
        "idle cores halt and a process woken after sleeping through a delay starts late); poll also keeps them "
        "polling there (vnb-link idle-poll: the cores' whole time, of the hypervisor's CPU too) (the whole run's: "
        "not a matrix axis)")
    # Link conditions (vnetbench.impair.model). Short-hands for the "bottleneck" link (the switch port toward
    # the receiver), in the `shape` direction(s); [lab.link.NAME] gives any link conditions per direction.
    delay: Delay = Field(default=0.0, description="one-way delay added on the bottleneck, in each `shape` "
                                                     "direction (forward: the RTT grows by delay)")
    jitter: Delay = Field(default=0.0, description="delay variation on the bottleneck (normal, sd = jitter)")
    loss: LossSpec = Field(default_factory=LossSpec, description="loss on the bottleneck: '1%' (Bernoulli) or "
                                                                 "{model = \"gilbert_elliott\", p = ..., r = ...}")
    backend: Literal[BACKENDS] = Field(  # type: ignore[valid-type]
        default="auto", description="who emulates the bottleneck: auto = tbf/htb for rate and buffer alone, netem "
                                    "where the kernel has it, else the userspace emulator vnb-link")
    bottleneck_schedule: str | None = Field(default=None, description="the bottleneck's rate over time: "
                                            "'100Mbit/5s 20Mbit/5s' (repeating) or 'trace:FILE' (Mahimahi)")
    link: dict[str, LinkSpec] = Field(default_factory=dict, description="conditions per link and direction: "
                                      "[lab.link.bottleneck], [lab.link.s1], ... (forward = the stream's way)")
    env: Literal[environments.KINDS] = Field(default="bare", description="how endpoints attach")  # type: ignore
    offload: Literal["on", "off"] = Field(default="on", description="TSO, GSO, GRO and checksum offload on the "
                                                                    "endpoints' interfaces (host and guest side)")
    # Set once for the whole run (the lab is built and held with them): no matrix axis may vary them.
    RUN_WIDE: ClassVar[tuple[str, ...]] = ("pin_cpus", "idle_cores")
    # Which environment each option belongs to (each environment's module declares its own).
    ENV_OPTIONS: ClassVar[dict[str, tuple[str, ...]]] = environments.option_owners()

    @field_validator("bottleneck", mode="before",
                     json_schema_input_type=quantities.WrittenRate | quantities.UnlimitedText)
    @classmethod
    def _bottleneck(cls, v: Any) -> Any:
        if v is None or (isinstance(v, str) and v.strip().lower() in ("unlimited", "none")):
            return None
        return link_rate(_rate(v), v)

    @model_validator(mode="after")
    def _env_options(self) -> "_Lab":
        wrong = [f"{k} = {units.brief(getattr(self, k))}" for k, envs in self.ENV_OPTIONS.items()
                 if getattr(self, k) is not None and self.env not in envs]
        if wrong:
            owners = sorted({e for w in wrong for e in self.ENV_OPTIONS[w.split(" ")[0]]})
            raise ValueError(
                f"{', '.join(wrong)} {'applies' if len(wrong) == 1 else 'apply'} to env = "
                f"{' / '.join(repr(o) for o in owners)} only, but env = {self.env!r}: remove it, or set it together "
                f"with its environment in one matrix entry, e.g. env = [{{env = \"bare\"}}, "
                f"{{env = \"{owners[0]}\", {wrong[0].replace(' = ', ' = ', 1)}}}]"
            )
        return self

    @model_validator(mode="after")
    def _ipv6_mtu(self) -> "_Lab":
        if self.ip_version == 6 and self.mtu < IPV6_MIN_MTU:
            raise ValueError(f"mtu = {self.mtu} with ip_version = 6: IPv6 needs links of at least {IPV6_MIN_MTU} "
                             "bytes (RFC 8200); raise mtu or use ip_version = 4")
        return self

    @field_validator("senders")
    @classmethod
    def _senders(cls, v: Any) -> Any:
        if isinstance(v, int) and not 1 <= v <= 64:
            raise ValueError(f"{v}: senders must be between 1 and 64 (or \"auto\")")
        return v

    @field_validator("link", mode="before")
    @classmethod
    def _link_names(cls, v: Any) -> Any:
        # Which names exist depends on the topology: the scenario checks them (Scenario._link_names).
        for name in v if isinstance(v, dict) else ():
            require_name(name, "link")
        return v

    @field_validator("bottleneck_schedule")
    @classmethod
    def _bottleneck_schedule(cls, v: str | None) -> str | None:
        if v is not None and v.strip().lower() not in ("", "none"):
            Schedule.model_validate(Schedule.parse_text(v))
            return v
        return None

    @model_validator(mode="after")
    def _links(self) -> "_Lab":
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
        buffer_bytes_in_range(size, f"{v} at {units.format_rate(rate)}")
        if size < frame_bytes(mtu):
            raise ValueError(
                f"{v} is {size:.0f} B at {units.format_rate(rate)}, smaller than one full-size frame "
                f"({frame_bytes(mtu)} B): nothing could be queued; give at least {units.format_size(frame_bytes(mtu))}"
            )
        return v


# The lab table: its own fields, then each environment's options as the environment's module declares them
# (vnetbench.lab.environments: a new environment's options need no line here).
LabSpec = create_model("LabSpec", __base__=_Lab, __doc__=_Lab.__doc__, __module__=__name__,
                       **{name: (info.annotation, info) for name, info in environments.option_fields().items()})


# Each tool's options live in its workload module (vnetbench.workloads.<tool>.Options); these names are
# the ones the rest of the code and earlier versions used for the three first tools.
StreamWorkload = iperf3.Options
ProbeWorkload = ping.Options
SsWorkload = ss.Options
FlowTiming = iperf3.FlowTiming
Workload = registry.options_union()


def _default(model: type[BaseModel], key: str) -> Any:
    f = model.model_fields[key]
    return f.default_factory() if f.default_factory else f.default  # type: ignore[call-arg]


def _fraction(v: Any) -> Any:
    """'5%', '0.05' or 0.05 -> 0.05 (range checked by the field validator)."""
    if v is None or isinstance(v, (int, float)) and not isinstance(v, bool):
        return v
    try:
        return units.parse_percent(str(v))
    except units.UnitError:
        raise ValueError(f"{units.brief(v)} is not a fraction; write a percentage (\"5%\") or a fraction (0.05)") from None


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

    repetitions: int = Field(default=5, ge=1, le=1000, description="trials per configuration (adaptive: the "
                             "fewest, when min is not given)")
    min: int | None = Field(default=None, ge=1, le=1000, description="adaptive: fewest trials per configuration")
    max: int | None = Field(default=None, ge=1, le=1000, description="adaptive: most trials per configuration")
    target_ci: Annotated[float | None,
                         BeforeValidator(_fraction, json_schema_input_type=quantities.WrittenFraction)] = Field(
        default=None, description="adaptive: target relative width of the median's 95% CI, e.g. \"5%\"")
    key_metrics: list[str] = Field(default_factory=lambda: ["throughput.rx_mbps"],
                                   description="adaptive: the metrics whose precision decides when to stop")
    order: Literal["interleaved", "sequential"] = Field(
        default="interleaved", description="interleaved: each round runs every configuration once, in a fresh "
        "random order (seeded), so drift spreads evenly; sequential: a configuration's trials one after another")
    seed: int = Field(default=1, ge=0, le=2**63 - 1, description="seeds the trial order and the emulators' "
                                                              "randomness (a 64-bit integer, as SQLite stores it)")
    warmup: bool = Field(default=True, description="run one unrecorded trial of the first configuration first "
                         "(caches, ARP and TCP metrics to a steady state)")

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
            raise ValueError(f"unknown metric(s) {', '.join(map(units.brief, unknown[:5]))}"
                             f"{f' and {len(unknown) - 5:,} more' if len(unknown) > 5 else ''}; known: {', '.join(METRICS)}")
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


# An IPv6 scope id: a Linux interface name (dev_valid_name allows more, but not in an address that reaches
# command lines and output) or an interface index.
SCOPE_ID = re.compile(r"(?!\.{1,2}$)(?!-)[A-Za-z0-9_.-]{1,15}")


class KubeSpec(Strict):
    """Where the endpoints run when the scenario is run on a Kubernetes cluster (``vnetbench run --kube``): one
    pod per endpoint, on the node named, in the pod network or the node's own (``hostNetwork``). ``network`` and
    ``placement`` may be swept (``"kube.network" = ["pod", "host"]``, ``"kube.placement" = ["same-node",
    "cross-node"]``), and so may the nodes: the run makes a pod for each distinct endpoint, node and network."""

    receiver: str | None = Field(default=None, min_length=1, description="the node the receiver's pod runs on; "
                                 "unset: the cluster's first Ready node by name")
    senders: list[str] = Field(default_factory=list, description="the nodes the senders' pods run on, in order (the "
                               "last is repeated when the scenario uses more senders than nodes are named); with "
                               "placement = \"cross-node\" the cluster's other Ready nodes by default")
    placement: Literal["same-node", "cross-node"] | None = Field(
        default=None, description="'same-node': the senders' pods on the receiver's node (the path stays in the "
        "node); 'cross-node': on other nodes (across the network between them); unset: on the nodes `senders` names")
    network: Literal["pod", "host"] = Field(default="pod", description="the pods' network: 'pod' (the cluster's "
                                            "pod network, through its CNI) or 'host' (hostNetwork: the nodes' "
                                            "own, the baseline that shows the CNI's cost)")
    path: Literal["pod-ip", "service"] = Field(default="pod-ip", description="how the senders reach the receiver: "
                                               "'pod-ip' (its pod's address) or 'service' (a ClusterIP Service in "
                                               "front of it, through the cluster's Service proxy)")
    image: str | None = Field(default=None, description="the pods' image; default: vnetbench's tools image "
                              "(localhost/vnetbench/tools:DIGEST, built from this machine's files), which must "
                              "be loaded on the nodes, or is pushed to kube.registry")
    registry: str | None = Field(
        default=None, description="a registry the nodes pull from (host[:port][/path]): the run pushes vnetbench's "
        "tools image there first (skopeo, with this machine's registry credentials), as "
        "REGISTRY/vnetbench/tools:DIGEST, and the pods pull it; unset: the image is loaded on the nodes")
    registry_tls_verify: bool = Field(
        default=True, description="false: push to kube.registry over plain HTTP or an untrusted certificate "
        "(the nodes' container runtime must be told the same of it)")
    image_pull_policy: Literal["Never", "IfNotPresent", "Always"] | None = Field(
        default=None, description="as a pod's imagePullPolicy: 'Never' takes the image the nodes have; unset: "
        "'IfNotPresent' with kube.registry, else 'Never'")
    pod_security: Literal["privileged", "baseline"] = Field(
        default="privileged", description="the Pod Security Standards level the run's pods keep to: "
        "'privileged' (NET_ADMIN, to flush TCP's metrics before each trial; hostNetwork allowed) or 'baseline', "
        "for a cluster that enforces it (no capability added, no hostNetwork; TCP's metrics are then not "
        "flushed between trials, which the record says)")
    shape_pods: bool = Field(
        default=False, description="true: the scenario's link conditions (lab.bottleneck, [lab.link]) are made "
        "inside the pods, with the pods' kernel qdiscs on their own interface (tc in each pod's network namespace, "
        "NET_ADMIN): the bottleneck on the receiver's pod, link sN on the Nth sender's; nothing on the nodes "
        "changes. false: a scenario with link conditions is refused on a cluster")

    @field_validator("senders", mode="before", json_schema_input_type=str | list[str])
    @classmethod
    def _one_or_more(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

    @field_validator("registry")
    @classmethod
    def _registry(cls, v: str | None) -> str | None:
        from vnetbench.kube.image import registry_address

        return v if v is None else registry_address(v)

    @model_validator(mode="after")
    def _one_image(self) -> "KubeSpec":
        if self.registry and self.image:
            raise ValueError("kube.image and kube.registry both given: kube.registry is where vnetbench's tools image "
                             "is pushed; an image of your own needs none (drop one)")
        if self.registry and self.image_pull_policy == "Never":
            raise ValueError("kube.registry with kube.image_pull_policy = \"Never\": the nodes would never pull what "
                             "the run pushes (leave the policy unset, or \"IfNotPresent\" or \"Always\")")
        return self

    @property
    def pull_policy(self) -> str:
        return self.image_pull_policy or ("IfNotPresent" if self.registry else "Never")

    @model_validator(mode="after")
    def _placed(self) -> "KubeSpec":
        if self.placement == "same-node" and self.senders and any(n != self.receiver for n in self.senders):
            raise ValueError(f"kube.placement = \"same-node\" puts the senders on the receiver's node "
                             f"{self.receiver!r}, and kube.senders names {units.brief(self.senders)}: remove one")
        if self.placement == "cross-node" and self.receiver is not None and self.receiver in self.senders:
            raise ValueError(f"kube.placement = \"cross-node\" keeps the senders off the receiver's node "
                             f"{self.receiver!r}, and kube.senders names it: remove one")
        if self.pod_security == "baseline" and self.shape_pods:
            raise ValueError("kube.shape_pods = true changes the pods' interfaces, which needs NET_ADMIN, and Pod "
                             "Security's baseline level adds no capability: set kube.pod_security = \"privileged\" "
                             "where the cluster allows it, or remove the link conditions and kube.shape_pods")
        if self.pod_security == "baseline" and self.network == "host":
            raise ValueError("kube.network = \"host\" (hostNetwork) is what Pod Security's baseline level forbids: "
                             "set kube.network = \"pod\", or kube.pod_security = \"privileged\" where the "
                             "cluster allows it")
        return self


class HostsSpec(Strict):
    """Where the endpoints run when the scenario is run on real hosts (``vnetbench run --hosts INVENTORY``):
    inventory host or group names. ``addresses`` gives, per host, the address its peers send to when that is
    not the inventory's (a data-plane address beside the management one SSH uses)."""

    receiver: str | None = Field(default=None, min_length=1, description="the inventory host (or a group of one) "
                                 "the receiver runs on (the dumbbell's)")
    senders: list[str] = Field(default_factory=list, description="inventory hosts or groups the senders run on, in "
                               "order (a group: as many of its hosts as the scenario uses; the dumbbell's)")
    # A declared topology's hosts are placed by name: each host node its workloads run on -> the inventory host
    # (or group of one) it is. The topology's switches and routers stand for the network between the hosts.
    nodes: dict[str, str] = Field(default_factory=dict, description="a [topology]'s hosts: node name = the "
                                  "inventory host (or a group of one) it runs on")
    addresses: dict[str, str] = Field(default_factory=dict, description="per host, the address its peers send to, "
                                      "when not the inventory's (a data network beside SSH's)")
    # Per host, the interface its workloads' traffic must use (checked against the host's routes to the other
    # endpoints; link conditions go on it). Default: whichever the routes to the addresses use.
    interfaces: dict[str, str] = Field(default_factory=dict, description="per host, the interface its workloads' "
                                       "traffic must use (checked against its routes; link conditions go on it)")
    # How long a run waits for a host that dropped out (its ssh refused or timed out) to come back before it
    # stops, to be finished later with --resume.
    wait_for_host: Duration = Field(default=30.0, ge=0, le=24 * 3600, description="how long a run waits for a "
                                    "host that dropped out to answer again before it stops (to be resumed)")

    @field_validator("senders", mode="before", json_schema_input_type=str | list[str])
    @classmethod
    def _one_or_more(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

    @field_validator("receiver")
    @classmethod
    def _receiver(cls, v: str | None) -> str | None:
        return v if v is None else require_name(v)

    @field_validator("nodes")
    @classmethod
    def _nodes(cls, v: dict[str, str]) -> dict[str, str]:
        for node, host in v.items():
            require_name(node, "hosts.nodes key (a host of the topology)")
            require_name(host, f"hosts.nodes.{node} (an inventory host)")
        return v

    @field_validator("senders")
    @classmethod
    def _senders(cls, v: list[str]) -> list[str]:
        for name in v:
            require_name(name, "sender")
        return v

    @field_validator("addresses", "interfaces", mode="before")
    @classmethod
    def _host_keys(cls, v: Any, info: ValidationInfo) -> Any:
        for host in v if isinstance(v, dict) else ():
            require_name(host, f"hosts.{info.field_name} key (an inventory host)")
        return v

    @field_validator("interfaces")
    @classmethod
    def _interfaces(cls, v: dict[str, str]) -> dict[str, str]:
        for host, name in v.items():
            if not re.fullmatch(r"(?!\.{1,2}$)[^/:\s]{1,15}", name):
                raise ValueError(f"hosts.interfaces.{host} = {units.brief(name)} is not an interface name (1-15 characters, "
                                 "no '/', ':' or spaces)")
        return v

    @field_validator("addresses")
    @classmethod
    def _addresses(cls, v: dict[str, str]) -> dict[str, str]:
        for host, addr in v.items():
            try:
                ip = ipaddress.ip_address(addr)
            except ValueError:
                raise ValueError(f"hosts.addresses.{host} = {units.brief(addr)} is not an IP address") from None
            # ipaddress takes any text after "%" as an IPv6 scope id ("fe80::1%$(reboot)", newlines): it reaches
            # the tools' command lines and the output, so it must be what it stands for, an interface's name
            # (or index) on the peers that send to it.
            scope = getattr(ip, "scope_id", None)
            if scope is not None and not SCOPE_ID.fullmatch(scope):
                raise ValueError(f"hosts.addresses.{host} = {units.brief(addr)}: the scope id after '%' is not an "
                                 "interface name (letters, digits, '_', '.' or '-', at most 15, e.g. "
                                 "fe80::1%eth1)")
            # The address its peers send to: one that is everyone's own (loopback) or no one's sends the
            # traffic elsewhere. That it is on one of this host's interfaces is checked on the host when the
            # run starts (hosts/preflight.py).
            if ip.is_loopback or ip.is_unspecified or ip.is_multicast:
                raise ValueError(f"hosts.addresses.{host} = {units.brief(addr)} is a loopback, unspecified or "
                                 f"multicast address, not one of {host}'s own: give the address of its interface "
                                 "its peers reach it through")
        return v


class ScaleSpec(Strict):
    """Rates written for one line rate, run at another: ``line_rate`` is the rate the scenario's bandwidths and
    windows are written for (the study's), ``to`` the line rate this machine runs (a rate, or ``"measured"``:
    the link emulator's capacity that ``doctor --fidelity`` stored for this machine, else ``fallback``). Below
    the written rate, every bottleneck and link rate, every buffer given in bytes and every socket window and
    literal offered rate is scaled by the same factor (scenario/load.py), so ratios, queueing delays and the
    bandwidth-delay-product limits stay those of the study; above it, nothing changes."""

    line_rate: Rate = Field(description="the line rate the scenario's bandwidths and windows are written for")
    to: str = Field(default="measured", description="a rate, or 'measured' (doctor --fidelity's capacity)")
    fallback: Rate | None = Field(default=None, description="the line rate when nothing was measured on this "
                                  "machine (default: the written line_rate)")

    @field_validator("to")
    @classmethod
    def _to(cls, v: str) -> str:
        if v == MEASURED:
            return v
        quantities.rate(v)  # a ValueError names the value
        return v


MEASURED = "measured"


# The environments a declared topology's workload hosts can run in (runner/graph_bench.py): those that sit
# behind, or take over, a namespace the lab wires, and an engine's containers, whose namespaces the graph wires.
TOPOLOGY_ENVS = ("bare", "container", "overlay", "vm", "docker", "podman")


class Scenario(Strict):
    """A scenario says what lab to build, which parameters to sweep, which workloads to
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

        [hosts]                     # only with `run --hosts INVENTORY`: endpoints on real machines
        receiver = "server-a"
        senders = ["client-1"]
    """

    name: str = Field(description=f"what the scenario is called ({RULE.removeprefix('a name is ')})")
    description: str = Field(default="", description="one line for people: plan, show and the report print it")
    lab: LabSpec = Field(default_factory=LabSpec, description="the testbed")
    matrix: dict[str, list[Any]] = Field(default_factory=dict, description="axes to sweep: every combination of "
                                         "their values is one configuration")
    case: list[dict[str, Any]] = Field(default_factory=list, description="named configurations that are not a "
                                       "cross product: [[case]] tables, each a name and the parameters it sets "
                                       "(any matrix key); crossed with the matrix's axes; labelled by its name")
    workload: dict[str, Workload] = Field(description="the workloads, by name: [workload.NAME] with a tool and "
                                          "its options")
    workloads: list[str] | None = Field(default=None, description="the workloads that run (their companions "
                                        "too); default: every enabled one. Swept in [matrix], one study of "
                                        "several tools runs each tool in its own configurations")
    repeat: RepeatSpec = Field(default_factory=RepeatSpec, description="how often, and in what order, each "
                               "configuration runs")
    hosts: HostsSpec | None = Field(default=None, description="endpoints on real hosts (run --hosts INVENTORY)")
    kube: KubeSpec | None = Field(default=None, description="endpoints as pods of a Kubernetes cluster (run --kube)")
    topology: TopologySpec | None = Field(default=None, description="the lab's network as a graph: a template "
                                          "(star, linear, parking-lot, tree, dumbbell) or nodes and links; "
                                          "default: the dumbbell of [lab]")
    scale: ScaleSpec | None = Field(default=None, description="rates written for one line rate, run at this "
                                    "machine's (applied when the file is read)")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return require_name(v)

    @field_validator("workload", mode="before")
    @classmethod
    def _workload_names(cls, v: Any) -> Any:
        # Before the tables are validated: the name is refused even when its table has problems of its own.
        for name in v if isinstance(v, dict) else ():
            require_name(name, "workload")
        return v

    @field_validator("matrix", mode="before")
    @classmethod
    def _matrix_names(cls, v: Any) -> Any:
        # An axis' name, and the keys of its inline tables, label every configuration.
        for axis, values in v.items() if isinstance(v, dict) else ():
            require_name(axis, "matrix axis")
            for entry in values if isinstance(values, list) else ():
                for key in entry if isinstance(entry, dict) else ():
                    require_name(key, f"matrix.{axis}: inline table key")
        return v

    @field_validator("case", mode="before")
    @classmethod
    def _cases(cls, v: Any) -> Any:
        names = []
        for i, entry in enumerate(v if isinstance(v, list) else ()):
            if not isinstance(entry, dict):
                raise ValueError(f"case {i + 1} is {units.brief(entry)}: each [[case]] is a table with a name and the "
                                 "parameters it sets, e.g. [[case]] name = \"far\" delay = \"50ms\"")
            if "name" not in entry:
                raise ValueError(f"case {i + 1} has no name: give each [[case]] a name = \"...\" (it labels its "
                                 "configurations)")
            names.append(require_name(entry["name"], "case"))
            if len(entry) == 1:
                raise ValueError(f"case {entry['name']!r} sets nothing: give it the parameters it changes")
            for key in entry:
                require_name(key, f"case {entry['name']!r}: key")
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"case {twice[0]!r} is named twice: each case's name labels its configurations")
        return v

    @field_validator("matrix")
    @classmethod
    def _matrix(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for axis, values in v.items():
            if not values:
                raise ValueError(f"matrix.{axis} is empty: give at least one value")
            if len({repr(x) for x in values}) != len(values):
                raise ValueError(f"matrix.{axis} lists a value twice: {units.brief(values)}")
        return v

    @field_validator("workloads", mode="before", json_schema_input_type=str | list[str])
    @classmethod
    def _one_or_more(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

    @model_validator(mode="after")
    def _hosts_shape_only_what_is_asked(self) -> "Scenario":
        # Real hosts' links are what they are: a scenario written for them shapes only what it states. The
        # lab's default bottleneck applied there put 100 Mbit/s on the receiver's interface (and refused the
        # run where the inventory did not allow shaping) for a scenario that asked for nothing.
        if self.hosts is not None and "bottleneck" not in self.lab.model_fields_set:
            self.lab.bottleneck = None
        return self

    @model_validator(mode="after")
    def _dumbbell_hosts(self) -> "Scenario":
        """On the dumbbell, [hosts] names the receiver and the senders; hosts.nodes places a [topology]'s hosts."""
        if self.hosts is None or self.topology is not None:
            return self
        if self.hosts.nodes:
            raise ValueError("hosts.nodes places the hosts of a [topology] table, and this scenario declares none: "
                             "on the dumbbell name hosts.receiver and hosts.senders")
        missing = [k for k, v in (("receiver", self.hosts.receiver), ("senders", self.hosts.senders)) if not v]
        if missing:
            raise ValueError(f"[hosts] names no {' and no '.join(missing)}: give receiver = \"HOST\" and senders = "
                             "[\"HOST\", ...] (inventory hosts or groups)")
        return self

    def _topology_on_hosts(self, graph: Any) -> None:
        """A [topology] on real hosts: its hosts placed by name (hosts.nodes), each a host node of the graph.
        What the hosts' network can carry (a host's own link only) is checked per configuration when the
        run places them (runner/hosts_topology.py)."""
        assert self.hosts is not None
        used = [k for k in ("receiver", "senders") if getattr(self.hosts, k)]
        if used:
            raise ValueError(f"hosts.{used[0]} places a dumbbell's endpoint; a [topology]'s hosts are placed by "
                             "node: hosts.nodes = {NODE = \"INVENTORY HOST\", ...}")
        if not self.hosts.nodes:
            hosts = graph.hosts()
            raise ValueError("a [topology] on real hosts needs hosts.nodes, the inventory host each of its host "
                             f"nodes runs on, e.g. hosts.nodes = {{{hosts[0]} = \"server-a\", ...}} (the topology's "
                             f"hosts: {', '.join(hosts[:8])}{', ...' if len(hosts) > 8 else ''})")
        wrong = [n for n in self.hosts.nodes if n not in graph.nodes or graph.kind(n) != "host"]
        if wrong:
            hosts = graph.hosts()
            what = f"a {graph.kind(wrong[0])}" if wrong[0] in graph.nodes else "no node"
            raise ValueError(f"hosts.nodes.{wrong[0]}: {wrong[0]!r} is {what} of the topology; hosts.nodes places "
                             f"its hosts ({', '.join(hosts[:8])}{', ...' if len(hosts) > 8 else ''}); its switches "
                             "and routers stand for the network between the real hosts")

    @model_validator(mode="after")
    def _link_names(self) -> "Scenario":
        if self.topology is not None:
            return self  # checked against the graph's links (_topology)
        bad = [n for n in self.lab.link if not re.fullmatch(r"bottleneck|s[1-9][0-9]?", n)]
        if bad:
            raise ValueError(f"no link named {', '.join(map(repr, bad))}: a dumbbell's links are \"bottleneck\" "
                             "(switch -> receiver) and \"s1\", \"s2\", ... (each sender -> switch); a [topology] "
                             "table declares other shapes")
        return self

    @model_validator(mode="after")
    def _topology(self) -> "Scenario":
        """A declared topology: its graph holds together, its endpoints are its hosts, every [lab.link.NAME] is
        one of its links, and the lab's bottleneck short-hands have a link named "bottleneck" to apply to."""
        if self.topology is None:
            own = [n for n, w in self.workload.items() if w.own_endpoints]
            if own:
                raise ValueError(f"workload.{own[0]}: clients and server name hosts of a [topology]; without one, "
                                 "every workload runs from the dumbbell's senders to its receiver (remove them, or "
                                 "declare the topology)")
            return self
        try:
            graph = self.topology.graph(self.lab.mtu)
        except ScenarioError as e:
            raise ValueError(str(e)) from None
        problems = graph.problems()
        if problems:
            raise ValueError("topology: " + "; ".join(problems))
        for name, w in self.workload.items():
            if w.own_endpoints:
                try:
                    self.topology.endpoints(graph, required=False, clients=w.clients, server=w.server,
                                            where=f"workload.{name}")
                except ScenarioError as e:
                    raise ValueError(str(e)) from None
        try:
            self.topology.endpoints(graph, required=False)  # a matrix may name them: each configuration must
        except ScenarioError as e:
            raise ValueError(str(e)) from None
        unknown = [n for n in self.lab.link if n not in graph.links]
        if unknown:
            names = list(graph.links)
            raise ValueError(f"lab.link.{unknown[0]}: the topology has no link {unknown[0]!r} (links: "
                             f"{', '.join(names[:12])}{', ...' if len(names) > 12 else ''})")
        if self.hosts is not None:
            self._topology_on_hosts(graph)
        if self.lab.env not in TOPOLOGY_ENVS:
            raise ValueError(f"lab.env = {self.lab.env!r} with a [topology] table: a declared topology's "
                             f"workload hosts run in {', '.join(repr(e) for e in TOPOLOGY_ENVS)} so far; choose "
                             "one of those, or drop the [topology] table for the dumbbell, where every "
                             "environment runs")
        if self.lab.env in ("docker", "podman"):
            # The container is the host: its links are the topology's, no engine network is in front of it.
            for key in ("network", "publish"):
                if getattr(self.lab, key) is not None:
                    raise ValueError(f"lab.{key} = {getattr(self.lab, key)!r} with lab.env = {self.lab.env!r} on a "
                                     f"[topology]: each host is a container whose network is the topology's own "
                                     f"links (no engine network, nothing published); remove lab.{key}")
        if self.lab.env == "vm":
            # A guest takes over its host's addresses and routes on the host's one link (a bridge port to its
            # TAP); a host on several links would need a NIC per link in its guest.
            multi = [h for h in self._workload_hosts(graph) if len(graph.links_of(h)) != 1]
            if multi:
                raise ValueError(f"lab.env = \"vm\": host {multi[0]!r} of the topology has "
                                 f"{len(graph.links_of(multi[0]))} links, and a guest takes over a host on one link "
                                 "only; run the workloads between hosts on one link each, or choose another env")
        if "bottleneck" not in graph.links:
            # Compared with the defaults (a configuration's scenario is validated again with every field set);
            # no rate at all is what this topology's lab gets below.
            given = [k for k in BOTTLENECK_SHORT_HANDS if not (k == "bottleneck" and self.lab.bottleneck is None)
                     and not same_value(getattr(self.lab, k), _default(LabSpec, k))]
            if given:
                raise ValueError(f"lab.{given[0]} applies to the link named \"bottleneck\", which this topology does "
                                 f"not have: give the conditions per link, [lab.link.NAME] (links: "
                                 f"{', '.join(list(graph.links)[:12])})")
            self.lab.bottleneck = None  # no link carries the lab's default rate
        return self

    def _workload_hosts(self, graph: Any) -> list[str]:
        """The topology's hosts the active workloads run on, as far as this scenario names them (a matrix may
        name the rest: each configuration is checked again with its own)."""
        assert self.topology is not None
        hosts: dict[str, None] = {}
        for w in [None, *self.active.values()]:
            clients = None if w is None or not w.own_endpoints else w.clients
            server = None if w is None or not w.own_endpoints else w.server
            try:
                cs, sv = self.topology.endpoints(graph, required=False, clients=clients, server=server)
            except ScenarioError:
                continue  # said by the checks above
            hosts.update(dict.fromkeys([*cs, sv]))
        return list(hosts)

    @model_validator(mode="after")
    def _workloads(self) -> "Scenario":
        unknown = [n for n in self.workloads or [] if n not in self.workload]
        if unknown:
            raise ValueError(f"workloads = {units.brief(self.workloads)}: no workload named "
                             f"{', '.join(map(units.brief, unknown[:5]))} (have {', '.join(self.workload)})")
        active = self.active
        if not active:
            what = "no workload" if not self.workload else "every workload has enabled = false"
            raise ValueError(f"{what}: give at least one [workload.NAME] table with a tool, e.g. "
                             "[workload.stream] tool = \"iperf3\"; tools: " + ", ".join(registry.drivers()))
        leaders = [n for n, w in active.items() if w.during is None]
        for name, w in active.items():
            d = registry.of(w)
            if w.during is None and not d.can_lead:
                raise ValueError(f"workload.{name} ({w.tool}) cannot run on its own: give during = \"<the "
                                 f"workload it accompanies>\" (one of: {', '.join(leaders) or 'none yet'})")
            if w.during is not None:
                if not d.can_accompany:
                    raise ValueError(f"workload.{name} ({w.tool}) runs on its own: remove during = {units.brief(w.during)}")
                if w.during not in leaders:
                    if w.during in self.workload and not self.workload[w.during].enabled:
                        what = "is not enabled"
                    else:
                        what = "runs during another itself" if w.during in self.workload else "is no workload"
                    raise ValueError(f"workload.{name}.during = {units.brief(w.during)} {what}; it must name a workload "
                                     f"that runs on its own ({', '.join(leaders) or 'none'})")
        return self

    def qualifies(self, workload: str) -> bool:
        """Whether workload `workload`'s metrics are named after it (``throughput.rx_mbps@long``): when another
        workload of the trial runs the same tool, the names alone would not say whose a value is."""
        tool = self.active[workload].tool
        return sum(1 for w in self.active.values() if w.tool == tool) > 1

    @property
    def active(self) -> dict[str, Workload]:
        """The workloads that run: those `workloads` names and the ones that run during them, or, without
        it, every one not marked enabled = false (offered, not run)."""
        if self.workloads is None:
            return {n: w for n, w in self.workload.items() if w.enabled}
        chosen = set(self.workloads)
        return {n: w for n, w in self.workload.items() if n in chosen or w.during in chosen}

    def phases(self) -> list[tuple[str, list[str]]]:
        """The trial's phases in file order: each workload that runs on its own, with those `during` it."""
        active = self.active
        return [(name, [n for n, w in active.items() if w.during == name])
                for name, w in active.items() if w.during is None]

    @property
    def stream(self) -> tuple[str, StreamWorkload] | None:
        """The iperf3 workload, if there is one (over-subscription ratios and offered loads refer to it)."""
        return next(((n, w) for n, w in self.active.items() if isinstance(w, StreamWorkload)), None)

    @property
    def probes(self) -> list[tuple[str, ProbeWorkload]]:
        return [(n, w) for n, w in self.active.items() if isinstance(w, ProbeWorkload)]

    @property
    def samplers(self) -> list[tuple[str, SsWorkload]]:
        return [(n, w) for n, w in self.active.items() if isinstance(w, SsWorkload)]
