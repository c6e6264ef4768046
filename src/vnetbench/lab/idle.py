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
"""

from __future__ import annotations

import os
import struct

PM_QOS = "/dev/cpu_dma_latency"


class WakeLatency:
    """A hold on the CPUs' wake-up latency (0 us) for as long as it is open."""

    def __init__(self) -> None:
        self.fd: int | None = None
        self.state = "not held"

    def hold(self) -> str:
        """Ask for idle cores that poll; what was obtained, for the run's record."""
        if self.fd is not None:
            return self.state
        try:
            fd = os.open(PM_QOS, os.O_WRONLY | os.O_CLOEXEC)
        except OSError as e:
            self.state = f"not held: {PM_QOS}: {e.strerror}"
            return self.state
        try:
            os.write(fd, struct.pack("i", 0))
        except OSError as e:
            os.close(fd)
            self.state = f"not held: writing 0 to {PM_QOS}: {e.strerror}"
            return self.state
        self.fd = fd
        self.state = f"held at 0 us while the lab was up ({PM_QOS}): idle cores polled instead of sleeping"
        return self.state

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
