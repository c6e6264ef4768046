"""The `vm` environment on a real lab: TCG (or KVM) guests bridged onto a switch.

::

    [ bare ns: eth0 198.18.0.1 ] ──veth── [ switch: br0 ] ──veth── [ vm host ns: br0 ── tap0 ══ guest eth0 198.18.0.2 ]

One guest per NIC model (virtio-net, e1000): boot time, iperf3 both ways over
IPv4 and IPv6, ping RTT, killing a remote command; then a guest that cannot
boot. Numbers are printed (pytest -s shows them).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from vnetbench.lab.clean import leftovers
from vnetbench.lab.environments.vm import VmOptions, attach_vm, check_vm_available
from vnetbench.lab.guest.qemu import GuestBootError
from vnetbench.lab.nodes import NamespaceNode, Link, Namespace, without_cpu_time
from vnetbench.lab.teardown import Registry, wait_metered
from vnetbench.workloads import iperf3, ping
from vnetbench.workloads.base import ToolFailed

BARE_V4, BARE_V6 = "198.18.0.1", "2001:2::1"
VM_V4, VM_V6 = "198.18.0.2", "2001:2::2"
BOOT_LIMIT_S = 60.0


@pytest.fixture
def machine_can_run_guests():
    problems = check_vm_available()
    if problems:
        pytest.skip("this machine cannot run vm guests: " + "; ".join(problems))


class Lab:
    """A switch, one bare host and one VM host namespace (the guest is attached by the test)."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.registry = Registry()
        try:
            self.sw = Namespace.create(f"{prefix}-sw", self.registry)
            self.sw.ipr.link("add", ifname="br0", kind="bridge")
            self.sw.link_up("br0")
            bare_ns = Namespace.create(f"{prefix}-b", self.registry)
            link = self._connect(bare_ns, "b")
            link.b.add_address(f"{BARE_V4}/16")
            link.b.add_address(f"{BARE_V6}/64")
            self.bare = NamespaceNode("b", bare_ns, self.registry, BARE_V4, BARE_V6, iface=link.b)
            self.vm_ns = Namespace.create(f"{prefix}-v", self.registry)
            self.uplink = self._connect(self.vm_ns, "v").b
        except BaseException:
            self.registry.teardown()
            raise

    def _connect(self, ns: Namespace, name: str) -> Link:
        link = Link.connect(self.sw, name, ns, "eth0", self.registry)
        self.sw.ipr.link("set", index=link.a.index, master=self.sw.index("br0"))
        for scope in ("all", "default", "eth0"):
            ns.sysctl(f"net.ipv6.conf.{scope}.accept_dad", "0")
        return link

    def teardown(self) -> list[str]:
        return self.registry.teardown()


def qemu_pids_in(prefix: str) -> list[int]:
    """qemu-system processes whose command line names one of this test's namespaces."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmd and cmd[0].endswith(b"qemu-system-x86_64") and any(prefix.encode() in c for c in cmd):
            out.append(int(entry))
    return out


@pytest.fixture
def lab(machine_can_run_guests):
    prefix = f"vnb-vmt{os.getpid() % 100000}"
    lab = Lab(prefix)
    try:
        yield lab
    finally:
        errors = lab.teardown()
        assert not errors, errors
        assert not leftovers(prefix + "-"), f"namespaces left behind: {leftovers(prefix + '-')}"
        assert not qemu_pids_in(prefix), f"QEMU processes left behind: {qemu_pids_in(prefix)}"


def wait_listening(host, port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = host.run(["ss", "-Hltn"], timeout=10).stdout
        if any(line.split()[3].rsplit(":", 1)[1] == str(port) for line in out.splitlines() if line.strip()):
            return
        time.sleep(0.05)
    raise AssertionError(f"iperf3 server on {host.name}:{port} is not listening after {timeout} s")


def iperf3_once(server, client, server_address: str, ip_version: int, tmp: Path, tag: str) -> float:
    """A 3 s TCP stream client -> server; returns the receiver's throughput in Mbit/s."""
    port = iperf3.BASE_PORT
    srv = server.popen(iperf3.server_command(port), tmp / f"{tag}-server.json", tmp / f"{tag}-server.err")
    try:
        wait_listening(server, port)
        spec = iperf3.ClientSpec(server=server_address, port=port, proto="tcp", duration=3, omit=0, rate_bps=None,
                                 congestion_control=None, length=None, ip_version=ip_version)
        out = client.run(iperf3.client_command(spec), timeout=60)
        (tmp / f"{tag}-client.json").write_text(out.stdout)
        try:
            assert out.returncode == 0, f"exited {out.returncode}: {out.stderr[-500:]}"
            return iperf3.parse_client(out.stdout).received_bps / 1e6
        except (AssertionError, ToolFailed) as e:
            # The other end's account: a control connection closed on one side was closed by the other.
            time.sleep(1)
            server_said = ((tmp / f"{tag}-server.json").read_text()[-1500:] +
                           (tmp / f"{tag}-server.err").read_text()[-500:])
            # A stream that stalls (1 in a few hundred guest -> bare over IPv6, seen twice: the sender's segments
            # reach the receiver's interface and get no ACK that moves it) is told apart by which stack dropped
            # what: both kernels' drop counters and sockets go with the failure.
            stacks = "; ".join(f"{node.name}: {stack_state(node)}" for node in (server, client))
            raise AssertionError(f"iperf3 client {tag}: {e}; its server printed: {server_said}; {stacks}") from e
    finally:
        srv.kill()  # the local SSH client only: the guest side must stop with it (checked below)
        srv.wait(timeout=10)


DROP_COUNTER = re.compile(r"Drop|PAWS|Csum|Discard|Prune|Err|Fail|Retrans|Timeout|Overflow|Abort|Collapse")


def stack_state(node) -> str:
    """The node's IP and TCP counters that say a packet was dropped or resent (non-zero ones), and its TCP
    sockets: what a failed stream leaves to explain it."""
    text = node.run(["cat", "/proc/net/netstat", "/proc/net/snmp", "/proc/net/snmp6"], timeout=30).stdout
    counters = {}
    lines = text.splitlines()
    for names, values in zip(lines, lines[1:]):  # netstat and snmp: a line of names, then one of values
        n, v = names.split(), values.split()
        if len(n) == len(v) > 1 and n[0] == v[0] and not n[1].lstrip("-").isdigit():
            counters.update({n[0] + key: value for key, value in zip(n[1:], v[1:])})
    counters.update({p[0]: p[1] for p in map(str.split, lines) if len(p) == 2})  # snmp6: a name and a value
    dropped = {k: v for k, v in counters.items() if DROP_COUNTER.search(k) and v.lstrip("-").isdigit() and int(v)}
    sockets = node.run(["ss", "-tinoe"], timeout=30).stdout
    return f"counters {dropped}; sockets {sockets[-1500:]}"


def ping_rtt(src, dst_address: str, ip_version: int) -> tuple[float, float, int]:
    out = src.run(ping.command(dst_address, 0.2, 56, 3, ip_version), timeout=30)
    result = ping.parse(out.stdout)
    assert result.received > 0, f"no ping replies {src.name} -> {dst_address}: {out.stdout[-300:]} {out.stderr}"
    return float(result.rtt_ms.min()), float(result.rtt_ms.mean()), result.received


@pytest.mark.lab
@pytest.mark.slow
@pytest.mark.parametrize("nic", ["virtio-net", "e1000"])
def test_guest_boots_and_carries_traffic(lab, nic, tmp_path):
    t0 = time.monotonic()
    vm = attach_vm(None, lab.registry, lab.vm_ns, "v", 2, lab.uplink, VM_V4, VM_V6, cpu=None,
                   options=VmOptions(nic=nic, boot_timeout=BOOT_LIMIT_S), workdir=tmp_path / "guest")
    facts = vm.facts()
    print(f"\n[{nic}] attach {time.monotonic() - t0:.2f} s, boot {facts['boot_s']:.2f} s under "
          f"{facts['accelerator']} ({facts['accelerator_reason']})")
    assert facts["accelerator"] in ("kvm", "tcg") and facts["accelerator_reason"]
    assert facts["boot_s"] < BOOT_LIMIT_S
    assert facts["nic"] == nic and facts["kernel"] and Path(facts["console_log"]).exists()
    # Its clock was stepped onto the host's (it boots up to 1 s off): guest-side time series line up.
    print(f"[{nic}] guest clock - host clock after sync: {facts['clock_offset_ms']} ms")
    assert facts["clock_offset_ms"] is not None and abs(facts["clock_offset_ms"]) < 50

    # The guest runs commands like a local process: output, error and exit status are the remote ones.
    r = vm.run(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (r.returncode, r.stdout, r.stderr) == (3, "out\n", "err\n")
    # A timed command says its CPU time after it (vnb-run -t, the guest shell's `times`): a shell loop is CPU
    # all along, so what it used is more than nothing and at most its life (one 10 ms tick of rounding).
    loop = vm.popen(["sh", "-c", "i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done; echo looped >&2"],
                    tmp_path / "loop.out", tmp_path / "loop.err", timed=True)
    wait_metered(loop, timeout=120)
    cpu = vm.cpu_seconds(loop, tmp_path / "loop.err")
    life = loop.ended_at - loop.started_at
    print(f"[{nic}] a shell loop in the guest: {cpu} s of CPU in {life:.2f} s")
    assert cpu is not None and 0 < cpu <= life + 0.01, (cpu, life)
    assert without_cpu_time((tmp_path / "loop.err").read_text()).strip() == "looped"
    # The workload tools are the host's (iputils ping, not busybox's).
    assert "iputils" in vm.run(["ping", "-V"]).stdout
    # Its NIC is the model asked for.
    driver = vm.run(["ethtool", "-i", "eth0"]).stdout
    assert f"driver: {'virtio_net' if nic == 'virtio-net' else 'e1000'}" in driver, driver

    results = {}
    for v, (bare_addr, vm_addr) in ((4, (BARE_V4, VM_V4)), (6, (BARE_V6, VM_V6))):
        results[f"bare->guest v{v}"] = iperf3_once(vm, lab.bare, vm_addr, v, tmp_path, f"in{v}")
        results[f"guest->bare v{v}"] = iperf3_once(lab.bare, vm, bare_addr, v, tmp_path, f"out{v}")
        rtt = ping_rtt(lab.bare, vm_addr, v)
        results[f"ping bare->guest v{v} min/avg ms"] = rtt[:2]
        assert rtt[0] > 0
    for name, value in results.items():
        print(f"[{nic}] {name}: " + (f"{value:.1f} Mbit/s" if isinstance(value, float) else
                                     f"{value[0]:.3f} / {value[1]:.3f}"))
        if isinstance(value, float):
            assert value > 0, f"{name}: no throughput"

    # Killing the local side ends the remote command at once (bench restarts servers on the same port).
    proc = vm.popen(["sleep", "300"], tmp_path / "sleep.out", tmp_path / "sleep.err")
    deadline = time.monotonic() + 15
    while "sleep 300" not in vm.run(["ps", "-o", "args"]).stdout:
        assert time.monotonic() < deadline, "the remote sleep never started"
        time.sleep(0.1)
    proc.kill()
    proc.wait(timeout=5)
    killed = time.monotonic()
    while "sleep 300" in vm.run(["ps", "-o", "args"]).stdout:
        assert time.monotonic() - killed < 3, "the remote command outlived its killed local client"
        time.sleep(0.1)

    # Offload off and back on, read back on both sides.
    off = vm.set_offload(False)
    assert all(not e.get("tso") and not e.get("gso") and not e.get("gro") for e in off), off
    on = vm.set_offload(True)
    assert any(e.get("gso") for e in on), on


@pytest.mark.lab
@pytest.mark.slow
def test_guest_that_does_not_boot_fails_with_console_log(lab, tmp_path):
    log_dir = tmp_path / "logs"
    with pytest.raises(GuestBootError) as err:
        attach_vm(None, lab.registry, lab.vm_ns, "v", 2, lab.uplink, VM_V4, VM_V6, cpu=None,
                  options=VmOptions(boot_timeout=1.0, accel="tcg", log_dir=log_dir), workdir=tmp_path / "guest")
    message = str(err.value)
    print("\n" + message)
    assert "did not answer over SSH within 1 s" in message
    assert err.value.console_log is not None and err.value.console_log.exists()
    assert str(err.value.console_log) in message
    assert err.value.console_log.parent == log_dir


@pytest.mark.lab
@pytest.mark.slow
def test_run_whose_guest_does_not_boot_fails_only_its_trials(machine_can_run_guests, tmp_path, no_leftovers):
    """Through the CLI: bare and vm side by side, the guest given 1 s to boot. The vm trials fail
    naming the console log, which is kept next to the database and in each trial's record; the bare
    trials still run; nothing is left behind."""
    import json

    from helpers import cli, run_id_of
    from vnetbench.store.db import Store

    db = tmp_path / "r.db"
    proc = cli("run", "virt-compare", "--db", str(db), "--no-progress",
               "--set", 'env=[{env="bare"},{env="vm",nic="virtio-net"}]', "--set", 'offload=["on"]',
               "--set", 'load=[{proto="udp",offered="10Mbit"}]', "--set", "repetitions=2", "--set", "duration=2s",
               env={**os.environ, "VNETBENCH_VM_BOOT_TIMEOUT": "1", "VNETBENCH_VM_ACCEL": "tcg"})
    run_id = run_id_of(proc)
    assert "2 of 4 trials failed" in " ".join(proc.stdout.split()), proc.stdout
    with Store(db) as store:
        configs = {c["key"]: c["labels"]["env"] for c in store.configurations(run_id)}
        trials = store.trials(run_id, with_raw=True)
    by_env = {"bare": [], "vm": []}
    for t in trials:
        by_env[configs[t["config_key"]]].append(t)
    assert [t["status"] for t in by_env["bare"]] == ["ok", "ok"]
    assert [t["status"] for t in by_env["vm"]] == ["failed", "failed"]
    for t in by_env["vm"]:
        assert "did not answer over SSH within 1 s" in t["reason"], t["reason"]
        kept = t["raw"]["environment_unavailable"]["kept"]
        assert kept and all(Path(p).exists() and str(db.parent) in p for p in kept.values()), kept
        assert all(p in t["reason"] for p in kept.values())
        logs = t["raw"]["environment_unavailable"]["console_logs"]
        assert any("Linux version" in text or "SeaBIOS" in text for text in logs.values()), json.dumps(logs)[:2000]


@pytest.mark.lab
@pytest.mark.slow
def test_kvm_that_hangs_falls_back_to_tcg(lab, tmp_path, monkeypatch):
    """`auto`: a KVM guest that never answers (here a stand-in QEMU that just sleeps) is given up
    after the probe timeout; the guest then boots under TCG and says why, and the failure is kept for the
    machine's later runs."""
    import json

    from vnetbench.lab.guest import qemu

    monkeypatch.setattr(qemu, "_KVM_VERDICT", None)
    monkeypatch.setattr(qemu, "KVM_FAILURE_FILE", tmp_path / "kvm-failure.json")  # not the machine's own
    monkeypatch.setattr(qemu, "kvm_available", lambda: (True, "/dev/kvm opens"))
    real_argv = qemu.Guest.qemu_argv
    monkeypatch.setattr(qemu.Guest, "qemu_argv",
                        lambda self, accel: ["sleep", "600"] if accel == "kvm" else real_argv(self, accel))
    vm = attach_vm(None, lab.registry, lab.vm_ns, "v", 2, lab.uplink, VM_V4, VM_V6, cpu=None,
                   options=VmOptions(accel="auto", kvm_probe_timeout=2.0), workdir=tmp_path / "guest")
    facts = vm.facts()
    print(f"\n{facts['accelerator']}: {facts['accelerator_reason']} (probe {facts['kvm_probe_s']} s, "
          f"boot {facts['boot_s']} s)")
    assert facts["accelerator"] == "tcg"
    assert "did not answer over SSH within 2 s" in facts["accelerator_reason"]
    assert 2.0 <= facts["kvm_probe_s"] < 5.0
    assert vm.run(["true"]).returncode == 0
    assert qemu._KVM_VERDICT is not None and qemu._KVM_VERDICT[0] is False
    kept = json.loads((tmp_path / "kvm-failure.json").read_text())
    assert kept["key"] == vm.guest.kvm_key() and kept["key"]["boot_id"] and kept["key"]["guest_kernel"], kept
    assert "did not answer over SSH within 2 s" in kept["reason"]


def test_doctor_names_what_to_install(monkeypatch):
    from vnetbench.lab.environments import vm
    from vnetbench.lab.guest import initramfs

    monkeypatch.setattr(vm.shutil, "which", lambda cmd, path=None: None)
    monkeypatch.setattr(initramfs, "find_kernel", lambda version=None: (_ for _ in ()).throw(
        initramfs.EnvironmentProblem("no kernel image (/boot/vmlinuz-*) with its modules to boot guests with")))
    problems = " | ".join(vm.check_vm_available())
    for fix in ("apt-get install qemu-system-x86", "apt-get install linux-image-amd64",
                "apt-get install dropbear-bin"):
        assert fix in problems, problems


def test_initramfs_is_reproducible_and_complete(machine_can_run_guests, tmp_path):
    """Same inputs, same bytes; and the archive holds what the guest needs, under the names it uses."""
    from vnetbench.lab.guest import initramfs

    plan = initramfs.plan()
    first, second = initramfs._render(plan), initramfs._render(initramfs.plan())
    assert first == second
    assert initramfs._digest(plan)[0] == initramfs._digest(initramfs.plan())[0]
    names, pos = set(), 0
    while True:  # walk the newc headers
        assert first[pos:pos + 6] == b"070701", f"bad header at {pos}"
        size, namesize = int(first[pos + 54:pos + 62], 16), int(first[pos + 94:pos + 102], 16)
        name = first[pos + 110:pos + 110 + namesize - 1].decode()
        if name == "TRAILER!!!":
            break
        names.add(name)
        pos += 110 + namesize
        pos += -pos % 4
        pos += size + (-size % 4)
    for needed in ("init", "bin/busybox", "bin/sh", "bin/iperf3", "bin/ping", "bin/ethtool", "bin/dropbear",
                   "bin/vnb-run", "dev/console", "lib64/ld-linux-x86-64.so.2",
                   "lib/modules/kernel/drivers/net/virtio_net.ko",
                   "lib/modules/kernel/drivers/net/ethernet/intel/e1000/e1000.ko"):
        assert needed in names, f"{needed} missing from the initramfs"
    assert any(n.endswith("/libiperf.so.0") for n in names)
    # Dependencies load first: virtio_net needs net_failover, which needs failover.
    order = plan.modules["virtio-net"]
    assert order.index("kernel/net/core/failover.ko") < order.index("kernel/drivers/net/net_failover.ko") \
        < order.index("kernel/drivers/net/virtio_net.ko")
