"""Offloads (TSO, GSO, GRO, checksum) of lab interfaces, set and read back with ethtool.

Set inside the interface's namespace (``ip netns exec NS ethtool -K ...``).
A device may refuse a feature (a bridge derives its features from its ports,
some are ``[fixed]``): the read-back is what gets recorded, never the request.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

from vnetbench.errors import LabError
from vnetbench.lab.nodes import Interface

# ethtool -K short names -> the names `ethtool -k` reports them under.
FEATURES = {
    "tso": "tcp-segmentation-offload",
    "gso": "generic-segmentation-offload",
    "gro": "generic-receive-offload",
    "tx": "tx-checksumming",
    "rx": "rx-checksumming",
}


def _ethtool(ns: str, args: list[str], timeout: float = 10) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["ip", "netns", "exec", ns, "ethtool", *args], capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise LabError("ethtool is missing: apt-get install ethtool") from None


def set_features(iface: Interface, wanted: dict[str, bool]) -> None:
    """Set features by short name (one ethtool call; features a device cannot change are left as they are)."""
    _ethtool(iface.ns.name, ["-K", iface.name, *ethtool_args(wanted)])


def read_offload(iface: Interface) -> dict[str, Any]:
    """{"netns", "dev", feature: bool, ...} as the kernel reports them."""
    out = _ethtool(iface.ns.name, ["--json", "-k", iface.name])
    return {"netns": iface.ns.name, "dev": iface.name, **parse_features(out.stdout)}


def changeable_features(iface: Interface, names: tuple[str, ...]) -> dict[str, bool]:
    """{ethtool feature name: active} of those among `names` that the device has and can change."""
    out = _ethtool(iface.ns.name, ["--json", "-k", iface.name])
    try:
        doc = json.loads(out.stdout)[0]
    except (json.JSONDecodeError, IndexError, KeyError, TypeError):
        raise LabError(f"ethtool --json -k {iface.name} in {iface.ns.name} printed no features: "
                       f"{(out.stderr or out.stdout).strip()[:200]}") from None
    return {n: bool(doc[n]["active"]) for n in names if isinstance(doc.get(n), dict) and not doc[n].get("fixed")}


def parse_features(text: str) -> dict[str, bool]:
    """{short name: active} from `ethtool --json -k DEV`, or from an older ethtool's "feature: on [fixed]"."""
    entry: dict[str, bool] = {}
    try:
        doc = json.loads(text)[0]
        for short, long in FEATURES.items():
            if long in doc:
                entry[short] = bool(doc[long]["active"])
        return entry
    except (json.JSONDecodeError, IndexError, KeyError, TypeError):
        pass
    for line in text.splitlines():
        name, _, value = line.partition(":")
        for short, long in FEATURES.items():
            if name.strip() == long:
                entry[short] = value.strip().startswith("on")
    return entry


def ethtool_args(wanted: dict[str, bool]) -> list[str]:
    """`ethtool -K DEV` arguments for the features `wanted` (short name -> on)."""
    return [a for flag, on in wanted.items() for a in (flag, "on" if on else "off")]


class OffloadControl:
    """Offload of a set of interfaces: "on" is each device's own default (what a deployed
    system runs with: e.g. a veth has TSO/GSO and checksum offload on, GRO off), "off" turns
    TSO, GSO, GRO and tx/rx checksum offload off. The defaults are read before the first
    change, so switching back restores exactly them."""

    def __init__(self, interfaces: list[Interface]):
        self.interfaces = interfaces
        self.defaults: list[dict[str, Any]] | None = None

    def set(self, on: bool) -> list[dict[str, Any]]:
        if self.defaults is None:
            self.defaults = [read_offload(i) for i in self.interfaces]
        for iface, default in zip(self.interfaces, self.defaults):
            wanted = {f: bool(default.get(f)) if on else False for f in FEATURES if f in default}
            set_features(iface, wanted)
        return self.read()

    def read(self) -> list[dict[str, Any]]:
        return [read_offload(i) for i in self.interfaces]
