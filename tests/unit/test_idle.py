"""The lab's hold on the CPUs' wake-up latency (lab/idle.py): 0 while held, the kernel's own after."""

from __future__ import annotations

import os
import struct

import pytest

from vnetbench.lab.idle import PM_QOS, WakeLatency

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists(PM_QOS), reason=f"needs root and {PM_QOS}")


def _target() -> int:
    with open(PM_QOS, "rb") as f:
        return struct.unpack("i", f.read(4))[0]


def test_the_hold_asks_for_0_us_and_goes_with_its_release():
    before = _target()
    wake = WakeLatency()
    assert wake.hold().startswith("held at 0 us") and _target() == 0
    assert wake.hold() == wake.state  # held once
    wake.release()
    assert _target() == before and wake.fd is None


def test_where_it_cannot_be_held_the_record_says_why(monkeypatch):
    monkeypatch.setattr("vnetbench.lab.idle.PM_QOS", "/nonexistent/cpu_dma_latency")
    wake = WakeLatency()
    assert wake.hold() == "not held: /nonexistent/cpu_dma_latency: No such file or directory"
    wake.release()
