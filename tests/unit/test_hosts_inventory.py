"""Ansible inventories (YAML and INI) read by ansible-core, and endpoint references resolved against them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

import vnetbench
from helpers import hostile_names, tree_state
from vnetbench.hosts.inventory import InventoryError, InventoryHost, load
from vnetbench.scenario.names import is_name

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "inventory"


@pytest.fixture(params=["hosts.yml", "hosts.ini"])
def inv(request):
    return load(FIXTURES / request.param)


def test_hosts_with_connection_variables(inv):
    assert list(inv.hosts) == ["server-a", "client-1", "client-2"]  # the range client-[1:2] expanded, in order
    a = inv.hosts["server-a"]
    assert (a.address, a.user, a.port, a.private_key_file) == ("198.18.0.10", "bench", 2222, None)
    c = inv.hosts["client-2"]
    # No ansible_host: the name is the address; ansible_user from group_vars/clients.yml.
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


# ------------------------------------------------------------------ reading an inventory runs no code (issue 33)
#
# Each attack plants code that would write a marker file, as root, in a "victim" directory: the marker must not
# appear and nothing under the victim directory may change. Ansible reads its settings when it is first
# imported, so each attack on the settings runs in a fresh interpreter, as `vnetbench` itself would.

SRC = Path(vnetbench.__file__).resolve().parents[1]  # the code under test, in the child too
# A vars plugin, an inventory plugin named like the built-in one, and a lookup: each writes the marker when
# Ansible imports it.
PLUGIN = ("import pathlib\npathlib.Path({marker!r}).write_text('ran')\n"
          "from ansible.plugins.vars import BaseVarsPlugin\n"
          "class VarsModule(BaseVarsPlugin):\n    def get_vars(self, loader, path, entities, cache=True):\n"
          "        return {{'ansible_user': 'planted'}}\n")
INVENTORY_PLUGIN = ("import pathlib\npathlib.Path({marker!r}).write_text('ran')\n"
                    "from ansible.plugins.inventory import BaseInventoryPlugin\n"
                    "class InventoryModule(BaseInventoryPlugin):\n    NAME = 'yaml'\n"
                    "    def verify_file(self, path):\n        return True\n"
                    "    def parse(self, inventory, loader, path, cache=True):\n        inventory.add_host('planted')\n")


def _load_in_a_fresh_process(inventory: Path, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    code = ("import json, sys; from vnetbench.hosts.inventory import load; inv = load(sys.argv[1]); "
            "print(json.dumps({n: [h.address, h.user] for n, h in inv.hosts.items()}))")
    base = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    return subprocess.run([sys.executable, "-c", code, str(inventory)], capture_output=True, text=True, cwd=cwd,
                          timeout=120, env={**base, "PYTHONPATH": str(SRC), **(env or {})})


def _victim(tmp_path: Path) -> tuple[Path, Path]:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep me\n")
    return victim, victim / "marker"


def _plain_inventory(tmp_path: Path) -> Path:
    inv = tmp_path / "inv" / "hosts.yml"
    inv.parent.mkdir()
    inv.write_text("all:\n  hosts:\n    box:\n      ansible_host: 198.18.0.1\n      ansible_user: bench\n")
    return inv


def _attack_cwd_config(tmp_path, marker):
    """An ansible.cfg in the working directory (a cloned scenario repository) that names a vars plugin."""
    (tmp_path / "work" / "plugins").mkdir(parents=True)
    (tmp_path / "work" / "plugins" / "evil.py").write_text(PLUGIN.format(marker=str(marker)))
    (tmp_path / "work" / "ansible.cfg").write_text("[defaults]\nvars_plugins = ./plugins\n")
    return tmp_path / "work", {}


def _attack_env_config(tmp_path, marker):
    """$ANSIBLE_CONFIG, inherited, naming a vars plugin and enabling the script inventory."""
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "evil.py").write_text(PLUGIN.format(marker=str(marker)))
    cfg = tmp_path / "cfg" / "ansible.cfg"
    cfg.write_text(f"[defaults]\nvars_plugins = {tmp_path / 'cfg'}\n[inventory]\nenable_plugins = script, yaml\n")
    return tmp_path, {"ANSIBLE_CONFIG": str(cfg)}


def _attack_home_config(tmp_path, marker):
    """~/.ansible.cfg and ~/.ansible/plugins/vars/ of the user vnetbench runs as."""
    vars_dir = tmp_path / "home" / ".ansible" / "plugins" / "vars"
    vars_dir.mkdir(parents=True)
    (vars_dir / "evil.py").write_text(PLUGIN.format(marker=str(marker)))
    (tmp_path / "home" / ".ansible.cfg").write_text(f"[defaults]\nvars_plugins = {vars_dir}\n")
    return tmp_path, {"HOME": str(tmp_path / "home")}


def _attack_env_plugin_paths(tmp_path, marker):
    """Inherited ANSIBLE_* settings: plugin paths with a vars plugin and an inventory plugin named "yaml", vars
    plugins run while parsing, and a log file Ansible would write."""
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "evil.py").write_text(PLUGIN.format(marker=str(marker)))
    (tmp_path / "p" / "yaml.py").write_text(INVENTORY_PLUGIN.format(marker=str(marker)))
    return tmp_path, {"ANSIBLE_VARS_PLUGINS": str(tmp_path / "p"), "ANSIBLE_INVENTORY_PLUGINS": str(tmp_path / "p"),
                      "ANSIBLE_RUN_VARS_PLUGINS": "start", "ANSIBLE_VARS_ENABLED": "evil,host_group_vars",
                      "ANSIBLE_INVENTORY_ENABLED": "yaml,ini",
                      "ANSIBLE_LOG_PATH": str(marker.parent / "ansible.log")}


def _attack_plugins_beside_inventory(tmp_path, marker):
    """vars_plugins/ and inventory_plugins/ beside the inventory, where Ansible looks beside a playbook."""
    for sub, text in (("vars_plugins", PLUGIN), ("inventory_plugins", INVENTORY_PLUGIN)):
        (tmp_path / "inv" / sub).mkdir()
        (tmp_path / "inv" / sub / "evil.py").write_text(text.format(marker=str(marker)))
    return tmp_path / "inv", {}


@pytest.mark.parametrize("attack", [_attack_cwd_config, _attack_env_config, _attack_home_config,
                                    _attack_env_plugin_paths, _attack_plugins_beside_inventory])
def test_no_configuration_or_plugin_from_outside_is_loaded(tmp_path, attack):
    victim, marker = _victim(tmp_path)
    inventory = _plain_inventory(tmp_path)
    cwd, env = attack(tmp_path, marker)
    before = tree_state(victim)
    proc = _load_in_a_fresh_process(inventory, cwd, env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == {"box": ["198.18.0.1", "bench"]}  # nothing planted, nothing added
    assert tree_state(victim) == before and not marker.exists()


def test_an_inherited_script_setting_does_not_run_an_executable_inventory(tmp_path):
    victim, marker = _victim(tmp_path)
    inventory = tmp_path / "inv.sh"
    inventory.write_text(f"#!/bin/sh\necho ran > {marker}\necho '{{\"all\": {{\"hosts\": [\"box\"]}}}}'\n")
    inventory.chmod(0o755)
    before = tree_state(victim)
    proc = _load_in_a_fresh_process(inventory, tmp_path, {"ANSIBLE_INVENTORY_ENABLED": "script",
                                                         "ANSIBLE_INVENTORY_UNPARSED_FAILED": "false"})
    assert proc.returncode == 1 and "InventoryError" in proc.stderr and "not a valid Ansible INI inventory" in proc.stderr
    assert tree_state(victim) == before and not marker.exists()


def test_a_lookup_in_a_connection_variable_runs_nothing_and_is_refused(tmp_path):
    victim, marker = _victim(tmp_path)
    inventory = tmp_path / "inv.yml"
    inventory.write_text("all:\n  hosts:\n    box:\n"
                         f"      ansible_host: \"{{{{ lookup('pipe', 'touch {marker}; echo 198.18.0.1') }}}}\"\n")
    before = tree_state(victim)
    with pytest.raises(InventoryError) as e:
        load(inventory)
    assert tree_state(victim) == before and not marker.exists()
    msg = str(e.value)
    # where it is written (file, line, column), the host, the key, the value and what to do
    assert msg.startswith(f"{inventory}:4:") and "host box: ansible_host = " in msg and "lookup('pipe'" in msg
    assert "is a Jinja template" in msg and "write the value itself" in msg and "\n" not in msg


@pytest.mark.parametrize("key, text", [
    ("ansible_user", "{{ lookup('pipe', 'touch MARKER') }}"),
    ("ansible_port", "{% if lookup('pipe', 'touch MARKER') %}22{% endif %}"),
    ("ansible_ssh_private_key_file", "{# MARKER #}~/.ssh/id"),
    ("vnetbench_shape_interfaces", "{{ lookup('pipe', 'touch MARKER') }}"),
])
def test_every_value_vnetbench_uses_is_data_in_group_vars_too(tmp_path, key, text):
    victim, marker = _victim(tmp_path)
    inventory = tmp_path / "inv.yml"
    inventory.write_text("all:\n  children:\n    lab:\n      hosts:\n        box:\n")
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "lab.yml").write_text(f"{key}: \"{text.replace('MARKER', str(marker))}\"\n")
    with pytest.raises(InventoryError, match=rf"group_vars/lab\.yml:1:\d+: host box: {key} = .* is a Jinja template"):
        load(inventory)
    assert not marker.exists() and [p.name for p in victim.iterdir()] == ["precious"]


def test_other_variables_are_kept_as_written_and_never_templated(tmp_path):
    victim, marker = _victim(tmp_path)
    inventory = tmp_path / "inv.ini"
    inventory.write_text(f"box ansible_host=198.18.0.1 motd=\"{{{{ lookup('pipe', 'touch {marker}') }}}}\"\n")
    inv = load(inventory)
    assert inv.hosts["box"].vars["motd"] == f"{{{{ lookup('pipe', 'touch {marker}') }}}}"
    assert not marker.exists()


def test_group_vars_in_the_working_directory_are_not_read(tmp_path, monkeypatch):
    # Ansible reads group_vars/ beside the "playbook", the working directory when there is none.
    (tmp_path / "work" / "group_vars").mkdir(parents=True)
    (tmp_path / "work" / "group_vars" / "all.yml").write_text("ansible_port: 2222\nplanted: true\n")
    monkeypatch.chdir(tmp_path / "work")
    box = load(_plain_inventory(tmp_path)).hosts["box"]
    assert box.port is None and "planted" not in box.vars


def test_the_environment_is_given_back(tmp_path, monkeypatch):
    monkeypatch.setenv("ANSIBLE_INVENTORY_ENABLED", "script")
    monkeypatch.setenv("ANSIBLE_NOCOWS", "1")
    load(_plain_inventory(tmp_path))
    assert os.environ["ANSIBLE_INVENTORY_ENABLED"] == "script" and os.environ["ANSIBLE_NOCOWS"] == "1"
    assert "ANSIBLE_CONFIG" not in os.environ


def test_every_code_path_setting_of_ansible_is_pinned():
    """The pinned list is written by hand: every Ansible setting that says where code is loaded from (a
    `pathspec` in ansible-core's base.yml) must be in it, pointing at vnetbench's directory without plugins."""
    import ansible
    import yaml

    from vnetbench.hosts import inventory

    settings = yaml.safe_load((Path(ansible.__file__).parent / "config" / "base.yml").read_text())
    code_paths = {env["name"] for s in settings.values() if s.get("type") == "pathspec" for env in s.get("env", [])}
    assert code_paths == set(inventory._CODE_PATHS)
    assert [p.name for p in inventory.ANSIBLE_DIR.iterdir()] == ["ansible.cfg"]
    assert all(line.startswith("#") for line in inventory.ANSIBLE_CONFIG.read_text().splitlines())


# ------------------------------------------------------------------ names are names (issue 33)


@pytest.mark.parametrize("text, needle", [
    ("all:\n  hosts:\n    ../../victim/x: {ansible_host: 198.18.0.1}\n", "host '../../victim/x' is not a name"),
    ("all:\n  hosts:\n    \"a b\": {}\n", "host 'a b' is not a name"),
    ("all:\n  hosts:\n    \"2001:db8::1\": {}\n", "give a host's address as its ansible_host"),
    ("all:\n  children:\n    \"../g\":\n      hosts: {box: {}}\n", "group '../g' is not a name"),
])
def test_host_and_group_names_follow_the_name_rule(tmp_path, text, needle):
    inventory = tmp_path / "inv.yml"
    inventory.write_text(text)
    with pytest.raises(InventoryError) as e:
        load(inventory)
    assert str(e.value).startswith(f"{inventory}: ") and needle in str(e.value) and "rename it, e.g." in str(e.value)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=hostile_names())
def test_any_host_name_an_inventory_gives_is_refused_or_a_plain_name(tmp_path, name):
    """Whatever the host is called, what comes out of the loader is a name that stays in its directory."""
    inventory = tmp_path / "inv.json.yml"
    inventory.write_text(json.dumps({"all": {"hosts": {name: {"ansible_host": "198.18.0.1"}}}}))
    try:
        hosts = load(inventory).hosts
    except InventoryError as e:
        assert "\n" not in str(e) and str(inventory) in str(e)
        return
    for host in hosts:
        assert is_name(host)
        assert (tmp_path / host).resolve().parent == tmp_path.resolve() and host not in (".", "..")
