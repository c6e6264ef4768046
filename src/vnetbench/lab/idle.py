"""Idle cores that answer at once: the lab holds the CPU wake-up latency at 0 while it is up.

An idle core of this machine halts (cpuidle's deepest state; on a VM the hypervisor then takes the virtual CPU
off its physical one), and the next packet for a process on it waits for the core to wake: tens of
microseconds on metal, milliseconds on a busy hypervisor. Between the packets of a request/response exchange
through a 5 ms delay each way the cores sit idle, and on the 2-core VM the median round trip came out 10.3 to
11.7 ms in repeated runs of the same scenario; with the wake-up latency held at 0 it was 10.18 to 10.22 ms
(and the zero-delay round trip 46 instead of 80 us). Holding it is what latency benchmarks do (cyclictest,
tuned's latency-performance profile): a PM QoS request on /dev/cpu_dma_latency, kept for as long as its file
stays open, after which the kernel drops it (a killed run leaves nothing). Idle cores then poll, which costs
power, not measurements.

The kernel honours that request through its cpuidle driver. A kernel that registered none (a VM's, whose
/sys/devices/system/cpu/cpuidle/current_driver says "none") halts idle cores all the same: there the round
trip through 5 ms each way came out 10.42 to 10.64 ms against a zero-delay floor of 50 to 57 us, in CI and here.
That is what the machine does, and the run's record says so with what a wake-up costs (:func:`probe_wake_up`).

A scenario that wants the cores polling there all the same sets `lab.idle_cores = "poll"`: `vnb-link idle-poll`
runs one thread per core under SCHED_IDLE (it runs only when nothing else there can, and a task that wakes there
preempts it at once), niced so that /proc/stat counts its time as `nice`. The CPU recorder counts that time back
as idle (:meth:`WakeLatency.polled_ns`): a core that polls is as idle as one that halts, for what a trial costs.
The pollers end with the lab, and by themselves when the run's process is gone. It is not the default: a VM's
polling cores take the hypervisor's CPU all the time the lab is up (a cloud instance's CPU credits, a CPU quota
that then throttles the whole VM), and in CI, with them on for every lab, streams came out short of their links
and containers' CPU time twice what it is here.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import struct
import subprocess
from pathlib import Path

from vnetbench import machine
from vnetbench.errors import EnvironmentProblem, LabError
from vnetbench.lab.cgroups import CGroup, Limits
from vnetbench.lab.teardown import Registry, atomic, start_process

PM_QOS = "/dev/cpu_dma_latency"
CPUIDLE_DRIVER = Path("/sys/devices/system/cpu/cpuidle/current_driver")
POLLER_THREAD = "vnb-idle/"  # the pollers' thread names: vnb-idle/<core>
READY_TIMEOUT_S = 5.0
# The wake-up probe: a sleep as long as a round trip's half through a few milliseconds of delay, and enough
# wake-ups for a stable median (0.3 s of the lab's bring-up)
WAKE_PROBE_ASLEEP_US = 5000
WAKE_PROBE_SAMPLES = 60


def cpuidle_driver() -> str | None:
    """The kernel's cpuidle driver, through which a PM QoS request acts; None when it registered none (or has
    no cpuidle at all)."""
    try:
        name = CPUIDLE_DRIVER.read_text().strip()
    except OSError:
        return None
    return None if name in ("", "none") else name


class _Pollers:
    """The one `vnb-link idle-poll` of this process, shared by its labs (a run's topologies are up at once, and
    two sets of pollers would each count the other's time as busy), ended when the last lets go."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.registry = Registry()  # their cgroup, which outlives the lab that made it while others use it
        self.users = 0

    def take(self, cores: list[int], run_prefix: str) -> None:
        if self.proc is None:
            self.registry = Registry()
            try:
                # In a cgroup of their own that is idle as a whole: a group competes for a core with the weight
                # of the group, not of its tasks, and the pollers' own session (autogroup) or vnetbench's took
                # 30-40 % of a core from a busy loop beside them
                group = CGroup.create(f"{run_prefix}-idle", Limits(cpu_idle=True), self.registry)
                self.proc = _start_pollers(cores, group.wrapper())
            except BaseException:
                self.registry.teardown()
                raise
        self.users += 1

    def let_go(self) -> None:
        self.users -= 1
        if self.users <= 0 and self.proc is not None:
            proc, self.proc, self.users = self.proc, None, 0
            _stop(proc)
            errors = self.registry.teardown()
            if errors:  # said with the lab's own teardown problems
                raise LabError("; ".join(errors))

    def polled_ns(self) -> dict[str, int]:
        if self.proc is None:
            return {}
        return {f"cpu{name.removeprefix(POLLER_THREAD)}": ns for name, ns in machine.threads_cpu_ns(self.proc.pid)
                if name.startswith(POLLER_THREAD)}


_POLLERS = _Pollers()


class WakeLatency:
    """A hold on the CPUs' wake-up latency (0 us) for as long as it is open: a PM QoS request, and where the
    kernel has no cpuidle driver to honour it, pollers on the cores if asked (`poll`)."""

    def __init__(self, run_prefix: str, poll: bool = False) -> None:
        self.run_prefix = run_prefix  # the pollers' cgroup is named after the run, for `vnetbench clean`
        self.poll = poll  # where the kernel has no cpuidle driver, keep idle cores polling (lab.idle_cores)
        self.fd: int | None = None
        self.polling = False
        self.state = "not held"
        self.wake_up: dict | None = None  # what a wake-up costs meanwhile (probe_wake_up), for the run's record

    def hold(self) -> str:
        """Ask for idle cores that poll (through PM QoS, and with `poll` by pollers where that cannot act); what
        was obtained, for the run's record."""
        if self.fd is not None or self.polling:
            return self.state
        requested = self._request()
        driver = cpuidle_driver()
        if driver is not None:
            self.state = (f"held at 0 us while the lab was up ({PM_QOS}, cpuidle driver {driver}): idle cores "
                          "polled instead of sleeping" if requested is None else f"not held: {requested}")
            return self.state
        if not self.poll:
            self.state = (f"not held: the kernel has no cpuidle driver, through which {PM_QOS} acts, so idle cores "
                          "halted and a process woken there started late (cpu_wake_up: by how much); "
                          'lab.idle_cores = "poll" keeps them polling')
            return self.state
        cores = sorted(os.sched_getaffinity(0))
        try:
            _POLLERS.take(cores, self.run_prefix)
        except (OSError, LabError, EnvironmentProblem) as e:
            self.state = (f"not held: the kernel has no cpuidle driver, through which {PM_QOS} acts, and idle "
                          f"cores could not be kept polling: {e}")
            return self.state
        self.polling = True
        self.state = (f"held by polling while the lab was up: the kernel has no cpuidle driver, through which "
                      f"{PM_QOS} acts, so idle cores {_cores(cores)} ran vnb-link idle-poll's SCHED_IDLE threads "
                      "instead of halting (their time is counted as idle)")
        return self.state

    def _request(self) -> str | None:
        """The PM QoS request; None once made, else why not."""
        try:
            fd = os.open(PM_QOS, os.O_WRONLY | os.O_CLOEXEC)
        except OSError as e:
            return f"{PM_QOS}: {e.strerror}"
        try:
            os.write(fd, struct.pack("i", 0))
        except OSError as e:
            os.close(fd)
            return f"writing 0 to {PM_QOS}: {e.strerror}"
        self.fd = fd
        return None

    def polled_ns(self) -> dict[str, int]:
        """Per core ("cpu0", as /proc/stat names it) the time the pollers have run there so far, in nanoseconds
        (the scheduler's count, /proc/<pid>/task/<tid>/schedstat); empty when none run."""
        return _POLLERS.polled_ns() if self.polling else {}

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self.polling:
            self.polling = False
            _POLLERS.let_go()


def how_held() -> tuple[bool, str, str]:
    """For `vnetbench doctor`: whether a lab can keep idle cores from halting here, how, and what to do if not."""
    from vnetbench.impair.backend import find_binary

    driver = cpuidle_driver()
    if driver is not None:
        return True, f"cpuidle driver {driver}: a lab asks it for 0 us of wake-up latency ({PM_QOS})", ""
    halting = (f"no cpuidle driver, through which {PM_QOS} acts: idle cores halt while a lab is up, and a round "
               "trip through a delay pays their wake-up twice (a run stores what one costs, cpu_wake_up)")
    if find_binary() is not None:
        return True, f'{halting}; lab.idle_cores = "poll" keeps them polling (vnb-link idle-poll, SCHED_IDLE)', ""
    return False, f"{halting}; and no vnb-link to keep them polling", "`make setup` builds vnb-link"


def held(registry: Registry, run_prefix: str, idle_cores: str = "pm-qos") -> WakeLatency:
    """A hold for as long as `registry`'s lab is up (known to the registry before it is taken, so that no
    interruption between leaves cores polling), as `idle_cores` (lab.idle_cores) asks, and what a wake-up then
    costs (`wake_up`)."""
    wake = WakeLatency(run_prefix, poll=idle_cores == "poll")
    registry.add("the hold on the CPUs' wake-up latency", wake.release)
    wake.hold()
    wake.wake_up = probe_wake_up()
    return wake


def probe_wake_up(asleep_us: int = WAKE_PROBE_ASLEEP_US, samples: int = WAKE_PROBE_SAMPLES) -> dict | None:
    """How late a process asleep on one core wakes when another core hands it a message, after `asleep_us` of
    sleep and right away (`vnb-link wake-probe`, medians in microseconds), or None where there is no second core
    or no vnb-link. A request/response exchange through a delay pays the difference twice a round trip (server
    and client each sleep through the delay), which an exchange without delay does not: on the 2-core VM, with
    its cores polled, 22 to 72 us after 5 ms asleep against 8 to 18 at once; with them halting, 96."""
    from vnetbench.impair.backend import find_binary

    cores = sorted(os.sched_getaffinity(0))
    binary = find_binary()
    if len(cores) < 2 or binary is None:
        return None
    argv = [binary, "wake-probe", str(cores[0]), str(cores[-1]), str(asleep_us), str(samples)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        return json.loads(done.stdout) if done.returncode == 0 else {"error": done.stderr.strip()[-300:]}
    except (OSError, subprocess.TimeoutExpired, ValueError) as e:
        return {"error": f"{' '.join(argv)}: {e}"[:300]}


def _start_pollers(cores: list[int], wrapper: list[str]) -> subprocess.Popen:
    """`vnb-link idle-poll` on `cores`, started through `wrapper` (the command line that joins its cgroup), once
    it says it polls there (OSError: why not)."""
    from vnetbench.impair.backend import find_binary, missing_binary_message

    binary = find_binary()
    if binary is None:
        raise OSError(missing_binary_message())
    with atomic():  # no interruption between the start and the try that stops it on one
        proc = start_process([*wrapper, binary, "idle-poll", *map(str, cores)], stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        if _ready(proc):
            return proc
    except BaseException:
        _stop(proc)
        raise
    said = _stop(proc).removeprefix("vnb-link: ")
    raise OSError(said or f"vnb-link idle-poll printed no 'ready' within {READY_TIMEOUT_S:g} s")


def _ready(proc: subprocess.Popen) -> bool:
    """Whether `proc` printed "ready" within READY_TIMEOUT_S (False too when it ended first)."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if sel.select(READY_TIMEOUT_S):
            return proc.stdout.readline().strip() == b"ready"
    return False


def _stop(proc: subprocess.Popen) -> str:
    """End the poller; what it said on standard error."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(2.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    said = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
    return said


def _cores(cores: list[int]) -> str:
    return ", ".join(map(str, cores))
