"""Rate and buffer with kernel qdiscs (tbf, or htb with a byte FIFO), set
through netlink and read back from the kernel so the run records what was
actually installed, not what we asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vnetbench.impair.model import frame_bytes
from vnetbench.lab.netns import rtnl  # pyroute2, with bfifo's codec
from vnetbench.lab.nodes import Interface

TC_H_ROOT = 0xFFFFFFFF


@dataclass(frozen=True)
class Shaping:
    """A bottleneck on one interface's egress: rate in bit/s, queue limit in bytes."""

    rate_bps: float
    buffer_bytes: float
    qdisc: str = "tbf"  # tbf | htb
    mtu: int = 1500

    @property
    def burst_bytes(self) -> int:
        return burst_bytes(self.rate_bps, self.mtu)


def burst_bytes(rate_bps: float, mtu: int) -> int:
    """A rate qdisc's burst (tbf, htb, and netem's tbf/htb child): one millisecond of tokens, at least
    two full frames; enough to keep the link busy across timer slack, small enough that the output never
    bursts far above the rate."""
    return int(max(2 * frame_bytes(mtu), rate_bps / 8 * 1e-3))


def apply(iface: Interface, shaping: Shaping) -> None:
    """Install (or replace) the bottleneck on `iface`'s egress."""
    ipr, index = iface.ns.ipr, iface.index
    clear(iface)
    if shaping.qdisc == "tbf":
        ipr.tc("add", "tbf", index=index, handle="1:", rate=f"{int(shaping.rate_bps)}bit",
               burst=shaping.burst_bytes, limit=int(shaping.buffer_bytes))
    elif shaping.qdisc == "htb":
        ipr.tc("add", "htb", index=index, handle="1:", default=0x10)
        ipr.tc("add-class", "htb", index=index, handle="1:10", parent="1:", rate=f"{int(shaping.rate_bps)}bit",
               ceil=f"{int(shaping.rate_bps)}bit", burst=shaping.burst_bytes, cburst=shaping.burst_bytes)
        ipr.tc("add", "bfifo", index=index, handle="10:", parent="1:10", limit=int(shaping.buffer_bytes))
    else:
        raise ValueError(f"unknown qdisc {shaping.qdisc!r}; expected tbf or htb")


def clear(iface: Interface) -> None:
    ipr, index = iface.ns.ipr, iface.index
    for q in ipr.get_qdiscs(index=index):
        if q["parent"] == TC_H_ROOT and q.get_attr("TCA_KIND") not in ("noqueue",):
            ipr.tc("del", index=index, handle=0, parent=TC_H_ROOT)
            return


def read_back(iface: Interface) -> list[dict[str, Any]]:
    """The qdiscs on `iface` as the kernel reports them, with decoded rates and limits."""
    out = []
    for q in iface.ns.ipr.get_qdiscs(index=iface.index):
        kind = q.get_attr("TCA_KIND")
        entry: dict[str, Any] = {
            "netns": iface.ns.name, "dev": iface.name, "kind": kind,
            "handle": f"{q['handle'] >> 16:x}:", "parent": "root" if q["parent"] == TC_H_ROOT else f"{q['parent'] >> 16:x}:{q['parent'] & 0xFFFF:x}",
        }
        opts = q.get_attr("TCA_OPTIONS")
        if kind == "tbf" and opts is not None:
            parms = opts.get_attr("TCA_TBF_PARMS")
            if parms is not None:
                rate = parms["rate"]  # bytes/s
                entry["rate_bps"] = rate * 8
                entry["limit_bytes"] = parms["limit"]
                entry["burst_bytes"] = round(parms["buffer"] / rtnl().tc_common.tick_in_usec * rate / 1e6)
        elif kind in ("bfifo", "pfifo") and opts is not None:
            entry["limit"] = opts["limit"]
        stats = q.get_attr("TCA_STATS")
        if stats is not None:
            entry["drops"] = stats["drop"]
        out.append(entry)
    return out


def counters(iface: Interface) -> dict[str, int]:
    """Root qdisc counters: packets sent, drops, overlimits (for per-trial deltas)."""
    for q in iface.ns.ipr.get_qdiscs(index=iface.index):
        if q["parent"] == TC_H_ROOT:
            stats = q.get_attr("TCA_STATS")
            if stats is not None:
                return {"packets": stats["packets"], "drops": stats["drop"], "overlimits": stats["overlimits"]}
    return {"packets": 0, "drops": 0, "overlimits": 0}


def htb_class_rate(iface: Interface) -> float | None:
    for c in iface.ns.ipr.get_classes(index=iface.index):
        opts = c.get_attr("TCA_OPTIONS")
        if opts is not None:
            parms = opts.get_attr("TCA_HTB_PARMS")
            if parms is not None:
                return parms["rate"] * 8.0
    return None


def fifo_limit(iface: Interface) -> int | None:
    """The byte limit of the bfifo under an htb (the rate qdisc's buffer), as the kernel reports it."""
    for q in iface.ns.ipr.get_qdiscs(index=iface.index):
        if q.get_attr("TCA_KIND") == "bfifo":
            opts = q.get_attr("TCA_OPTIONS")
            return None if opts is None else opts["limit"]
    return None


def installed_roots(qdiscs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Of `read_back`'s (or `tc -j qdisc show`'s) qdiscs, those installed at the root: the kernel's own default
    there (noqueue on a veth, pfifo_fast or fq_codel on a device with a queue) has handle 0."""
    return [q for q in qdiscs if q.get("parent") == "root" or q.get("root")
            if str(q.get("handle", "0:")) not in ("0:", "0")]

