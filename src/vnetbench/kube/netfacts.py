"""What a pod's and a node's network devices are: their MTUs and the tunnels that encapsulate pod traffic.

A wrong MTU is a common cause of bad numbers on a cluster (a pod network at 1500 over a VXLAN that leaves
1450 fragments or black-holes large packets; a jumbo fabric the pods never use), and the encapsulation is
what a CNI costs. Both are read where they are, with iproute2's ``ip -d -j link show``: in each of the run's
pods (its own interfaces), and in a pod on each node's own network (``hostNetwork``: the node's devices,
among them the CNI's tunnel, e.g. flannel's ``flannel.1``, Calico's ``vxlan.calico``, Cilium's
``cilium_vxlan``). Nothing is changed.
"""

from __future__ import annotations

import json
from typing import Any

# Device kinds that encapsulate what they carry (iproute2's "info_kind")
TUNNELS = ("vxlan", "geneve", "ipip", "sit", "gre", "gretap", "ip6gre", "ip6gretap", "ip6tnl", "vti", "vti6",
           "wireguard", "bareudp")
IP_LINK = ["ip", "-d", "-j", "link", "show"]


def interfaces(text: str) -> dict[str, dict[str, Any]]:
    """``ip -d -j link show``'s devices, loopback left out: {name: {mtu, kind, and for a tunnel its vni and
    (UDP) port}}; kind is iproute2's (veth, bridge, vxlan, ...) or "device" for hardware."""
    out: dict[str, dict[str, Any]] = {}
    for link in json.loads(text or "[]"):
        if link.get("link_type") == "loopback" or link.get("ifname") == "lo":
            continue
        info = link.get("linkinfo") or {}
        entry: dict[str, Any] = {"mtu": link.get("mtu"), "kind": info.get("info_kind") or "device"}
        data = info.get("info_data") or {}
        if entry["kind"] in TUNNELS:
            for key, name in (("id", "vni"), ("port", "port")):
                if data.get(key) is not None:
                    entry[name] = data[key]
        if info.get("info_slave_kind"):
            entry["in"] = info["info_slave_kind"]  # a bridge's or bond's port
            if link.get("master"):
                entry["master"] = link["master"]
        out[link["ifname"]] = entry
    return out


def lasting(devices: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """A node's devices as facts that last from run to run: the veths that are ports of a bridge (the host ends
    of its pods, which the CNI names after each pod: new names for every pod) are one entry per bridge,
    "veths in BRIDGE", with their MTU (the MTUs, where they differ: a pod at another MTU than its peers is what
    a wrong MTU looks like). `compare` then names what changed on the node, not which pods it had."""
    out: dict[str, dict[str, Any]] = {}
    ports: dict[str, set[int | None]] = {}
    for name, d in devices.items():
        if d.get("kind") == "veth" and d.get("master"):
            ports.setdefault(d["master"], set()).add(d.get("mtu"))
        else:
            out[name] = d
    for bridge, mtus in sorted(ports.items()):
        mtu: Any = next(iter(mtus)) if len(mtus) == 1 else ", ".join(str(m) for m in sorted(mtus, key=lambda m: (m is None, m or 0)))
        out[f"veths in {bridge}"] = {"mtu": mtu, "kind": "veth", "in": "bridge"}
    return out


def encapsulation(devices: dict[str, dict[str, Any]]) -> str:
    """The tunnels among a node's devices, as a line: "vxlan (flannel.1: VNI 1, UDP 8472, MTU 1450)", or
    "none" where it has none (a routed or bridged pod network)."""
    tunnels = []
    for name, d in devices.items():
        if d.get("kind") not in TUNNELS:
            continue
        parts = [f"VNI {d['vni']}" if "vni" in d else "", f"UDP {d['port']}" if "port" in d else "", f"MTU {d['mtu']}"]
        tunnels.append(f"{d['kind']} ({name}: {', '.join(p for p in parts if p)})")
    return "; ".join(tunnels) or "none"
