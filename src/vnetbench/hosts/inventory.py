"""Hosts from an Ansible inventory (YAML or INI), read by ansible-core's own inventory code.

Users already keep their machines in Ansible inventories; reading them with Ansible's InventoryManager,
DataLoader and VariableManager means ranges (``client-[1:2]``), children, ``group_vars/`` and
``host_vars/`` beside the file and variable precedence all mean exactly what they mean to Ansible.
What leaves this module is plain dataclasses: the rest of vnetbench never sees an Ansible object.

Only the ``yaml`` and ``ini`` inventory plugins are enabled: the ``script`` plugin would execute an
executable inventory file, and vnetbench runs as root.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from vnetbench.errors import ScenarioError

# Ansible reads its configuration from the environment once, when its constants module is imported:
# these must be in place before the first `import ansible...` below (all imports of ansible are lazy).
_ANSIBLE_ENV = {
    "ANSIBLE_INVENTORY_ENABLED": "yaml,ini",
    "ANSIBLE_INVENTORY_UNPARSED_FAILED": "true",
    "ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED": "true",
    # Ansible otherwise creates ~/.ansible/tmp on import; reading an inventory must not write to $HOME.
    "ANSIBLE_LOCAL_TEMP": tempfile.gettempdir(),
}

# Variables VariableManager adds on its own (magic and play variables): not the inventory's.
_MAGIC = frozenset({
    "ansible_config_file", "ansible_facts", "ansible_playbook_python", "ansible_version", "group_names", "groups",
    "inventory_dir", "inventory_file", "inventory_hostname", "inventory_hostname_short", "playbook_dir", "omit",
    "ansible_check_mode", "ansible_diff_mode", "ansible_forks", "ansible_inventory_sources", "ansible_skip_tags",
    "ansible_run_tags", "ansible_verbosity", "hostvars", "role_names", "play_hosts", "ansible_play_hosts",
    "ansible_play_hosts_all", "ansible_play_batch", "ansible_play_name", "ansible_dependent_role_names",
    "ansible_play_role_names", "ansible_role_names",
})

CONNECTION_VARS = ("ansible_host", "ansible_user", "ansible_port", "ansible_ssh_private_key_file")

#: The host variable that lets vnetbench change a host's interfaces (link conditions, hosts/shaping.py):
#: the interfaces it may add its steering to. Without it nothing on a host's interfaces is changed. It lives
#: in the inventory, the user's own file, not in the scenario: a scenario from someone else cannot opt in.
SHAPE_VAR = "vnetbench_shape_interfaces"
# A Linux interface name: 1-15 bytes, no "/", ":" or white space (dev_valid_name), nor "." or "..".
IFNAME = re.compile(r"^(?!\.{1,2}$)[^/:\s]{1,15}$")


class InventoryError(ScenarioError):
    """An inventory that cannot be used as written: the message names the file, the key and what to do."""


@dataclass(frozen=True)
class InventoryHost:
    """One machine, as the inventory describes it."""

    name: str
    address: str  # ansible_host, else the name
    user: str | None = None  # ansible_user; None: ssh decides (~/.ssh/config, then the local user)
    port: int | None = None  # ansible_port; None: ssh decides
    private_key_file: str | None = None  # ansible_ssh_private_key_file, with ~ expanded
    groups: tuple[str, ...] = ()
    vars: dict[str, Any] = field(default_factory=dict, compare=False)
    shape_interfaces: tuple[str, ...] = ()  # SHAPE_VAR: the interfaces vnetbench may put link conditions on


@dataclass
class Inventory:
    path: Path
    hosts: dict[str, InventoryHost]  # in inventory order
    groups: dict[str, tuple[str, ...]]  # group name -> its hosts (children's included), in inventory order

    def resolve(self, ref: str | list[str]) -> list[InventoryHost]:
        """The hosts an endpoint reference names: a host name, a group name, or a list of them (in order,
        each host once)."""
        refs = [ref] if isinstance(ref, str) else list(ref)
        found: dict[str, InventoryHost] = {}
        for r in refs:
            if r in self.hosts:
                found.setdefault(r, self.hosts[r])
            elif r in self.groups:
                for name in self.groups[r]:
                    found.setdefault(name, self.hosts[name])
            else:
                raise InventoryError(
                    f"{self.path}: no host or group named {r!r}; hosts: {', '.join(self.hosts) or '(none)'}; "
                    f"groups: {', '.join(g for g in self.groups if g not in ('all', 'ungrouped')) or '(none)'}")
        return list(found.values())


def _plain(value: Any) -> Any:
    """Ansible 2.19 tags every value with its origin (``_AnsibleTaggedStr``...): back to builtins."""
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


@contextlib.contextmanager
def _collected_parse_failures() -> Iterator[dict[str, BaseException]]:
    """Ansible prints each plugin's parse failure as a multi-line warning and then raises a generic
    "Completely failed to parse"; keep the failures instead, to say in one line what is wrong."""
    from ansible.utils.display import Display

    display = Display()
    failures: dict[str, BaseException] = {}  # "Failed to parse inventory with 'yaml' plugin." -> why

    def collect(msg: str | None, exception: BaseException, **_: Any) -> None:
        failures[str(msg)] = exception

    display.error_as_warning = collect  # type: ignore[method-assign]
    try:
        yield failures
    finally:
        del display.error_as_warning  # back to the class's method


def _first_line(exc: BaseException) -> str:
    message = getattr(exc, "message", None) or str(exc)
    return " ".join(str(message).split("\n\n")[0].split())


def _yaml_position(path: Path, plugin: str) -> str:
    """Where in a YAML file its syntax breaks: Ansible 2.19's yaml plugin reports the error without it."""
    if plugin != "yaml":
        return ""
    import yaml

    try:
        yaml.safe_load(path.read_text())
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        return f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
    except (yaml.YAMLError, OSError, UnicodeDecodeError):
        pass
    return ""


def _drop_ansible_local_temp() -> None:
    """Ansible makes a local temp directory (ansible-local-PID...) on first use and removes it at exit; a
    vnetbench killed with SIGKILL (a run is long) would leave it. Reading the inventory is all vnetbench asks
    of Ansible, so it goes now (Ansible's own clean-up at exit then finds nothing)."""
    import shutil

    from ansible import constants

    local = getattr(constants, "DEFAULT_LOCAL_TMP", None)
    if local and Path(local).name.startswith("ansible-local-"):
        shutil.rmtree(local, ignore_errors=True)


def _shape_interfaces(path: Path, host: str, value: Any) -> tuple[str, ...]:
    """SHAPE_VAR as a tuple of interface names: a YAML list, or one name or a comma-separated string (INI)."""
    if value is None or value == "" or value == []:
        return ()
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise InventoryError(f"{path}: host {host}: {SHAPE_VAR} = {value!r}: give a list of interface names, "
                             f"e.g. {SHAPE_VAR}: [eth1]")
    names = tuple(dict.fromkeys(i.strip() for i in items))
    bad = [n for n in names if not IFNAME.match(n)]
    if bad:
        raise InventoryError(f"{path}: host {host}: {SHAPE_VAR} names {', '.join(map(repr, bad))}, which is no "
                             "interface name (1-15 characters, no '/', ':' or spaces)")
    return names


def load(path: str | Path) -> Inventory:
    path = Path(path)
    if not path.is_file():
        raise InventoryError(f"{path}: no such inventory file; give the path of an Ansible inventory (YAML or INI)")
    if not os.access(path, os.R_OK):
        raise InventoryError(f"{path}: cannot be read; check its permissions")
    for key, value in _ANSIBLE_ENV.items():
        os.environ.setdefault(key, value)
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar
    from ansible.vars.manager import VariableManager

    loader = DataLoader()
    # Which plugin's complaint to quote: the one the file's name says it is written for.
    plugin = "yaml" if path.suffix in (".yml", ".yaml") else "ini"
    with _collected_parse_failures() as failures:
        try:
            manager = InventoryManager(loader=loader, sources=[str(path)])
        except AnsibleError as e:
            why = next((f for msg, f in failures.items() if f"'{plugin}'" in msg), None) \
                or next(iter(failures.values()), e)
            cause = _first_line(why.__cause__ or why) + _yaml_position(path, plugin)
            raise InventoryError(f"{path}: not a valid Ansible {plugin.upper()} inventory: {cause}; "
                                 f"`ansible-inventory -i {path} --list` shows the same in detail") from e
    variables = VariableManager(loader=loader, inventory=manager)

    hosts: dict[str, InventoryHost] = {}
    for h in manager.get_hosts():
        raw = variables.get_vars(host=h, include_hostvars=False)
        templar = Templar(loader=loader, variables=raw)
        conn: dict[str, Any] = {}
        for key in CONNECTION_VARS:
            if key not in raw:
                continue
            try:
                # Connection variables may be Jinja ("{{ ... }}"), as Ansible allows; templated as Ansible would.
                conn[key] = _plain(templar.template(raw[key]))
            except AnsibleError as e:
                raise InventoryError(f"{path}: host {h.name}: {key} = {_plain(raw[key])!r} cannot be templated: "
                                     f"{_first_line(e)}") from e
        port = conn.get("ansible_port")
        if port is not None:
            try:
                port = int(port)
                if not 0 < port < 65536:
                    raise ValueError
            except (TypeError, ValueError):
                raise InventoryError(f"{path}: host {h.name}: ansible_port = {port!r} is not a TCP port; "
                                     f"give a number from 1 to 65535") from None
        key_file = conn.get("ansible_ssh_private_key_file")
        shape = _shape_interfaces(path, h.name, _plain(raw.get(SHAPE_VAR)))
        hosts[h.name] = InventoryHost(
            name=h.name,
            address=str(conn.get("ansible_host") or h.name),
            user=str(conn["ansible_user"]) if conn.get("ansible_user") else None,
            port=port,
            private_key_file=os.path.expanduser(str(key_file)) if key_file else None,
            groups=tuple(g.name for g in h.get_groups() if g.name != "all"),
            vars={**{k: _plain(v) for k, v in raw.items() if k not in _MAGIC}, **conn},
            shape_interfaces=shape,
        )
    groups = {name: tuple(h.name for h in g.get_hosts()) for name, g in manager.groups.items()}
    _drop_ansible_local_temp()
    return Inventory(path=path, hosts=hosts, groups=groups)
