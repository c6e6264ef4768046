"""The userspace backend: vnb-link in its own namespace, spliced onto a lab link.

::

    switch ─ X ──veth── a  [ <prefix>-e<link>: vnb-link, pinned, nice -10 ]  b ──veth── eth0  host
                        a -> b is the link's forward direction

The emulator is (re)started right before every trial with the trial's
settings, seed and schedule, so the schedule's time 0 is the start of the
trial's flows, every trial draws the same random decisions for the same
packets, and its counters are per trial. Between starts, settings can change
live through the control socket (`update`). What the emulator reports as its
settings (``{"cmd": "get"}``) is what the run records as applied.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vnetbench.errors import LabError
from vnetbench.impair import tc
from vnetbench.impair.backend import Backend, LabLink, TrialCounters, register, require_binary
from vnetbench.impair.model import CAPABILITY_TEXT, SCHEDULE_MARGIN_S, LinkConditions, LinkSpec, Schedule
from vnetbench.lab import netns
from vnetbench.lab.teardown import Registry, atomic, start_process, stop_groups

READY_TIMEOUT = 5.0
NICE = -10


# ------------------------------------------------------------ config (JSON)


def loss_settings(cond: LinkConditions) -> dict[str, Any]:
    loss = cond.loss
    if loss.model == "bernoulli":
        return {"model": "bernoulli", "p": loss.p, "correlation": loss.correlation}
    if loss.model == "gilbert_elliott":
        return {"model": "gilbert_elliott", "p": loss.p, "r": loss.r or 0.0, "one_minus_h": loss.loss_bad,
                "one_minus_k": loss.loss_good}
    return {"model": "none"}


def queue_settings(cond: LinkConditions) -> dict[str, Any]:
    q = cond.queue
    out: dict[str, Any] = {"kind": q.kind}
    if q.kind == "codel":
        out.update({"target_ms": (q.target if q.target is not None else 0.005) * 1e3,
                    "interval_ms": (q.interval if q.interval is not None else 0.1) * 1e3})
    elif q.kind == "pie":
        out["target_ms"] = (q.target if q.target is not None else 0.015) * 1e3
    elif q.kind == "red":
        out.update({"min_bytes": int(q.min), "max_bytes": int(q.max),
                    "p_max": q.p_max if q.p_max is not None else 0.1})
    elif q.kind == "fq":
        out["quantum"] = int(q.quantum) if q.quantum is not None else 1514
    return out


def settings(cond: LinkConditions, partial: bool = False, rate_for_buffer: float | None = None) -> dict[str, Any]:
    """vnb-link's settings object for one direction.

    Full (partial=False): every key, so a control update replaces the whole
    direction. Partial: only what `cond` gives (schedule steps). A buffer given
    as time is converted at this direction's rate (or `rate_for_buffer`, the
    rate in force when a step changes only the buffer).
    """
    given = cond.model_fields_set if partial else set(type(cond).model_fields)
    out: dict[str, Any] = {}
    if "rate" in given:
        out["rate_bps"] = int(cond.rate or 0)
    if "overhead" in given:
        out["overhead_bytes"] = int(cond.overhead)
    if "buffer" in given:
        if cond.buffer is None:
            out["buffer_bytes"] = None
            out["buffer_packets"] = None
        else:
            out["buffer_bytes"] = int(cond.buffer.in_bytes(cond.rate or rate_for_buffer))
            out["buffer_packets"] = None
    if "queue" in given:
        out["qdisc"] = queue_settings(cond)
    if "delay" in given:
        out["delay_ms"] = cond.delay * 1e3
    if "jitter" in given:
        out["jitter_ms"] = cond.jitter * 1e3
    if "distribution" in given:
        out["jitter_dist"] = cond.distribution
    if "jitter_reorders" in given:
        out["reorder_on_jitter"] = cond.jitter_reorders
    if "loss" in given:
        out["loss"] = loss_settings(cond)
    for k in ("reorder", "reorder_correlation", "duplicate", "corrupt"):
        if k in given:
            out[k] = getattr(cond, k)
    if not partial:
        out["trace_file"] = None
    return out


def emulator_config(spec: LinkSpec, until: float | None = None, traces: dict[str, str] | None = None
                    ) -> dict[str, Any]:
    """The whole config file: seed, both directions, and the schedule unrolled up to
    `until` seconds (None: no schedule, the initial settings only). `traces` maps a schedule's trace
    path to the checked copy the emulator reads instead (UserspaceBackend.start_trial)."""
    cfg: dict[str, Any] = {"seed": spec.seed}
    initial = {d: spec.direction(d) for d in ("forward", "reverse")}
    sched = spec.schedule
    if sched is not None:
        for d in ("forward", "reverse"):
            at0 = sched.initial(d)
            if at0 is not None:
                initial[d] = initial[d].merged(at0)
    for d, key in (("forward", "a_to_b"), ("reverse", "b_to_a")):
        cfg[key] = settings(initial[d])
    if sched is not None:
        for d in sched.trace_directions():
            key = "a_to_b" if d == "forward" else "b_to_a"
            cfg[key]["trace_file"] = (traces or {}).get(sched.trace) or str(Path(sched.trace).resolve())
        if until is not None:
            cfg["schedule"] = schedule_steps(spec, sched, until)
    return cfg


def schedule_steps(spec: LinkSpec, sched: Schedule, until: float) -> list[dict[str, Any]]:
    steps = []
    rate_now = {d: spec.direction(d).rate for d in ("forward", "reverse")}
    for step in sched.expand(until):
        entry: dict[str, Any] = {"at_ms": round(step.at * 1e3, 6)}
        for d, key in (("forward", "a_to_b"), ("reverse", "b_to_a")):
            cond = step.for_direction(d)
            if cond is None:
                continue
            entry[key] = settings(cond, partial=True, rate_for_buffer=rate_now[d])
            if "rate" in cond.model_fields_set:
                rate_now[d] = cond.rate
        if step.at == 0:
            continue  # folded into the initial settings
        if len(entry) > 1:
            steps.append(entry)
    return steps


def settings_differences(wanted: dict[str, Any], applied: dict[str, Any], path: str = "") -> list[str]:
    """Where the settings vnb-link reports (``{"cmd": "get"}``) differ from those it was given: every key
    given, numbers to a millionth (the emulator keeps them as floats), the rest exactly."""
    out = []
    for key, value in wanted.items():
        have = applied.get(key)
        name = f"{path}{key}"
        if isinstance(value, dict) and isinstance(have, dict):
            out += settings_differences(value, have, f"{name}.")
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and isinstance(have, (int, float)):
            if abs(have - value) > 1e-6 * max(1.0, abs(value)):
                out.append(f"{name} is {have}, {value} was given")
        elif have != value:
            out.append(f"{name} is {have!r}, {value!r} was given")
    return out


# -------------------------------------------------------------- the process


IFF_UP = 0x1  # linux/if.h


def set_autogroup_nice(pid: int, nice: int) -> int | None:
    """Give the emulator's session the emulator's nice.

    With sched_autogroup (on by default on many distributions) the scheduler
    first shares a core between *sessions* (autogroups), equally, and only then
    between the tasks of a session by their nice. The emulator runs in a
    session of its own, so its ``nice -n -10`` alone would count for nothing
    against a busy session on its core (measured: runnable but waiting 60% of
    the time while two VMs ran); the autogroup's nice must say it too.
    Returns the nice set, or None where there are no autogroups.
    """
    path = Path(f"/proc/{pid}/autogroup")
    try:
        path.write_text(str(nice))
        return nice
    except OSError:
        return None


def _describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with status {returncode}"


@dataclass
class Emulator:
    """One vnb-link process in namespace `ns`, forwarding between `a` and `b`."""

    ns: str
    workdir: Path
    registry: Registry
    cpu: int | None = None
    nice: int = NICE
    tag: str = "link"
    binary: str = field(default_factory=require_binary)
    proc: subprocess.Popen | None = None
    ready_at: float = 0.0  # time.time() when it printed "ready" (schedule time 0)
    starts: int = 0
    autogroup_nice: int | None = None  # as set (None: the kernel has no autogroups)

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)

    @property
    def control_path(self) -> Path:
        return self.workdir / f"{self.tag}.sock"

    @property
    def stats_path(self) -> Path:
        return self.workdir / f"{self.tag}.stats.json"

    def argv(self, config_path: Path) -> list[str]:
        argv = ["ip", "netns", "exec", self.ns, "nice", "-n", str(self.nice), self.binary,
                "--iface-a", "a", "--iface-b", "b", "--config", str(config_path),
                "--control", str(self.control_path), "--stats-out", str(self.stats_path)]
        # An emulator with a core of its own spins there (no wake-up on any frame's path); one without (the
        # machine has no core left for it) sleeps when nothing is due: spinning at nice -10 on a core the
        # hosts share took most of it from them (a 2-core machine with emulators on two links: a TCP stream
        # through 1 % loss carried 62 Mbit/s with it spinning, 542 with it sleeping).
        argv += ["--cpu", str(self.cpu)] if self.cpu is not None else ["--block"]
        return argv

    def start(self, config: dict[str, Any]) -> None:
        """(Re)start with `config`; returns once the emulator forwards ("ready")."""
        self.stop()
        self.starts += 1
        config_path = self.workdir / f"{self.tag}.config.json"
        config_path.write_text(json.dumps(config, indent=1, allow_nan=False))  # the emulator reads strict JSON
        out, err = self.workdir / f"{self.tag}.out", self.workdir / f"{self.tag}.err"
        for p in (self.control_path, self.stats_path):
            p.unlink(missing_ok=True)
        with open(out, "wb") as o, open(err, "wb") as e, atomic():
            self.proc = start_process(self.argv(config_path), stdout=o, stderr=e, stdin=subprocess.DEVNULL,
                                      start_new_session=True)
            self.registry.add_process(self.proc)
        self.autogroup_nice = set_autogroup_nice(self.proc.pid, self.nice)
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            if out.read_bytes().startswith(b"ready"):
                self.ready_at = time.time()
                return
            if self.proc.poll() is not None:
                raise LabError(f"vnb-link on link '{self.tag}' did not start ({_describe_exit(self.proc.returncode)}): "
                               f"{self.stderr_tail() or '(no output)'}")
            if time.monotonic() > deadline:
                self.stop()
                raise LabError(f"vnb-link on link '{self.tag}' printed no 'ready' within {READY_TIMEOUT:g}s: "
                               f"{self.stderr_tail() or '(no output)'}")
            time.sleep(0.002)

    def stderr_tail(self, n: int = 600) -> str:
        try:
            return (self.workdir / f"{self.tag}.err").read_text(errors="replace").strip()[-n:]
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def death(self) -> str | None:
        """Why the process is gone, or None while it runs (or was stopped by us)."""
        if self.proc is None or self.proc.poll() is None:
            return None
        tail = self.stderr_tail(300)
        return (f"the link emulator on link '{self.tag}' (vnb-link, pid {self.proc.pid}) "
                f"{_describe_exit(self.proc.returncode)} during the trial" + (f"; its stderr: {tail}" if tail else ""))

    def stop(self, grace: float = 2.0) -> dict[str, Any] | None:
        """SIGTERM (it then writes its final stats), SIGKILL after `grace`; returns the stats."""
        p, self.proc = self.proc, None
        if p is None:
            return None
        stop_groups([p], grace)
        try:
            return json.loads(self.stats_path.read_text())
        except (OSError, json.JSONDecodeError):
            return None

    # control channel -------------------------------------------------------

    def request(self, obj: dict[str, Any], timeout: float = 5.0) -> dict[str, Any]:
        if not self.alive():
            raise LabError(f"vnb-link on link '{self.tag}' is not running: {self.death() or 'never started'}")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            try:
                s.connect(str(self.control_path))
                s.sendall(json.dumps(obj, allow_nan=False).encode() + b"\n")
                buf = b""
                while not buf.endswith(b"\n"):
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    buf += chunk
            except OSError as e:
                raise LabError(f"vnb-link control socket {self.control_path}: {e}") from None
        try:
            reply = json.loads(buf)
        except json.JSONDecodeError:
            raise LabError(f"vnb-link control reply is not JSON: {buf[:200]!r}") from None
        return reply

    def update(self, update: dict[str, Any]) -> dict[str, Any]:
        """Change settings now: {"a_to_b": {...}, "b_to_a": {...}, "both": {...}} (partial)."""
        reply = self.request(update)
        if not reply.get("ok"):
            raise LabError(f"vnb-link rejected {json.dumps(update)}: {reply.get('error')}")
        return reply

    def applied(self) -> dict[str, Any]:
        return self.request({"cmd": "get"})["settings"]

    def stats(self) -> dict[str, Any]:
        return self.request({"cmd": "stats"})

    def ready_time(self) -> float:
        """time.time() of the emulator's time 0, from its own clock (t_ms of a reply),
        better than the moment we saw "ready" in its output."""
        t0 = time.time()
        reply = self.request({"cmd": "get"})
        t1 = time.time()
        return (t0 + t1) / 2 - reply["t_ms"] / 1e3


# ------------------------------------------------------------------ backend


@dataclass
class UserspaceContext:
    registry: Registry
    workdir: Path
    middle_name: str
    cpu: int | None
    nice: int = NICE
    # Where the hosts' stacks process what the emulator delivers (splice.steer_receive): the cores that are not
    # an emulator's. Empty: where the kernel puts it (the emulator's core, when it is not pinned to one).
    receive_cpus: tuple[int, ...] = ()


# The emulator is the reference: it expresses every condition a LinkSpec can ask for.
@register("userspace", "'userspace' (vnb-link)", frozenset(CAPABILITY_TEXT))
class UserspaceBackend(Backend):
    name = "userspace"

    def __init__(self, link: LabLink, mtu: int = 1500, rate_qdisc: str = "tbf",
                 context: UserspaceContext | None = None):
        super().__init__(link, mtu, rate_qdisc)
        if context is None:
            raise ValueError("the userspace backend needs a context (registry, workdir, namespace, cpu)")
        self.ctx = context
        self.splice = None
        self.middle = None
        self.emulator: Emulator | None = None
        self.spec: LinkSpec | None = None
        self.receive_steering: str | None = None  # the hosts' receive on these CPUs (RPS mask), if steered
        self.offload_on: bool | None = None  # the endpoints' offloads, as last said (None: their defaults)
        # A schedule's trace path -> (the identity of the file as checked, the copy the emulator reads)
        self.trace_copies: dict[str, tuple[tuple[int, ...], str]] = {}

    def install(self) -> None:
        from vnetbench.lab.splice import middle_namespace, splice

        if self.splice is not None:
            return
        if self.middle is None:
            self.middle = middle_namespace(self.ctx.middle_name, self.ctx.registry)
        self.splice = splice(self.link.switch_end, self.link.host_end, self.middle, self.ctx.registry,
                             host_upstream=self.link.host_upstream)
        self._steer()
        if self.emulator is None:
            # A directory per emulator (its namespace's name is unique in the lab): links of the same name in
            # other variants have emulators of their own, whose control sockets must not be this one's.
            self.emulator = Emulator(self.ctx.middle_name, self.ctx.workdir / f"emu-{self.ctx.middle_name}",
                                     self.ctx.registry, cpu=self.ctx.cpu, nice=self.ctx.nice, tag=self.link.name)

    def uninstall(self) -> None:
        from vnetbench.lab.splice import unsplice

        if self.emulator is not None:
            self.emulator.stop()
        if self.splice is not None:
            unsplice(self.splice)  # the switch end goes, and the host end's steering is put back
            self.splice = None
            self.receive_steering = None

    def endpoints_offload(self, on: bool) -> bool:
        self.offload_on = on
        if self.splice is None:
            return False  # install() steers as they are
        before = self.receive_steering
        self._steer()
        return self.receive_steering != before

    def _steer(self) -> None:
        """The hosts' receive of the reverse direction on their own cores (splice.steer_receive) while the
        endpoints' offloads are off; where the kernel puts it while they are on (or at their devices' defaults,
        never said), when the hand-off costs more than it saves (emulator/README.md, Capacity)."""
        from vnetbench.lab.splice import steer_receive, unsteer_receive

        wanted = bool(self.ctx.receive_cpus) and self.offload_on is False
        if wanted and self.receive_steering is None:
            self.receive_steering = steer_receive(self.splice, self.ctx.receive_cpus)
        elif not wanted and self.receive_steering is not None:
            unsteer_receive(self.splice)
            self.receive_steering = None

    def apply(self, spec: LinkSpec) -> dict:
        self.install()
        self.spec = spec
        self.emulator.start(emulator_config(spec))
        return self.record()

    def record(self) -> dict:
        emu = self.emulator
        return {"backend": "userspace", "binary": emu.binary, "namespace": emu.ns, "cpu": emu.cpu,
                "nice": emu.nice, "autogroup_nice": emu.autogroup_nice, "receive_cpus": self.receive_steering,
                "applied": {"forward": None, "reverse": None, **_directions(emu.applied())},
                "schedule": self.spec.schedule.describe() if self.spec and self.spec.schedule else None}

    def spliced(self) -> bool:
        """Whether the kernel has this backend's middle namespace on the link (its ends ``a`` and ``b``)."""
        if self.middle is None or not os.path.exists(f"{netns.NETNS_DIR}/{self.middle.name}"):
            return False
        return bool({"a", "b"} & {link.get_attr("IFLA_IFNAME") for link in self.middle.ipr.get_links()})

    def check(self, spec: LinkSpec) -> list[str]:
        out = []
        if self.splice is None or not self.spliced():
            return ["the emulator's namespace is not spliced into the link"]
        # Up and with carrier, as the kernel holds it now: the operational state follows those through the link
        # watch, which runs at most once a second (an end spliced in a moment ago read "DOWN" while it forwarded)
        states = {link.get_attr("IFLA_IFNAME"): ("up" if link["flags"] & IFF_UP else "down",
                                                  "carrier" if link.get_attr("IFLA_CARRIER") else "no carrier")
                  for link in self.middle.ipr.get_links()}
        down = [end for end in ("a", "b") if states.get(end) != ("up", "carrier")]
        if down:
            out.append(f"the emulator's end(s) {', '.join(down)} are not up "
                       f"({', '.join(f'{n}: {a}, {c}' for n, (a, c) in sorted(states.items()))})")
        for end in (self.link.switch_end, self.link.host_end, self.splice.a, self.splice.b):
            out += [f"a {q['kind']} qdisc is on {end.ns.name}/{end.name}, where the emulator alone makes the "
                    "conditions" for q in tc.installed_roots(tc.read_back(end))]
        if self.emulator is None or not self.emulator.alive():
            return out + [self.emulator.death() if self.emulator and self.emulator.death()
                          else "no emulator forwards on the link"]
        wanted = emulator_config(spec, traces=self.traces())
        applied = self.emulator.applied()
        for key, d in (("a_to_b", "forward"), ("b_to_a", "reverse")):
            out += [f"{d}: {p}" for p in settings_differences(wanted[key], applied.get(key) or {})]
        if self.receive_steering is not None:
            from vnetbench.lab.splice import read_rps, reverse_end

            end = reverse_end(self.splice)
            mask = read_rps(end)
            if mask is None or int(mask.replace(",", ""), 16) != int(self.receive_steering.replace(",", ""), 16):
                out.append(f"the receive steering of {end.ns.name}/{end.name} is {mask}, "
                           f"{self.receive_steering} is set")
        return out

    def start_trial(self, spec: LinkSpec, seconds: float) -> None:
        if self.splice is None:
            self.install()
        self.spec = spec
        until = seconds + SCHEDULE_MARGIN_S if spec.schedule is not None else None
        if spec.schedule is not None and spec.schedule.trace is not None:
            self._copy_trace(spec.schedule.trace)
        self.emulator.start(emulator_config(spec, until, self.traces()))

    def traces(self) -> dict[str, str]:
        return {path: copy for path, (_, copy) in self.trace_copies.items()}

    def _copy_trace(self, path: str) -> None:
        """The emulator (root, like this process) reads a copy of the trace's checked bytes in its own work
        directory, not the scenario's path: what stands at that path when a trial starts may be anything by
        then. Copied again only when the file changed."""
        from vnetbench import runfiles
        from vnetbench.impair.trace import read_mahimahi, trace_bytes

        try:
            identity = read_mahimahi(path).identity
            if self.trace_copies.get(path, ((),))[0] == identity:
                return
            trace, data = trace_bytes(path)
        except ValueError as e:
            raise LabError(str(e)) from None
        copy = self.emulator.workdir / f"{self.emulator.tag}.trace{len(self.trace_copies)}"
        with runfiles.create(copy, within=self.ctx.workdir) as f:
            f.write(data)
        self.trace_copies[path] = (trace.identity, str(copy))

    def failure(self) -> str | None:
        return self.emulator.death() if self.emulator is not None else None

    def end_trial(self) -> TrialCounters:
        if self.emulator is None or not self.emulator.alive():
            return TrialCounters()
        s = self.emulator.stats().get("stats", {})
        return TrialCounters({"forward": s.get("a_to_b", {}), "reverse": s.get("b_to_a", {})})

    def healthy(self) -> bool:
        return self.emulator is not None and self.emulator.alive()

    def processes(self) -> list[int]:
        proc = self.emulator.proc if self.emulator is not None else None
        return [proc.pid] if proc is not None and proc.poll() is None else []

    def idle(self) -> None:
        if self.emulator is not None:
            self.emulator.stop()

    def clear(self) -> None:
        if self.emulator is not None and self.emulator.alive():
            self.emulator.start(emulator_config(LinkSpec()))


def _directions(settings: dict[str, Any]) -> dict[str, Any]:
    return {"forward": settings.get("a_to_b"), "reverse": settings.get("b_to_a")}
