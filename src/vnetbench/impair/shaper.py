"""The kernel shapers ``tbf`` and ``htb``: rate and buffer (drop-tail) on each direction's egress."""

from __future__ import annotations

from typing import Any

from vnetbench.impair import tc
from vnetbench.impair.backend import SHAPER_NEEDS, Backend, LabLink, TrialCounters, register
from vnetbench.impair.model import LinkSpec


# (decorators apply bottom-up: tbf is registered first)
@register("htb", "'htb' (kernel hierarchical token bucket)", SHAPER_NEEDS, probe_qdisc="htb default 1")
@register("tbf", "'tbf' (kernel token bucket)", SHAPER_NEEDS, probe_qdisc="tbf rate 10mbit burst 32kb limit 100kb")
class ShaperBackend(Backend):
    """Kernel tbf or htb (+ bfifo) on the egress of each direction: rate and buffer only."""

    def __init__(self, link: LabLink, mtu: int = 1500, shaper: str = "tbf"):
        super().__init__(link, mtu, shaper)
        self.name = shaper
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
            buffer = cond.buffer_bytes() or 1000 * (self.mtu + 14)
            tc.apply(iface, tc.Shaping(rate_bps=cond.rate, buffer_bytes=buffer, qdisc=self.name, mtu=self.mtu))
            out["directions"][d] = {"qdiscs": [q for q in tc.read_back(iface) if q["kind"] != "noqueue"]}
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
