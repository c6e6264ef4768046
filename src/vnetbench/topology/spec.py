"""The scenario's ``[topology]`` table: a template with its few numbers, or nodes and links written out, and
the endpoints its workloads run between.

::

    [topology]                      # a chain of three links through two routers
    template = "linear"
    hops = 3
    clients = ["h1"]                # default: each template's usual pair (here h1 -> h2)
    server = "h2"

    [topology]                      # or the graph itself
    nodes = { a = "host", x = "router", b = "host" }
    links = [ { name = "left", a = "a", b = "x" }, { name = "right", a = "x", b = "b" } ]

    [topology]                      # or a containerlab file's (topology/containerlab.py)
    containerlab = "sites.clab.yml"
    routers = ["r1"]

A link's conditions are declared where a dumbbell's are, ``[lab.link.NAME]`` (``forward`` = from its ``a``
end to its ``b`` end), so the same keys sweep them (``"link.right.forward.delay" = ["5ms", "50ms"]``).
Without a ``[topology]`` table a scenario runs on the dumbbell.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from vnetbench.errors import ScenarioError
from vnetbench.scenario.names import require_name
from vnetbench.topology import containerlab
from vnetbench.topology.graph import Graph, Link, Node
from vnetbench.topology.templates import TEMPLATES

MAX_CLIENTS = 64  # a trial's clients: as many as a dumbbell's senders


class LinkDeclaration(BaseModel):
    """One link of a written-out topology: its name and the nodes it joins (``forward`` is a -> b)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = Field(description="the link's name: its conditions are [lab.link.NAME]")
    a: str = Field(description="the node at its a end (forward leaves from here)")
    b: str = Field(description="the node at its b end")
    mtu: int | None = Field(default=None, ge=576, le=9000, description="its MTU; default: lab.mtu")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return require_name(v, "link")


class TopologySpec(BaseModel):
    """The lab's network as a graph: a template or written-out nodes and links, and the trial's endpoints."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    template: Literal[tuple(TEMPLATES)] | None = Field(  # type: ignore[valid-type]
        default=None, description="a classic shape: " + ", ".join(TEMPLATES) + " (or give nodes and links)")
    senders: int | None = Field(default=None, description="dumbbell: how many senders (1 to 64)")
    leaves: int | None = Field(default=None, description="star: how many hosts around the centre")
    hops: int | None = Field(default=None, description="linear: how many links from h1 to h2")
    bottlenecks: int | None = Field(default=None, description="parking-lot: how many bottleneck links in series")
    depth: int | None = Field(default=None, description="tree: how many levels below the root")
    fanout: int | None = Field(default=None, description="tree: how many children each node has")
    node: Literal["switch", "router"] | None = Field(default=None, description="star, linear, parking-lot, tree: "
                                                     "what the forwarding nodes are")
    nodes: dict[str, Literal["host", "switch", "router"]] | None = Field(
        default=None, description="a written-out graph's nodes: name = \"host\", \"switch\" or \"router\"")
    links: list[LinkDeclaration] | None = Field(default=None, description="a written-out graph's links: "
                                                "{name, a, b} tables, forward = a -> b")
    containerlab: str | None = Field(default=None, description="a containerlab topology file (*.clab.yml): its "
                                     "linux nodes are hosts, its bridge nodes switches, its links A-B (path as "
                                     "given, from where vnetbench runs)")
    routers: list[str] | None = Field(default=None, description="containerlab: the linux nodes that forward "
                                      "(routers, not hosts)")
    clients: list[str] | None = Field(default=None, description="the hosts the workloads' clients run on "
                                      "(a stream's senders); default: the template's")
    server: str | None = Field(default=None, description="the host the workloads' servers run on (a stream's "
                               "receiver); default: the template's")

    # Which template each parameter belongs to, and what each template's endpoints are by default.
    PARAMETERS: ClassVar[dict[str, tuple[str, ...]]] = {
        "senders": ("dumbbell",), "leaves": ("star",), "hops": ("linear",), "bottlenecks": ("parking-lot",),
        "depth": ("tree",), "fanout": ("tree",), "node": ("star", "linear", "parking-lot", "tree"),
    }

    @field_validator("clients", mode="before", json_schema_input_type=str | list[str])
    @classmethod
    def _one_or_more(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

    @model_validator(mode="after")
    def _shape(self) -> "TopologySpec":
        written = self.nodes is not None or self.links is not None
        given = [what for what, there in (("template", self.template is not None), ("nodes/links", written),
                                          ("containerlab", self.containerlab is not None)) if there]
        if not given:
            raise ValueError("give a template (" + ", ".join(TEMPLATES) + "), the graph's nodes and links, or a "
                             "containerlab file")
        if len(given) > 1:
            raise ValueError(f"{' and '.join(given)} each describe the graph: keep one")
        if self.routers is not None and self.containerlab is None:
            raise ValueError("routers names a containerlab file's linux nodes that forward: give containerlab = "
                             "\"FILE\", or declare routers as nodes (name = \"router\")")
        if written and (self.nodes is None or self.links is None):
            raise ValueError("a written-out topology needs both nodes = {NAME = \"host\" | \"switch\" | "
                             "\"router\", ...} and links = [{name, a, b}, ...]")
        wrong = [k for k, owners in self.PARAMETERS.items() if getattr(self, k) is not None
                 and self.template not in owners]
        if wrong:
            owners = self.PARAMETERS[wrong[0]]
            raise ValueError(f"{wrong[0]} = {getattr(self, wrong[0])!r} is a parameter of template "
                             f"{' / '.join(repr(o) for o in owners)}, not of "
                             f"{repr(self.template) if self.template else 'a written-out graph'}: remove it")
        if self.clients is not None and not self.clients:
            raise ValueError("clients = []: give at least one host")
        if self.clients is not None and len(self.clients) > MAX_CLIENTS:
            raise ValueError(f"{len(self.clients)} clients: at most {MAX_CLIENTS}")
        return self

    def graph(self, mtu: int = 1500) -> Graph:
        """The graph this table describes, links at `mtu` unless a link gives its own (not checked: see
        :meth:`Graph.problems`)."""
        if self.template is not None:
            params = {k: getattr(self, k) for k, owners in self.PARAMETERS.items()
                      if self.template in owners and getattr(self, k) is not None}
            made = TEMPLATES[self.template](**params)
            return Graph(made.nodes.values(), [Link(x.name, x.a, x.b, mtu=mtu) for x in made.links.values()])
        if self.containerlab is not None:
            try:
                return containerlab.read_graph(self.containerlab, self.routers or (), mtu)
            except ValueError as e:
                raise ScenarioError(f"topology: {e}") from None
        return Graph([Node(n, kind) for n, kind in (self.nodes or {}).items()],
                     [Link(x.name, x.a, x.b, mtu=x.mtu or mtu) for x in self.links or []])

    def endpoints(self, graph: Graph, required: bool = True, clients: list[str] | None = None,
                  server: str | None = None, where: str = "topology") -> tuple[list[str], str]:
        """(clients, server): `clients` and `server` when given (a workload's own, said in messages as `where`),
        else the table's, else the template's usual pair. Raises ScenarioError when they are not hosts of
        `graph`, or (`required`) when the graph has no usual pair and they are not given; not required, what is
        given is checked (a matrix may give the rest)."""
        hosts = graph.hosts()
        clients = clients if clients is not None else self.clients
        server = server if server is not None else self.server
        if clients is None or server is None:
            default = _default_endpoints(self.template, hosts)
            if default is None and not required:
                default = ([h for h in hosts if h != server][:1], server or hosts[-1])
            if default is None:
                raise ScenarioError(f"{where}: a {'containerlab' if self.containerlab else 'written-out'} graph with "
                                    "more than two hosts needs its endpoints: "
                                    f"clients = [...] and server = \"...\" (hosts: {', '.join(hosts[:8])}"
                                    f"{', ...' if len(hosts) > 8 else ''})")
            clients = clients if clients is not None else [c for c in default[0] if c != server]
            server = server if server is not None else default[1]
        problems = [f"{what} {name!r} is no host of the topology" for what, names in (("client", clients),
                                                                                      ("server", [server]))
                    for name in names if name not in graph.nodes or graph.kind(name) != "host"]
        if server in clients:
            problems.append(f"{server!r} is both a client and the server: a trial runs between different hosts")
        if len(set(clients)) != len(clients):
            problems.append(f"clients = {clients}: a host is named twice")
        if not clients:
            problems.append("no client is left once the server is taken out: name the clients")
        if problems:
            raise ScenarioError(f"{where}: " + "; ".join(problems) + f" (hosts: {', '.join(hosts[:8])}"
                                f"{', ...' if len(hosts) > 8 else ''})")
        return list(clients), server


def _default_endpoints(template: str | None, hosts: list[str]) -> tuple[list[str], str] | None:
    """Each shape's usual study: a dumbbell's senders to its receiver, a star's leaves to its server, one end
    of a chain to the other, the parking lot's long flow, a tree's first host to its last (the farthest)."""
    if template == "dumbbell":
        return [h for h in hosts if h != "r"], "r"
    if template == "star":
        return [h for h in hosts if h != "srv"], "srv"
    if template == "parking-lot":
        return ["src"], "dst"
    if template in ("linear", "tree") or len(hosts) == 2:
        return [hosts[0]], hosts[-1]
    return None
