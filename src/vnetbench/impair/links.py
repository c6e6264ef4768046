"""The lab's links under their conditions, for a whole run.

A :class:`LinkManager` sits between the bench and the backends:

- ``plan(configs)`` chooses each link's backend once for the run (``auto`` is
  resolved over the union of what every configuration asks, so one sweep is
  never measured with two instruments), checks explicit choices and places the
  emulators on their own cores (hosts move to the others);
- ``apply(config)`` realises a configuration's conditions, switching backend
  when a matrix sweeps it, and returns the state to record: the kernel's
  qdiscs and, per link, the backend and its settings as applied;
- ``start_trial`` / ``failure`` / ``end_trial`` bracket each trial (the
  emulator restarts with the trial's seed and schedule; a dead emulator is the
  trial's failure reason; counters are per trial).

Link names in a dumbbell: ``bottleneck`` (switch port -> receiver, the lab's
``bottleneck``/``buffer``/``delay``... short-hands feed it) and ``s1``..``sN``
(sender -> switch). `forward` is always the stream's direction.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vnetbench.errors import ScenarioError
from vnetbench.impair import backends as B, tc
from vnetbench.impair.model import LinkSpec, lab_links
from vnetbench.lab.teardown import Registry


def lab_link(lab: Any, name: str, host: str | None = None) -> B.LabLink:
    """Link `name` of a built lab at key `host` (a dumbbell's: the host at its end, by default "r" for the
    bottleneck, else the link's name)."""
    return lab.link(name, host or ("r" if name == "bottleneck" else name))


def preflight(configs: list) -> None:
    """Before anything is built: links exist and their backends can do what is asked here;
    the emulator's binary and ethtool are present when the userspace backend will run."""
    from vnetbench.tools import ETHTOOL, require

    n = max((c.active_senders for c in configs), default=1)
    auto = check_configs(configs, n_senders=n)
    uses_emulator = "userspace" in auto.values() or any(
        spec.backend == "userspace" for c in configs for spec in lab_links(c.scenario.lab).values())
    if uses_emulator:
        B.require_binary()
        require([ETHTOOL])


class LinkFailed(Exception):
    """A link stopped working during a trial (its emulator died); the message says how."""


def link_metrics(counters: dict[str, B.TrialCounters]) -> list[tuple[str, float]]:
    """Per-trial metrics from the emulator's own counters on the bottleneck (forward)."""
    c = counters.get("bottleneck")
    if c is None or "forward" not in c.per_direction:
        return []
    fwd = c.per_direction["forward"]
    out = []
    if "lost" in fwd:
        out.append(("link.lost_packets", float(fwd["lost"])))
    if "max_queue_delay_us" in fwd:
        out.append(("link.max_queue_delay_ms", float(fwd["max_queue_delay_us"]) / 1e3))
    for key, metric in (("reordered", "link.reordered_packets"), ("duplicated", "link.duplicated_packets")):
        if key in fwd:
            out.append((metric, float(fwd[key])))
    return out


def staggered(argv: list[str], start: float) -> list[str]:
    """`argv`, started `start` seconds later (sleep inside the process: nothing to schedule here)."""
    if start <= 0:
        return argv
    return ["sh", "-c", f'sleep {start:g}; exec "$@"', "sh", *argv]


def bottleneck_drops(counters: dict[str, B.TrialCounters]) -> float | None:
    """Packets the bottleneck's queue dropped in the forward direction during the trial."""
    c = counters.get("bottleneck")
    if c is None or "forward" not in c.per_direction:
        return None
    fwd = c.per_direction["forward"]
    return float(fwd.get("dropped_queue", fwd.get("drops", 0.0)))


def link_names(n_senders: int) -> list[str]:
    return ["bottleneck"] + [f"s{i}" for i in range(1, n_senders + 1)]


def config_link_names(config: Any, n_senders: int) -> list[str]:
    """The links a configuration's lab has: its declared topology's, else a dumbbell's with `n_senders`."""
    topology = config.scenario.topology
    if topology is not None:
        return list(topology.graph(config.scenario.lab.mtu).links)
    return link_names(n_senders)


def check_configs(configs: list, caps: B.Capabilities | None = None, n_senders: int | None = None) -> dict[str, str]:
    """Before anything is built: every link exists, every explicit backend can do
    what it is asked and exists here, and `auto` resolves. Returns the run-wide
    choice for each link whose backend is `auto`."""
    needs: dict[str, set[str]] = {}
    rate_qdisc: dict[str, str] = {}
    for c in configs:
        lab = c.scenario.lab
        where = f"[{c.label_text}] " if c.labels else ""
        names = config_link_names(c, n_senders) if n_senders else None
        for name, spec in lab_links(lab).items():
            if name == "bottleneck" and c.scenario.topology is not None and name not in (names or ()):
                continue  # the lab short-hands' link, which this topology lacks (they are unset: Scenario._topology)
            if names is not None and name not in names:
                raise ScenarioError(f"{where}lab.link.{name}: the lab has no link {name!r} "
                                    f"(links: {', '.join(names)})")
            if spec.backend == "auto":
                needs.setdefault(name, set()).update(spec.needs())
                rate_qdisc[name] = lab.qdisc
            else:
                B.choose(spec, caps=caps, rate_qdisc=lab.qdisc, where=f"{where}lab.link.{name}: ")
    return {name: B.auto_choice(n, caps or B.capabilities(), rate_qdisc[name], f"lab.link.{name}")
            for name, n in needs.items()}


@dataclass(frozen=True)
class LinkTarget:
    """What one link on a configuration's path must be: its name, the backend that realises it (None: the
    bare veth, nothing installed) and its conditions."""

    name: str
    backend: str | None
    spec: LinkSpec


@dataclass
class LinkManager:
    lab: Any
    registry: Registry
    workdir: Path
    run_prefix: str
    mtu: int = 1500  # for hosts outside any variant group
    auto: dict[str, str] = field(default_factory=dict)  # run-wide choice for links left on auto
    backends: dict[str, B.Backend] = field(default_factory=dict)
    emulator_cpus: dict[str, int | None] = field(default_factory=dict)
    host_cpus: tuple[int, ...] = ()  # the cores no emulator spins on: the hosts' (set with emulator_cpus)
    repinned: bool = False  # an endpoint's core changed at the last apply()
    _home: dict[str, int | None] = field(default_factory=dict)  # host -> the core the topology gave it
    _current: dict[str, LinkSpec] = field(default_factory=dict)  # host -> spec applied on its link
    _records: dict[str, dict] = field(default_factory=dict)  # host -> what apply() returned
    _active: dict[str, str] = field(default_factory=dict)  # host -> link name, for the current configuration
    _state: dict[str, Any] = field(default_factory=dict)  # link name -> record of the current configuration
    _parked: dict[str, B.Backend] = field(default_factory=dict)  # host -> userspace backend taken off its link
    _targets: dict[str, LinkTarget] = field(default_factory=dict)  # host -> declared, for the current configuration
    rewired: set[str] = field(default_factory=set)  # hosts whose link the last apply() spliced or unspliced
    changed: bool = False  # whether the last apply() changed any link

    # ------------------------------------------------------------- planning

    def plan(self, configs: list) -> None:
        self.auto = check_configs(configs, n_senders=max((c.active_senders for c in configs), default=1))
        users = sorted({name for c in configs for name, spec in lab_links(c.scenario.lab).items()
                        if self._name_of(name, spec, c.scenario.lab) == "userspace"})
        self._place_emulators(users)

    def _name_of(self, name: str, spec: LinkSpec, lab: Any) -> str:
        if spec.backend != "auto":
            return spec.backend
        if name in self.auto:
            return self.auto[name]
        return B.choose(spec, "auto", rate_qdisc=lab.qdisc, where=f"lab.link.{name}: ")

    def _place_emulators(self, names: list[str]) -> None:
        """Emulators spin their core: give them the last cores (the hosts keep the others while an emulator is on
        their path, see :meth:`_pin`)."""
        new = [n for n in names if n not in self.emulator_cpus]
        if not new:
            return
        cpus = sorted(os.sched_getaffinity(0))
        taken = set(c for c in self.emulator_cpus.values() if c is not None)
        for name in new:
            free = [c for c in reversed(cpus) if c not in taken]
            cpu = free[0] if len(free) > 1 else None  # never the machine's only remaining core
            self.emulator_cpus[name] = cpu
            if cpu is not None:
                taken.add(cpu)
        self.host_cpus = tuple(c for c in cpus if c not in taken)

    def _pin(self, targets: dict[str, LinkTarget], endpoints: list[str]) -> None:
        """Each endpoint of this configuration's path on its own core (the topology's: the receiver on the last),
        except where an emulator on this path spins: then on the least used core no emulator of the path has.
        Computed per configuration, so a configuration without an emulator measures with the placement it would
        have alone, whatever else the run holds (an emulator's core taken for the whole run put a bare reference's
        receiver on its sender's core). Sets ``repinned`` when a core changed (the servers must start again)."""
        spinning = {self.emulator_cpus.get(t.name) for t in targets.values() if t.backend == "userspace"} - {None}
        cpus = sorted(os.sched_getaffinity(0))
        free = [c for c in cpus if c not in spinning] or cpus
        hosts = {name: self.lab.endpoints[name] for name in sorted(endpoints) if name in self.lab.endpoints}
        for name, host in hosts.items():
            self._home.setdefault(name, host.cpu)
        # Hosts whose process pinning follows host.cpu; a guest's QEMU threads keep the cores they started on.
        movable = {n for n, h in hosts.items() if getattr(h, "pins_each_command", True)}
        wanted = {n: self._home[n] for n in hosts}
        for name in sorted(movable):
            if wanted[name] is not None and wanted[name] in spinning:
                load = {c: sum(1 for m, w in wanted.items() if m != name and w == c) for c in free}
                wanted[name] = min(free, key=lambda c: (load[c], c))
        for name in movable:
            if hosts[name].cpu != wanted[name]:
                hosts[name].cpu = wanted[name]
                self.repinned = True

    def emulator_cores(self) -> dict[str, int | None]:
        """Each emulator on the current configuration's path: its link and its core (None: not pinned)."""
        return {t.name: self.emulator_cpus.get(t.name) for t in self._targets.values() if t.backend == "userspace"}

    def _host_cpus(self, name: str) -> tuple[int, ...]:
        """The cores that are no emulator's, when link `name`'s emulator has a core of its own."""
        return self.host_cpus if self.emulator_cpus.get(name) is not None else ()

    # -------------------------------------------------------------- applying

    def targets(self, config: Any, flows: list[tuple[str, list[str]]]) -> dict[str, LinkTarget]:
        """What every link on this configuration's path must be, computed from the configuration and the run's
        backend choices alone (never from what an earlier configuration installed): per host, its link's name,
        backend and conditions. A link the configuration does not mention is plain; it is realised by the
        backend the run chose for it (a sweep is measured with one instrument), or left the bare veth when no
        configuration of the run conditions it."""
        lab_spec = config.scenario.lab
        declared = lab_links(lab_spec)
        out: dict[str, LinkTarget] = {}
        on_path = {key: name for receiver, senders in flows
                   for key, name in self.lab.path_links(receiver, senders).items()}
        for key, name in on_path.items():
            spec = declared.get(name, LinkSpec())
            conditioned = not spec.is_plain() or spec.backend != "auto" or name in self.auto
            out[key] = LinkTarget(name, self._name_of(name, spec, lab_spec) if conditioned else None, spec)
        return out

    def apply(self, config: Any, flows: list[tuple[str, list[str]]]) -> dict[str, Any]:
        """Make the links on the configuration's paths (`flows`: each receiver with its senders) what
        :meth:`targets` says, changing only what differs from what is installed, and idle every other link (no
        emulator spins for it meanwhile). Returns the state to record: {"qdiscs": [...], "links": {...}};
        ``rewired`` then names the hosts whose link changed structure (an emulator spliced in or taken out: the
        devices on it are new)."""
        lab_spec = config.scenario.lab
        targets = self.targets(config, flows)
        self.rewired = set()
        self.changed = False
        for host, backend in self.backends.items():
            if host not in targets:
                backend.idle()  # off this configuration's path (another variant's link, an unused sender)
        links: dict[str, Any] = {}
        for host, target in targets.items():
            if target.backend is None:
                self._remove(host)
                continue
            backend = self._backend(target.name, host, target.backend, lab_spec.qdisc)
            cached = self._records.get(host)
            if backend.endpoints_offload(lab_spec.offload == "on"):  # the emulator's receive steering
                cached = None
            if cached is None or self._current.get(host) != target.spec or not backend.healthy():
                cached = backend.apply(target.spec)
                self._current[host] = target.spec
                self._records[host] = cached
                self.changed = True
            links[target.name] = {"backend": target.backend, "host": host, "requested": target.spec.request(),
                                  "describe": target.spec.describe(), "needs": sorted(target.spec.needs()),
                                  **{k: v for k, v in cached.items() if k != "backend"}}
        self._targets = targets
        self._pin(targets, list(dict.fromkeys(h for receiver, senders in flows for h in (receiver, *senders))))
        self._active = {host: t.name for host, t in targets.items() if t.backend is not None}
        self._state = links
        qdiscs = [q for h in self._active for q in self.backends[h].qdiscs()]
        return {"qdiscs": qdiscs, "links": links}

    def idle(self) -> None:
        """Idle every link's backend (no emulator spins): another graph of the run measures meanwhile. The next
        apply() makes this lab's paths what their configuration declares, whatever was idled."""
        for backend in self.backends.values():
            backend.idle()

    def check(self) -> list[str]:
        """What the links of the current configuration's path hold, read back from the kernel and the
        emulators, against what :meth:`targets` declared: one line per difference (none: all as declared)."""
        problems = []
        for host, target in self._targets.items():
            where = f"link {target.name!r} (host {host})"
            if target.backend is None:
                problems += [f"{where}: {p}" for p in self._plain_problems(target.name, host)]
            else:
                problems += [f"{where}, {target.backend}: {p}" for p in self.backends[host].check(target.spec)]
        return problems

    def _plain_problems(self, name: str, host: str) -> list[str]:
        """A link no configuration conditions: the bare veth, with no qdisc and no emulator on it."""
        link = lab_link(self.lab, name, host)
        out = [f"a {q['kind']} qdisc is left on {q['dev']}" for end in (link.switch_end, link.host_end)
               for q in tc.installed_roots(tc.read_back(end))]
        parked = self._parked.get(host)
        if parked is not None and parked.spliced():
            out.append("an emulator's namespace is still spliced into it")
        return out

    def paths(self, receiver: str, senders: list[str]) -> dict[str, list[tuple[LinkSpec, bool]]]:
        """Per sender of the current configuration, the links on its path to `receiver`, each as the conditions
        it declares in the sender's direction (``forward``: toward the receiver) and whether a rate qdisc
        realises them."""
        def link(key: str, forward: bool) -> tuple[LinkSpec, bool]:
            target = self._targets.get(key)
            if target is None:
                return LinkSpec(), False
            return (target.spec if forward else target.spec.reversed()), target.backend not in (None, "userspace")
        return {s: [link(key, forward) for key, forward in self.lab.route(s, receiver)] for s in senders}

    def reset_path(self) -> None:
        """Take every backend off the current configuration's path and every qdisc off both ends of its links (the
        bare veths again, whoever put what there): the next apply() makes each link from scratch."""
        for host, target in list(self._targets.items()):
            self._remove(host)
            link = lab_link(self.lab, target.name, host)
            for end in (link.switch_end, link.host_end):
                tc.clear(end)

    def _remove(self, host: str) -> None:
        """Take the backend off `host`'s link: the bare veth again."""
        backend = self.backends.pop(host, None)
        if backend is None:
            return
        self.changed = True
        backend.clear()
        backend.uninstall()
        if backend.name == "userspace":
            self._parked[host] = backend  # keeps its (now empty) namespace for next time
            self.rewired.add(host)
        self._records.pop(host, None)
        self._current.pop(host, None)

    def _mtu(self, host: str) -> int:
        """The MTU of the variant `host` belongs to (an `mtu` sweep gives each its own): it sizes bursts,
        default buffers and the emulator's frames."""
        for group in getattr(self.lab, "groups", {}).values():
            if host == group.receiver or host in group.senders:
                return group.variant.mtu
        return self.mtu

    def _backend(self, name: str, host: str, backend_name: str, rate_qdisc: str) -> B.Backend:
        current = self.backends.get(host)
        wanted_qdisc = backend_name if backend_name in ("tbf", "htb") else rate_qdisc
        if current is not None and current.name == backend_name and (
                backend_name == "userspace" or current.rate_qdisc == wanted_qdisc):
            return current
        if current is not None:
            self._remove(host)
        link = lab_link(self.lab, name, host)
        cls = B.backend_class(backend_name)
        if backend_name == "userspace" and host in self._parked:
            backend = self._parked.pop(host)
        elif backend_name == "userspace":
            from vnetbench.impair.userspace import UserspaceContext

            self._place_emulators([name])
            ctx = UserspaceContext(self.registry, self.workdir, self.lab.emulator_namespace(host),
                                   self.emulator_cpus.get(name), receive_cpus=self._host_cpus(name))
            backend = cls(link, self._mtu(host), rate_qdisc, context=ctx)
        else:
            backend = cls(link, self._mtu(host), wanted_qdisc)
        backend.install()
        if backend_name == "userspace":
            self.rewired.add(host)
        self.backends[host] = backend
        return backend

    def forget(self) -> None:
        """Apply every link's conditions again at the next configuration (what was applied may be gone)."""
        self._records.clear()

    # ---------------------------------------------------------------- trials

    def start_trial(self, seconds: float) -> None:
        """Right before the flows start: emulators restart with the trial's seed and schedule."""
        for host in self._active:
            self.backends[host].start_trial(self._current[host], seconds)

    def failure(self) -> str | None:
        """Why a link of the running trial stopped working (its emulator died), or None."""
        for host in self._active:
            reason = self.backends[host].failure()
            if reason:
                return reason
        return None

    def end_trial(self) -> dict[str, B.TrialCounters]:
        """Per link name: what its backend counted during the trial."""
        return {name: self.backends[host].end_trial() for host, name in self._active.items()}

    def wait(self, proc: Any, end_by: float, poll: float = 0.1) -> None:
        """Wait for `proc` until `end_by` (time.time()), watching the links: raises
        LinkFailed as soon as one stops working, subprocess.TimeoutExpired at end_by."""
        import subprocess
        import time

        from vnetbench.lab.teardown import wait_metered

        while True:
            try:
                wait_metered(proc, timeout=max(0.0, min(poll, end_by - time.time())))
                return
            except subprocess.TimeoutExpired:
                reason = self.failure()
                if reason:
                    raise LinkFailed(reason) from None
                if time.time() >= end_by:
                    raise

    def state(self) -> dict[str, Any]:
        """The current configuration's links as applied: {"links": {name: {backend, requested, applied...}}}."""
        return {"links": self._state}

    def extra_rtt(self, config: Any) -> float:
        """Seconds the links' delay (and 3 x jitter) add to a round trip."""
        total = 0.0
        for spec in lab_links(config.scenario.lab).values():
            for d in ("forward", "reverse"):
                c = spec.direction(d)
                total += c.delay + 3 * c.jitter
            if spec.schedule is not None:
                total += max((c.delay + 3 * c.jitter for s in spec.schedule.steps
                              for c in (s.forward, s.reverse, s.both) if c is not None), default=0.0)
        return total

    def emulator_pids(self) -> list[int]:
        """The processes that carry the current configuration's links (its emulators'), for the trial's CPU."""
        return [pid for host in self._active for pid in self.backends[host].processes()]

    def uses_emulator(self) -> bool:
        return any(b.name == "userspace" for b in self.backends.values())
