"""The rate qdiscs ``tbf`` and ``htb``: rate and buffer (drop-tail) on each direction's egress."""

from __future__ import annotations

from typing import Any

from vnetbench.impair import tc
from vnetbench.impair.backend import RATE_QDISC_NEEDS, Backend, LabLink, TrialCounters, register
from vnetbench.impair.model import LinkSpec, default_buffer_bytes

# The kernel keeps a rate in bytes per second (and tc's tables round): what it reads back may differ from the
# declared rate by a rounding, never by more than this fraction.
RATE_TOLERANCE = 0.001


# (decorators apply bottom-up: tbf is registered first)
@register("htb", "'htb' (kernel hierarchical token bucket)", RATE_QDISC_NEEDS, probe_qdisc="htb default 1",
          fix="modprobe sch_htb (CONFIG_NET_SCH_HTB); qdisc = \"tbf\" works without it")
@register("tbf", "'tbf' (kernel token bucket)", RATE_QDISC_NEEDS, probe_qdisc="tbf rate 10mbit burst 32kb limit 100kb",
          fix="modprobe sch_tbf (CONFIG_NET_SCH_TBF): bottlenecks need tbf or htb")
class RateQdiscBackend(Backend):
    """Kernel tbf or htb (+ bfifo) on the egress of each direction: rate and buffer only."""

    def __init__(self, link: LabLink, mtu: int = 1500, rate_qdisc: str = "tbf"):
        super().__init__(link, mtu, rate_qdisc)
        self.name = rate_qdisc
        self._before: dict[str, dict[str, int]] = {}

    def apply(self, spec: LinkSpec) -> dict:
        out: dict[str, Any] = {"backend": self.name, "directions": {}}
        for d in ("forward", "reverse"):
            cond = spec.direction(d)
            iface = self.link.egress(d)
            if not cond.rate:
                tc.clear(iface)
                out["directions"][d] = {"plain": True}
                continue
            buffer = cond.buffer_bytes() or default_buffer_bytes(self.mtu)
            tc.apply(iface, tc.Shaping(rate_bps=cond.rate, buffer_bytes=buffer, qdisc=self.name, mtu=self.mtu))
            out["directions"][d] = {"qdiscs": [q for q in tc.read_back(iface) if q["kind"] != "noqueue"]}
        return out

    def check(self, spec: LinkSpec) -> list[str]:
        out = []
        for d in ("forward", "reverse"):
            cond = spec.direction(d)
            iface = self.link.egress(d)
            roots = tc.installed_roots(tc.read_back(iface))
            kinds = ", ".join(q["kind"] for q in roots) or "none"
            if not cond.rate:
                if roots:
                    out.append(f"{d}: the kernel has {kinds} on {iface.name}, where no rate is declared")
                continue
            if [q["kind"] for q in roots] != [self.name]:
                out.append(f"{d}: {self.name} is declared on {iface.name}, the kernel has {kinds}")
                continue
            rate = roots[0].get("rate_bps") if self.name == "tbf" else tc.htb_class_rate(iface)
            if rate is None or abs(rate - cond.rate) > RATE_TOLERANCE * cond.rate:
                out.append(f"{d}: the kernel's rate on {iface.name} is {rate} bit/s, {cond.rate:g} is declared")
            limit = roots[0].get("limit_bytes") if self.name == "tbf" else tc.fifo_limit(iface)
            wanted = int(cond.buffer_bytes() or default_buffer_bytes(self.mtu))
            if limit != wanted:
                out.append(f"{d}: the kernel's buffer on {iface.name} is {limit} bytes, {wanted} is declared")
        return out

    def qdiscs(self) -> list[dict]:
        out = []
        for iface in (self.link.switch_end, self.link.host_end):
            out.extend(q for q in tc.read_back(iface) if q["kind"] not in ("noqueue",))
        return out

    def start_trial(self, spec: LinkSpec, seconds: float) -> None:
        self._before = {d: tc.counters(self.link.egress(d)) for d in ("forward", "reverse")}

    def end_trial(self) -> TrialCounters:
        out = TrialCounters()
        for d, before in self._before.items():
            after = tc.counters(self.link.egress(d))
            out.per_direction[d] = {"dropped_queue": after["drops"] - before["drops"],
                                    "packets": after["packets"] - before["packets"]}
        return out

    def clear(self) -> None:
        for iface in (self.link.switch_end, self.link.host_end):
            tc.clear(iface)
