"""The machine's own facts (vnetbench/machine.py), read from this machine."""

import os

from vnetbench import machine


def test_identity_is_this_machines():
    facts = machine.identity()
    assert facts["kernel"] == os.uname().release and facts["hostname"] == os.uname().nodename
    assert facts["cpus"] == os.cpu_count() and facts["cpu_model"]
    assert machine.memory_bytes() > 2**28


def test_sysctls_read_and_absent():
    assert machine.read_sysctl("net.ipv4.tcp_congestion_control") in \
        machine.read_sysctl("net.ipv4.tcp_available_congestion_control").split()
    assert machine.read_sysctl("net.ipv4.no_such_key") is None
