"""`bare`: the reference. The endpoint is a namespace attached straight to the switch.

::

    [ host ns: eth0 198.18.0.x ] ──veth── [ switch: br0 ]
"""

from __future__ import annotations

from typing import Any

from vnetbench.lab import offload
from vnetbench.lab.environments.base import Attached, Endpoint, LabContext, attach_node, plain_host


class BareEnvironment:
    kind = "bare"

    def __init__(self, ctx: LabContext, variant: Any):
        self.ctx = ctx
        self.variant = variant
        self._offload: offload.OffloadControl | None = None
        self.attached: list[Attached] = []

    def attach(self, endpoint: Endpoint) -> Attached:
        node = attach_node(self.ctx, endpoint.name, endpoint.number, endpoint.mtu)
        host = plain_host(endpoint, node.ns, self.ctx.registry, node.iface, node.ipv4, node.ipv6,
                          env_facts={"env": "bare", "netns": node.ns.name})
        att = Attached(host=host, port=node.port, uplink=node.iface, offload_ifaces=[node.iface])
        self.attached.append(att)
        return att

    def finish(self) -> None:
        pass

    def set_offload(self, on: bool) -> list[dict[str, Any]]:
        if self._offload is None:
            self._offload = offload.OffloadControl([i for a in self.attached for i in a.offload_ifaces])
        return self._offload.set(on)

    def facts(self) -> dict[str, Any]:
        return {"env": "bare", "path": "host eth0 -> veth -> switch bridge"}
