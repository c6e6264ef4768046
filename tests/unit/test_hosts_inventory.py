"""Ansible inventories (YAML and INI) read by ansible-core, and endpoint references resolved against them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vnetbench.hosts.inventory import InventoryError, InventoryHost, load

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "inventory"


@pytest.fixture(params=["hosts.yml", "hosts.ini"])
def inv(request):
    return load(FIXTURES / request.param)


def test_hosts_with_connection_variables(inv):
    assert list(inv.hosts) == ["server-a", "client-1", "client-2"]  # the range client-[1:2] expanded, in order
    a = inv.hosts["server-a"]
    assert (a.address, a.user, a.port, a.private_key_file) == ("198.18.0.10", "bench", 2222, None)
    c = inv.hosts["client-2"]
    # No ansible_host: the name is the address; ansible_user from group_vars/clients.yml, templated.
    assert (c.address, c.user, c.port) == ("client-2", "loadgen", None)
    assert c.private_key_file == os.path.expanduser("~/.ssh/id_bench")


def test_variables_resolve_as_ansible_does(inv):
    a, c = inv.hosts["server-a"], inv.hosts["client-1"]
    assert a.vars["role"] == "receiver"  # host var > group var
    assert c.vars["role"] == "client"
    assert a.vars["ntp"] == c.vars["ntp"] == "lab-ntp"  # child group "lab" > all
    assert c.vars["rack"] == "r7" and "rack" not in a.vars  # group_vars/ beside the file
    assert "inventory_hostname" not in a.vars and "groups" not in a.vars  # Ansible's magic variables are not ours
    assert type(a.vars["ntp"]) is str and type(a.port) is int  # builtins, not Ansible's tagged types


def test_groups_and_children(inv):
    assert set(inv.hosts["client-1"].groups) == {"clients", "lab"}
    assert inv.groups["lab"] == ("server-a", "client-1", "client-2")
    assert inv.groups["clients"] == ("client-1", "client-2")


def test_resolve_hosts_groups_and_lists(inv):
    assert [h.name for h in inv.resolve("server-a")] == ["server-a"]
    assert [h.name for h in inv.resolve("clients")] == ["client-1", "client-2"]
    assert [h.name for h in inv.resolve(["client-2", "clients", "server-a"])] == ["client-2", "client-1", "server-a"]
    assert isinstance(inv.resolve("client-1")[0], InventoryHost)


def test_unknown_reference_names_file_name_and_what_exists(inv):
    with pytest.raises(InventoryError) as e:
        inv.resolve(["clients", "server-b"])
    msg = str(e.value)
    assert str(inv.path) in msg and "'server-b'" in msg
    assert "hosts: server-a, client-1, client-2" in msg and "groups: servers, clients, lab" in msg
    assert "\n" not in msg


def test_missing_file(tmp_path):
    with pytest.raises(InventoryError, match=r"inv\.yml: no such inventory file"):
        load(tmp_path / "inv.yml")


def test_broken_yaml_says_where(tmp_path):
    p = tmp_path / "inv.yml"
    p.write_text("all:\n  hosts:\n    a: [1\n")
    with pytest.raises(InventoryError) as e:
        load(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}: not a valid Ansible YAML inventory") and "line 4" in msg and "\n" not in msg


def test_broken_ini(tmp_path):
    p = tmp_path / "inv.ini"
    p.write_text("[web\nfoo\n")
    with pytest.raises(InventoryError, match="not a valid Ansible INI inventory"):
        load(p)


def test_bad_port_names_host_key_and_value(tmp_path):
    p = tmp_path / "inv.yml"
    p.write_text("all:\n  hosts:\n    box:\n      ansible_port: 99999\n")
    with pytest.raises(InventoryError) as e:
        load(p)
    assert str(e.value) == f"{p}: host box: ansible_port = 99999 is not a TCP port; give a number from 1 to 65535"


def test_executable_inventory_is_not_run(tmp_path):
    # Ansible's script plugin would execute this file; vnetbench runs as root and only reads inventories.
    marker = tmp_path / "ran"
    p = tmp_path / "inv.sh"
    p.write_text(f"#!/bin/sh\ntouch {marker}\necho '{{}}'\n")
    p.chmod(0o755)
    with pytest.raises(InventoryError):
        load(p)
    assert not marker.exists()


def test_home_is_not_written(tmp_path):
    # Left alone, ansible-core creates ~/.ansible/tmp the moment its constants are imported.
    code = f"from vnetbench.hosts.inventory import load; load({str(FIXTURES / 'hosts.yml')!r})"
    env = {**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    for k in [k for k in env if k.startswith("ANSIBLE_")]:
        del env[k]
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)
    assert not (tmp_path / ".ansible").exists()


def test_a_process_killed_after_reading_an_inventory_leaves_no_ansible_temp_dir(tmp_path):
    """Ansible removes its local temp directory at exit; a vnetbench killed with SIGKILL mid-run never exits."""
    source = FIXTURES / "hosts.yml"
    code = ("import os, sys; from vnetbench.hosts.inventory import load; load(sys.argv[1]); "
            "print(os.getpid(), flush=True); os.kill(os.getpid(), 9)")
    proc = subprocess.run([sys.executable, "-c", code, str(source)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "TMPDIR": str(tmp_path)})
    assert proc.returncode == -9 and proc.stdout.strip().isdigit(), proc.stderr
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(f"ansible-local-{proc.stdout.strip()}")]
