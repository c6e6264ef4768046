"""`bare`: the reference. The endpoint is a namespace attached straight to the switch.

::

    [ host ns: eth0 198.18.0.x ] ──veth── [ switch: br0 ]
"""

from __future__ import annotations

from typing import Any

from vnetbench.lab.environments.base import (Attached, Capability, Endpoint, NamespaceEnvironment, wired_namespace,
                                             namespace_node, register)


@register
class BareEnvironment(NamespaceEnvironment):
    kind = "bare"
    tag = "b"

    @classmethod
    def capabilities(cls, variant: Any | None, kernel: dict[str, str | None] | None) -> list[Capability]:
        return [Capability("bare", True, "namespace on the switch (the reference)")]

    def attach(self, endpoint: Endpoint) -> Attached:
        node = wired_namespace(self.ctx, endpoint.name)
        host = namespace_node(endpoint, node.ns, self.ctx.registry, node.iface, node.ipv4, node.ipv6,
                              env_facts={"env": "bare", "netns": node.ns.name})
        att = Attached(node=host, port=node.port, uplink=node.iface, offload_ifaces=[node.iface])
        self.attached.append(att)
        return att

    def facts(self) -> dict[str, Any]:
        return {"env": "bare", "path": "host eth0 -> veth -> switch bridge"}
