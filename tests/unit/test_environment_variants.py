"""Environment plumbing that needs no root: variants, host names, cgroup wrapper, relative report."""

from pathlib import Path

import numpy as np
import pytest

from vnetbench.lab import cgroups
from vnetbench.lab.environments import Variant
from vnetbench.lab.environments.base import Subnet, underlay_addresses
from vnetbench.lab.topology import variant_tags
from vnetbench.report.relative import relative_rows
from vnetbench.runner.bench import variant_of
from vnetbench.scenario import load as L
from vnetbench.scenario import plan as P


def test_variants_are_the_structural_environment_choices():
    configs = P.expand(L.load("virt-compare"))
    variants = list(dict.fromkeys(variant_of(c) for c in configs))
    # offload and the workload are applied per trial: they do not multiply the hosts or guests to build.
    assert variants == [Variant("bare"), Variant("container"), Variant("docker"), Variant("podman"),
                        Variant("vm", nic="virtio-net"),
                        Variant("vm", nic="e1000"), Variant("overlay", overlay="vxlan"),
                        Variant("overlay", overlay="routed")]
    assert str(Variant("vm", nic="e1000")) == "vm(nic=e1000)" and str(Variant("bare")) == "bare"


def test_each_environment_declares_itself_in_one_place():
    from dataclasses import fields

    from vnetbench.lab import environments
    from vnetbench.lab.environments.base import REGISTRY
    from vnetbench.scenario.model import LabSpec

    assert list(REGISTRY) == ["bare", "container", "docker", "podman", "overlay", "vm"]
    owners = environments.option_owners()
    # A Variant carries exactly the options the environments declare, and each is a typed lab field.
    assert {f.name for f in fields(Variant)} == {"env", "mtu", *owners}
    assert set(owners) <= set(LabSpec.model_fields) and LabSpec.ENV_OPTIONS == owners
    assert owners["nic"] == ("vm",) and owners["overlay"] == ("overlay",)
    # The container's limits mean the same whether vnetbench's model or the engine applies them.
    assert owners["cpu_quota"] == owners["cpuset"] == owners["memory_limit"] == ("container", "docker", "podman")
    assert len({cls.tag for cls in REGISTRY.values()}) == len(REGISTRY)
    # The scenario's env accepts exactly the registered kinds, and an unknown one names them.
    with pytest.raises(Exception, match="'bare', 'container', 'docker', 'podman', 'overlay' or 'vm'"):
        LabSpec(env="lxc")
    assert environments.problems([Variant("lxc")]) == [
        "env lxc: unknown environment 'lxc'; known: bare, container, docker, podman, overlay, vm"]
    # doctor's list comes from every environment's own checks, in registry order.
    names = [c.name for c in environments.availability(probe=False)]
    assert names[0] == "bare" and names.index("container") < names.index("overlay (vxlan)") < names.index("vm kvm")


def test_host_names_carry_a_short_tag_only_when_the_lab_has_several_variants():
    assert variant_tags([Variant("bare")]) == {Variant("bare"): ""}  # the dumbbell as it always was: r, s1, ...
    tags = variant_tags([Variant("bare"), Variant("container"), Variant("overlay", overlay="vxlan"),
                         Variant("overlay", overlay="routed"), Variant("vm", nic="e1000")])
    assert list(tags.values()) == ["b-", "c-", "o1-", "o2-", "v-"]


def test_addresses_stay_in_the_benchmarking_ranges():
    import ipaddress

    v4 = ipaddress.ip_network("198.18.0.0/15")
    v6 = ipaddress.ip_network("2001:2::/48")
    for n in (1, 249, 250, 63_749):
        a4, a6 = underlay_addresses(n)
        assert ipaddress.ip_address(a4) in ipaddress.ip_network("198.18.0.0/16") and ipaddress.ip_address(a6) in v6
    for k in (1, 255):
        s = Subnet(k)
        assert ipaddress.ip_network(s.cidr4).subnet_of(ipaddress.ip_network("198.19.0.0/16"))
        assert ipaddress.ip_network(s.cidr6).subnet_of(v6) and ipaddress.ip_address(s.v6(2)) in v6
        assert ipaddress.ip_address(s.v4(2)) in v4


def test_cgroup_wrapper_joins_every_hierarchy_then_execs():
    group = cgroups.CGroup("vnb-x-c-r", cgroups.Limits(cpu_quota=0.5, memory_bytes=1 << 28),
                           dirs={"cpu": Path("/sys/fs/cgroup/cpu/vnb-x-c-r"),
                                 "memory": Path("/sys/fs/cgroup/memory/vnb-x-c-r")},
                           version={"cpu": 1, "memory": 1})
    argv = group.wrapper()
    assert argv[:2] == ["sh", "-c"] and argv[3] == "vnb-cgroup"
    assert argv[2] == ("echo $$ > /sys/fs/cgroup/cpu/vnb-x-c-r/cgroup.procs && "
                       "echo $$ > /sys/fs/cgroup/memory/vnb-x-c-r/cgroup.procs && exec \"$@\"")
    assert cgroups.Limits().controllers() == [] and not cgroups.Limits()
    assert cgroups.Limits(cpuset="1").controllers() == ["cpuset"]
    with pytest.raises(ValueError, match="vnb-"):
        cgroups.CGroup.create("docker-1", cgroups.Limits(cpu_quota=1), registry=None)


def _cfg(key, **labels):
    return {"key": key, "labels": labels}


def test_relative_rows_pair_each_environment_with_bare_running_the_same_workload():
    configs = [
        _cfg("b1", env="bare", offload="on", proto="tcp"), _cfg("b0", env="bare", offload="off", proto="tcp"),
        _cfg("c1", env="container", offload="on", proto="tcp"), _cfg("c0", env="container", offload="off", proto="tcp"),
        _cfg("v1", env="vm", nic="e1000", offload="on", proto="tcp"),
        _cfg("bu", env="bare", offload="on", proto="udp"), _cfg("ou", env="overlay", overlay="routed", offload="on",
                                                               proto="udp"),
    ]
    values = {
        "b1": {"throughput.rx_mbps": np.array([1000.0, 1000.0])}, "b0": {"throughput.rx_mbps": np.array([500.0])},
        "c1": {"throughput.rx_mbps": np.array([900.0])}, "c0": {"throughput.rx_mbps": np.array([250.0])},
        "v1": {"throughput.rx_mbps": np.array([100.0, 300.0])},
        "bu": {"udp.loss_ratio": np.array([0.0])}, "ou": {"udp.loss_ratio": np.array([0.02])},
    }
    rows = relative_rows(configs, values, ["throughput.rx_mbps", "udp.loss_ratio"])
    got = {(r.environment, r.context["offload"], r.context["proto"]): r for r in rows}
    assert got[("container", "on", "tcp")].cells["throughput.rx_mbps"] == (900.0, 1000.0)
    assert got[("container", "off", "tcp")].cells["throughput.rx_mbps"] == (250.0, 500.0)  # vs bare offload=off
    assert got[("vm e1000", "on", "tcp")].cells["throughput.rx_mbps"] == (200.0, 1000.0)
    assert got[("overlay routed", "on", "udp")].cells["udp.loss_ratio"] == (0.02, 0.0)
    assert got[("bare", "on", "tcp")].cells["throughput.rx_mbps"] == (1000.0, 1000.0)
    # Bare first within each workload, workloads in matrix order.
    assert [r.environment for r in rows][:3] == ["bare", "container", "vm e1000"]
    assert relative_rows([_cfg("x", proto="tcp")], {}) == []  # no env label: nothing to compare


def test_a_guest_gets_a_host_cpu_per_vcpu_from_its_endpoints_on(monkeypatch, tmp_path):
    from vnetbench.lab.guest import qemu

    monkeypatch.setattr(qemu.os, "cpu_count", lambda: 4)

    def guest(vcpus, cpu):
        return qemu.Guest(name="g", ns=None, tap="t", mgmt_tap="m", ipv4="198.18.0.2/16", ipv6="2001:2::2/64",
                          number=1, config=qemu.GuestConfig(vcpus=vcpus), workdir=tmp_path, log_dir=tmp_path,
                          registry=None, cpu=cpu)

    assert guest(1, 2).host_cpus() == [2]  # as a bare endpoint's process would be
    assert guest(2, 3).host_cpus() == [0, 3]  # wraps around
    assert guest(8, 1).host_cpus() == [0, 1, 2, 3]  # no more than the machine has
    assert guest(4, None).host_cpus() is None  # unpinned endpoint: QEMU unpinned


def test_a_tool_a_guest_cannot_carry_is_named_before_anything_is_built():
    from vnetbench.lab import environments

    found = environments.tool_problems({
        Variant("vm", nic="virtio-net"): [("iperf3", "iperf3"), ("ldd", "libc-bin"), ("vnb-no-such-tool", "nopkg")],
        Variant("bare"): [("vnb-no-such-tool", "nopkg")],  # the host's own preflight covers namespaces
    })
    assert found == [
        "env vm(nic=virtio-net): ldd (/usr/bin/ldd) is a script for /bin/bash, which a guest does not have (it "
        "carries busybox and ELF binaries only) -> run this workload in another environment",
        "env vm(nic=virtio-net): vnb-no-such-tool is not installed on this machine, so it cannot be copied into "
        "the guest -> apt-get install nopkg"]


def test_an_endpoint_takes_the_namespace_the_lab_wired_for_it():
    # The lab wires every endpoint's namespace (a dumbbell's on the switch, a topology's on its links); the
    # environment takes it as its node (a container sits behind it) and makes no link of its own. One the
    # lab did not wire is named, with those it did.
    from vnetbench.errors import LabError
    from vnetbench.lab.environments.base import LabContext, WiredNamespace, wired_namespace
    from vnetbench.lab.teardown import Registry

    wired = WiredNamespace(ns=object(), iface=object(), port=None, ipv4="198.18.0.2", ipv6="2001:2::2")
    ctx = LabContext("vnb-test", Registry(), wired={"h1": wired})
    assert wired_namespace(ctx, "h1") is wired
    with pytest.raises(LabError, match=r"endpoint 'h2': the lab wired no namespace for it \(wired: h1\)"):
        wired_namespace(ctx, "h2")
