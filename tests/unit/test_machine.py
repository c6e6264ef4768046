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


def test_a_failed_kvm_probe_is_kept_for_later_runs_of_this_boot_with_the_same_kernels_and_qemu(tmp_path, monkeypatch):
    """A later run's guest starts under TCG at once, saying when KVM was found unusable; a different guest kernel,
    QEMU, host kernel or boot probes again, and a file that is not ours to read is no verdict."""
    from vnetbench.lab.guest import qemu

    monkeypatch.setattr(qemu, "KVM_FAILURE_FILE", tmp_path / "run" / "kvm-failure.json")
    monkeypatch.setattr(qemu, "kvm_available", lambda: (True, "/dev/kvm opens"))
    key = {"boot_id": "b-1", "host_kernel": "6.18", "qemu": "QEMU 7.2", "guest_kernel": "6.1.0-40-amd64"}
    assert qemu.kept_kvm_failure(key) is None
    qemu.keep_kvm_failure(key, "KVM probe failed: did not answer over SSH within 15 s")
    assert (tmp_path / "run").stat().st_mode & 0o777 == 0o700
    kept = qemu.kept_kvm_failure(key)
    assert kept.startswith("KVM probe failed: did not answer over SSH within 15 s (a run on this machine found it at ")
    assert kept.endswith(qemu.KEPT)
    for field, other in (("boot_id", "b-2"), ("host_kernel", "6.19"), ("qemu", "QEMU 8.0"), ("guest_kernel", "6.2")):
        assert qemu.kept_kvm_failure({**key, field: other}) is None, field
    qemu.keep_kvm_failure({**key, "boot_id": None}, "no boot id: not kept")
    assert qemu.kept_kvm_failure(key) == kept
    # a guest of a later run: TCG at once, with the reason, and the run's later guests alike
    guest = qemu.Guest.__new__(qemu.Guest)
    guest.config = qemu.GuestConfig(accel="auto")
    guest.accel_reason = None
    monkeypatch.setattr(qemu.Guest, "kvm_key", lambda self: key)
    monkeypatch.setattr(qemu, "_KVM_VERDICT", None)
    assert guest._first_accel() == "tcg"
    assert guest.accel_reason == f"{kept}; using TCG (software emulation)"
    assert qemu._KVM_VERDICT == (False, kept)
    (tmp_path / "run" / "kvm-failure.json").write_text("{not json")
    assert qemu.kept_kvm_failure(key) is None
