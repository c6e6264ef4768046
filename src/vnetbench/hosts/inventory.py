"""Hosts from an Ansible inventory (YAML or INI), read by ansible-core's own inventory code, as data only.

Users already keep their machines in Ansible inventories; reading them with Ansible's InventoryManager,
DataLoader and VariableManager means ranges (``client-[1:2]``), children, ``group_vars/`` and
``host_vars/`` beside the file and variable precedence all mean exactly what they mean to Ansible.
What leaves this module is plain dataclasses: the rest of vnetbench never sees an Ansible object.

vnetbench runs as root, and an inventory may be someone else's: reading one runs no code. Ansible would
otherwise run an executable inventory (its ``script`` plugin), load plugins named by an ``ansible.cfg`` in the
working directory, in ``$ANSIBLE_CONFIG`` or in a home directory, or found on its plugin paths, and run
commands from Jinja in a value (``{{ lookup('pipe', ...) }}``). So every setting that decides what Ansible
loads is vnetbench's while it reads (:func:`_pinned`): its own empty configuration file, plugin paths that
hold no plugin, only the ``ansible.builtin.yaml`` and ``ansible.builtin.ini`` inventory plugins and the
``ansible.builtin.host_group_vars`` vars plugin (which reads ``group_vars/`` and ``host_vars/`` YAML beside
the inventory), every inherited ``ANSIBLE_*`` variable set aside; and nothing is templated: a value
vnetbench uses that holds Jinja is refused (:func:`_data`), the rest is kept as written.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from vnetbench import units
from vnetbench.errors import ScenarioError
from vnetbench.scenario.names import name_problem

#: vnetbench's own Ansible configuration file (empty) and the directory every plugin path points at (it holds
#: no plugin, only that file).
ANSIBLE_DIR = Path(__file__).resolve().parent / "ansible"
ANSIBLE_CONFIG = ANSIBLE_DIR / "ansible.cfg"

# Every Ansible setting that says where code comes from: plugins of each kind, modules, module utils, roles
# and collections (the `pathspec` settings of ansible/config/base.yml; a unit test checks this list against it).
_CODE_PATHS = (
    "ANSIBLE_ACTION_PLUGINS", "ANSIBLE_BECOME_PLUGINS", "ANSIBLE_CACHE_PLUGINS", "ANSIBLE_CALLBACK_PLUGINS",
    "ANSIBLE_CLICONF_PLUGINS", "ANSIBLE_COLLECTIONS_PATH", "ANSIBLE_CONNECTION_PLUGINS",
    "ANSIBLE_DOC_FRAGMENT_PLUGINS", "ANSIBLE_FILTER_PLUGINS", "ANSIBLE_HTTPAPI_PLUGINS", "ANSIBLE_INVENTORY_PLUGINS",
    "ANSIBLE_LIBRARY", "ANSIBLE_LOOKUP_PLUGINS", "ANSIBLE_MODULE_UTILS", "ANSIBLE_NETCONF_PLUGINS",
    "ANSIBLE_ROLES_PATH", "ANSIBLE_STRATEGY_PLUGINS", "ANSIBLE_TERMINAL_PLUGINS", "ANSIBLE_TEST_PLUGINS",
    "ANSIBLE_VARS_PLUGINS",
)
INVENTORY_PLUGINS = ("ansible.builtin.yaml", "ansible.builtin.ini")
VARS_PLUGINS = ("ansible.builtin.host_group_vars",)


def _ansible_env() -> dict[str, str]:
    """Ansible's settings while vnetbench reads an inventory. Ansible reads most of them once, when its constants
    module is first imported (every import of ansible here is inside :func:`_pinned`), and plugin options when a
    plugin loads (also inside)."""
    return {
        "ANSIBLE_CONFIG": str(ANSIBLE_CONFIG),
        **{key: str(ANSIBLE_DIR) for key in _CODE_PATHS},
        "ANSIBLE_COLLECTIONS_SCAN_SYS_PATH": "false",  # no ansible_collections package found on sys.path either
        # Fully qualified: a short name ("yaml") would be looked up on the plugin paths before the built-in one.
        "ANSIBLE_INVENTORY_ENABLED": ",".join(INVENTORY_PLUGINS),
        "ANSIBLE_VARS_ENABLED": ",".join(VARS_PLUGINS),
        # Vars plugins run when variables are asked for, after vnetbench has checked the host and group names
        # (host_group_vars makes file names of them), not while the file is parsed.
        "ANSIBLE_RUN_VARS_PLUGINS": "demand",
        "ANSIBLE_CACHE_PLUGIN": "ansible.builtin.memory",  # the fact cache VariableManager opens
        "ANSIBLE_INVENTORY_UNPARSED_FAILED": "true",
        "ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED": "true",
        # Ansible otherwise creates ~/.ansible/tmp on import; reading an inventory must not write to $HOME.
        "ANSIBLE_LOCAL_TEMP": tempfile.gettempdir(),
    }


# What the pinned settings must read as once Ansible is imported (it reads them at its first import: one made
# before vnetbench's, by other code in the same process, would have read others).
_PINNED_CONSTANTS = {
    "CONFIG_FILE": lambda: str(ANSIBLE_CONFIG),
    "INVENTORY_ENABLED": lambda: list(INVENTORY_PLUGINS),
    "VARIABLE_PLUGINS_ENABLED": lambda: list(VARS_PLUGINS),
    "RUN_VARS_PLUGINS": lambda: "demand",
    "DEFAULT_VARS_PLUGIN_PATH": lambda: [str(ANSIBLE_DIR)],
    "DEFAULT_INVENTORY_PLUGIN_PATH": lambda: [str(ANSIBLE_DIR)],
    "COLLECTIONS_PATHS": lambda: [str(ANSIBLE_DIR)],
    "COLLECTIONS_SCAN_SYS_PATH": lambda: False,
}


@contextlib.contextmanager
def _pinned() -> Iterator[None]:
    """The environment Ansible sees while vnetbench reads an inventory: vnetbench's settings, and no other
    ``ANSIBLE_*`` variable (an inherited ANSIBLE_INVENTORY_ENABLED=script would run an executable inventory,
    ANSIBLE_VAULT_PASSWORD_FILE a script, ANSIBLE_LOG_PATH write a file as root). The user's variables are put
    back afterwards: nothing else in vnetbench reads them, and the processes it starts get the environment it got."""
    saved = {key: value for key, value in os.environ.items() if key.startswith("ANSIBLE_")}
    for key in saved:
        del os.environ[key]
    os.environ.update(_ansible_env())
    try:
        from ansible import constants

        wrong = [name for name, wanted in _PINNED_CONSTANTS.items() if getattr(constants, name, None) != wanted()]
        if wrong:
            raise InventoryError(
                f"Ansible was loaded with settings other than vnetbench's ({', '.join(wrong)}): something imported "
                "it before vnetbench read the inventory, so vnetbench cannot vouch that reading it runs no code; "
                "report this as a bug in vnetbench")
        yield
    finally:
        for key in [key for key in os.environ if key.startswith("ANSIBLE_")]:
            del os.environ[key]
        os.environ.update(saved)


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


# Jinja's markers: a value holding one would be a template to Ansible.
_JINJA = ("{{", "{%", "{#")


def _origin(value: Any, path: Path) -> str:
    """Where a value was written, as Ansible 2.19 tagged it when it read the file ("group_vars/x.yml:2:15"),
    else the inventory."""
    try:
        from ansible._internal._datatag._tags import Origin  # private, hence the fallback; ansible-core is pinned

        origin = Origin.get_tag(value)
    except (ImportError, AttributeError):
        origin = None
    return str(origin) if origin is not None and origin.path else str(path)


def _data(path: Path, host: str, key: str, value: Any) -> Any:
    """A value vnetbench uses, as plain data: never templated. One that holds Jinja is refused rather than
    read literally (a user name "{{ user }}" would only fail later, at ssh, further from the cause); one
    Ansible Vault encrypted is refused too (vnetbench holds no vault password, and asks for none)."""
    if any(isinstance(text, str) and any(mark in text for mark in _JINJA)
           for text in (value if isinstance(value, (list, tuple)) else [value])):
        raise InventoryError(
            f"{_origin(value, path)}: host {host}: {key} = {units.brief(_plain(value))} is a Jinja template; "
            "vnetbench reads inventories as data and templates nothing (a template can run commands, as root): "
            "write the value itself")
    plain = _plain(value)
    if plain is not None and not isinstance(plain, (str, int, float, bool, list, dict)):
        raise InventoryError(f"{_origin(value, path)}: host {host}: {key} is not plain data but "
                             f"{type(value).__name__} (an Ansible Vault value); vnetbench asks for no vault "
                             "password: write the value itself")
    return plain


def _check_names(path: Path, manager: Any) -> None:
    """Every host and group name follows the one rule of names (scenario/names.py), before anything makes a
    file name of one (Ansible's host_group_vars reads group_vars/NAME, vnetbench's runs write files for hosts)."""
    for kind, names in (("host", list(manager.hosts)), ("group", list(manager.groups))):
        for name in names:
            problem = name_problem(name, kind)
            if problem:
                hint = " (give a host's address as its ansible_host)" if kind == "host" else ""
                raise InventoryError(f"{path}: {problem}{hint}")


def load(path: str | Path) -> Inventory:
    path = Path(path)
    if not path.is_file():
        raise InventoryError(f"{path}: no such inventory file; give the path of an Ansible inventory (YAML or INI)")
    if not os.access(path, os.R_OK):
        raise InventoryError(f"{path}: cannot be read; check its permissions")
    with _pinned():
        return _load(path)


def _load(path: Path) -> Inventory:
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.plugins.loader import init_plugin_loader
    from ansible.utils.collection_loader import AnsibleCollectionConfig
    from ansible.vars.manager import VariableManager

    if not AnsibleCollectionConfig.collection_finder:
        # What Ansible's own commands do first: "ansible.builtin.yaml" is found through the collection finder
        # (on the pinned, empty collection path, and not on sys.path).
        init_plugin_loader()
    loader = DataLoader()
    # Ansible also reads group_vars/ and host_vars/ beside the "playbook", the loader's base directory, which is
    # the working directory by default: here it is the inventory's own directory, read once already.
    loader.set_basedir(str(path.resolve().parent))
    # Which plugin's complaint to quote: the one the file's name says it is written for.
    plugin = "yaml" if path.suffix in (".yml", ".yaml") else "ini"
    with _collected_parse_failures() as failures:
        try:
            manager = InventoryManager(loader=loader, sources=[str(path)])
        except AnsibleError as e:
            why = next((f for msg, f in failures.items() if f"'{plugin}'" in msg or f".{plugin}'" in msg), None) \
                or next(iter(failures.values()), e)
            cause = _first_line(why.__cause__ or why) + _yaml_position(path, plugin)
            raise InventoryError(f"{path}: not a valid Ansible {plugin.upper()} inventory: {cause}; "
                                 f"`ansible-inventory -i {shlex.quote(str(path))} --list` shows the same in detail") from e
    _check_names(path, manager)
    variables = VariableManager(loader=loader, inventory=manager)

    hosts: dict[str, InventoryHost] = {}
    for h in manager.get_hosts():
        try:
            raw = variables.get_vars(host=h, include_hostvars=False)
        except AnsibleError as e:  # a group_vars file that is not YAML, ...
            raise InventoryError(f"{path}: host {h.name}: its variables cannot be read: {_first_line(e)}") from e
        conn = {key: _data(path, h.name, key, raw[key]) for key in CONNECTION_VARS if key in raw}
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
        shape = _shape_interfaces(path, h.name, _data(path, h.name, SHAPE_VAR, raw.get(SHAPE_VAR)))
        hosts[h.name] = InventoryHost(
            name=h.name,
            address=str(conn.get("ansible_host") or h.name),
            user=str(conn["ansible_user"]) if conn.get("ansible_user") else None,
            port=port,
            private_key_file=os.path.expanduser(str(key_file)) if key_file else None,
            groups=tuple(g.name for g in h.get_groups() if g.name != "all"),
            # The host's other variables, kept as written: vnetbench uses none of them, and templates none.
            vars={**{k: _plain(v) for k, v in raw.items() if k not in _MAGIC}, **conn},
            shape_interfaces=shape,
        )
    groups = {name: tuple(h.name for h in g.get_hosts()) for name, g in manager.groups.items()}
    _drop_ansible_local_temp()
    return Inventory(path=path, hosts=hosts, groups=groups)
