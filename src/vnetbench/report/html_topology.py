"""The lab of a run drawn as inline SVG (no script, every text escaped).

The dumbbell has a drawing of its own::

    s1 ──┐
    s2 ──┤ switch ══[bottleneck: rate, qdisc, buffer]══▶ r
    sN ──┘

A declared topology (the run's fingerprint "topology") is drawn from its graph, in layers by hops from the
first workload's server (at the right; what is farthest at the left, as a sideways ``dot`` rank layout): a
chain is a row, a star a fan, a tree a tree, a parking lot its long path with the cross flows' hosts beside. Conditioned links are red and say their conditions; each link's tooltip
names the workloads whose paths cross it. Beyond MAX_DRAWN nodes only the nodes on the workloads' paths are
drawn, and at most PER_LAYER at one distance (a thousand leaves of a star): a dashed box counts the others.
"""

from __future__ import annotations

import html
import re
from typing import Any

from vnetbench import units


def fmt_rate(bps: float) -> str:
    """100e6 -> '100 Mbit/s'."""
    text = units.format_rate(bps)
    m = re.match(r"^([0-9.e+-]+)(.*)$", text)
    return f"{m.group(1)} {m.group(2)}/s" if m else text


def _distinct(params: list[dict[str, Any]], key: str) -> list[Any]:
    out = []
    for p in params:
        v = p.get(key)
        if v is not None and v not in out:
            out.append(v)
    return out


def _span(values: list[float], fmt) -> str:
    nums = sorted(v for v in values if isinstance(v, (int, float)))
    if not nums:
        return "?"
    if nums[0] == nums[-1]:
        return fmt(nums[0])
    return f"{fmt(nums[0])} – {fmt(nums[-1])}"


def describe(params: list[dict[str, Any]]) -> dict[str, str]:
    """What the drawing says, as text (also used for the drawing's <title>)."""
    rates = _distinct(params, "bottleneck_bps")
    buffers = _distinct(params, "buffer_bytes")
    senders = [int(s) for s in _distinct(params, "senders") if isinstance(s, (int, float))]
    delay_ms = ""
    if len(rates) == 1 and len(buffers) == 1 and rates[0]:
        delay_ms = f" = {float(buffers[0]) * 8 / float(rates[0]) * 1e3:.3g} ms at the rate"
    return {
        "topology": ", ".join(str(t) for t in _distinct(params, "topology")) or "?",
        "senders": (str(senders[0]) if len(senders) == 1 else f"{min(senders)}–{max(senders)}") if senders else "?",
        "max_senders": str(max(senders) if senders else 2),
        "rate": _span(rates, fmt_rate),
        "buffer": _span(buffers, units.format_size) + delay_ms,
        "qdisc": ", ".join(str(q) for q in _distinct(params, "qdisc")) or "?",
        "shape": ", ".join(str(s) for s in _distinct(params, "shape")) or "forward",
        "proto": ", ".join(str(s) for s in _distinct(params, "proto")),
    }


def svg(params: list[dict[str, Any]], probe: str | None = None) -> str:
    d = describe(params)
    e = lambda s: html.escape(str(s), quote=True)  # noqa: E731
    if d["topology"] != "dumbbell":
        return (f'<p class="note">Topology <b>{e(d["topology"])}</b>: {e(d["senders"])} senders, '
                f'bottleneck {e(d["rate"])}, buffer {e(d["buffer"])}, qdisc {e(d["qdisc"])}.</p>')
    n = max(1, min(int(d["max_senders"]), 8))
    row = 46
    height = max(170, 40 + n * row)
    width = 720
    sw_x, sw_y = 300, height / 2
    r_x = 620
    parts = [f'<svg class="topology" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
             f'aria-labelledby="topo-title" xmlns="http://www.w3.org/2000/svg">',
             f'<title id="topo-title">Dumbbell: {e(d["senders"])} senders to a switch, bottleneck {e(d["rate"])} '
             f'toward the receiver</title>',
             '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
             'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#b42318"/></marker></defs>']
    for i in range(n):
        y = 20 + row / 2 + i * row + (height - 40 - n * row) / 2
        label = f"s{i + 1}" if not (n == 8 and i == 6 and int(d["max_senders"]) > 8) else "…"
        parts.append(f'<line x1="96" y1="{y:.0f}" x2="{sw_x - 40}" y2="{sw_y:.0f}" stroke="#57606a" '
                     'stroke-width="1.5"/>')
        parts.append(f'<rect x="40" y="{y - 15:.0f}" width="56" height="30" rx="6" fill="#eef2f7" stroke="#4e79a7"/>')
        parts.append(f'<text x="68" y="{y + 5:.0f}" text-anchor="middle" font-size="13">{e(label)}</text>')
    parts.append(f'<rect x="{sw_x - 40}" y="{sw_y - 24:.0f}" width="80" height="48" rx="8" fill="#f6f8fa" '
                 f'stroke="#1f2328"/>')
    parts.append(f'<text x="{sw_x}" y="{sw_y + 5:.0f}" text-anchor="middle" font-size="13">switch</text>')
    parts.append(f'<line x1="{sw_x + 40}" y1="{sw_y:.0f}" x2="{r_x - 34}" y2="{sw_y:.0f}" stroke="#b42318" '
                 f'stroke-width="5" marker-end="url(#arrow)"/>')
    mid = (sw_x + 40 + r_x - 34) / 2
    parts.append(f'<text x="{mid:.0f}" y="{sw_y - 30:.0f}" text-anchor="middle" font-size="13" font-weight="600">'
                 f'bottleneck {e(d["rate"])}</text>')
    parts.append(f'<text x="{mid:.0f}" y="{sw_y - 13:.0f}" text-anchor="middle" font-size="11">'
                 f'{e(d["qdisc"])} on the switch port ({e(d["shape"])})</text>')
    parts.append(f'<text x="{mid:.0f}" y="{sw_y + 24:.0f}" text-anchor="middle" font-size="11">'
                 f'buffer {e(d["buffer"])}</text>')
    parts.append(f'<rect x="{r_x - 30}" y="{sw_y - 18:.0f}" width="60" height="36" rx="6" fill="#eef6ee" '
                 f'stroke="#59a14f"/>')
    parts.append(f'<text x="{r_x}" y="{sw_y + 5:.0f}" text-anchor="middle" font-size="13">r</text>')
    caption = f'{d["senders"]} sender(s) active'
    if d["proto"]:
        caption += f", {d['proto']} flows"
    if probe:
        caption += f"; {probe}"
    parts.append(f'<text x="{width / 2:.0f}" y="{height - 6}" text-anchor="middle" font-size="11" fill="#57606a">'
                 f'{e(caption)}</text>')
    parts.append("</svg>")
    return "".join(parts)


MAX_DRAWN = 300  # a larger graph is drawn as its workloads' paths
PER_LAYER = 16  # nodes drawn at one distance at most (those on conditioned links first); the rest are counted
LAYER_DX = 150
ROW_DY = 46
NODE_W, NODE_H = 70, 28


def graph_layers(nodes: dict[str, str], links: list[dict[str, Any]], roots: list[str]) -> list[list[str]]:
    """The nodes in layers by hops from the nearest of `roots` (layer 0), each layer ordered by where
    its neighbours in the layer before sit (the barycentre heuristic of layered drawing), names breaking ties;
    nodes no server reaches go last."""
    adjacent: dict[str, list[str]] = {n: [] for n in nodes}
    for link in links:
        if link["a"] in adjacent and link["b"] in adjacent:
            adjacent[link["a"]].append(link["b"])
            adjacent[link["b"]].append(link["a"])
    layer = {s: 0 for s in roots if s in nodes}
    frontier = list(layer)
    while frontier:
        nxt = []
        for n in frontier:
            for m in adjacent[n]:
                if m not in layer:
                    layer[m] = layer[n] + 1
                    nxt.append(m)
        frontier = nxt
    depth = max(layer.values(), default=-1) + 1
    for n in nodes:
        layer.setdefault(n, depth)
    layers: list[list[str]] = [[] for _ in range(max(layer.values(), default=-1) + 1)]
    for n in sorted(nodes, key=_natural):
        layers[layer[n]].append(n)
    for i in range(1, len(layers)):
        place = {n: k for k, n in enumerate(layers[i - 1])}
        def centre(n: str) -> float:
            seen = [place[m] for m in adjacent[n] if m in place]
            return sum(seen) / len(seen) if seen else float(len(place))
        layers[i].sort(key=lambda n: (centre(n), _natural(n)))
    return [x for x in layers if x]


def _conditions(link: dict[str, Any]) -> list[str]:
    return [c for c in link.get("conditions", []) if c != "plain"]


def _label(link: dict[str, Any]) -> str:
    """What a conditioned link says on the drawing: its name and first conditions, at most 48 characters (the
    tooltip has them all)."""
    conditions = _conditions(link)
    text = f"{link['name']}: {conditions[0]}" + (f" (+{len(conditions) - 1})" if len(conditions) > 1 else "")
    return text if len(text) <= 48 else text[:47] + "…"


def _natural(name: str) -> tuple:
    """h2 before h10."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


def graph_svg(topology: dict[str, Any]) -> str:
    """A declared topology as inline SVG: nodes in layers, links with their conditions, each endpoint's role."""
    e = lambda s: html.escape(str(s), quote=True)  # noqa: E731
    nodes: dict[str, str] = dict(topology.get("nodes") or {})
    links: list[dict[str, Any]] = list(topology.get("links") or [])
    endpoints = list(topology.get("endpoints") or [])
    servers = list(dict.fromkeys(p["server"] for p in endpoints))
    clients = list(dict.fromkeys(c for p in endpoints for c in p["clients"]))
    crossing: dict[str, list[str]] = {}  # link -> workloads whose paths cross it
    for p in endpoints:
        for path in p.get("paths", {}).values():
            for name in path:
                for w in p.get("workloads") or ["the trial"]:
                    if w not in crossing.setdefault(name, []):
                        crossing[name].append(w)
    total = len(nodes)
    if total > MAX_DRAWN:
        on_paths = {n for p in endpoints for c, path in p.get("paths", {}).items() for n in (c, p["server"])}
        on_paths |= {x for link in links if link["name"] in crossing for x in (link["a"], link["b"])}
        nodes = {n: k for n, k in nodes.items() if n in on_paths}
        links = [link for link in links if link["a"] in nodes and link["b"] in nodes]
    layers = graph_layers(nodes, links, servers[:1])
    hidden = {}  # layer -> how many of its nodes are not drawn
    for i, layer in enumerate(layers):
        if len(layer) > PER_LAYER:
            marked = {x for link in links if _conditions(link) for x in (link["a"], link["b"])}
            keep = set([n for n in layer if n in marked][:PER_LAYER - 1])
            keep |= set([n for n in layer if n not in keep][:PER_LAYER - 1 - len(keep)])
            hidden[i] = len(layer) - len(keep)
            layers[i] = [n for n in layer if n in keep]
    drawn_nodes = {n for layer in layers for n in layer}
    links = [link for link in links if link["a"] in drawn_nodes and link["b"] in drawn_nodes]
    tallest = max((len(x) + (i in hidden) for i, x in enumerate(layers)), default=1)
    # layers far enough apart for a link's label to fit between its nodes (10 px type: ~5.6 px a character)
    longest = max((len(_label(link)) for link in links if _conditions(link)), default=0)
    dx = max(LAYER_DX, min(320, longest * 5.6 + NODE_W + 16))
    width = max(360, 60 + len(layers) * dx)
    height = 70 + tallest * ROW_DY
    at: dict[str, tuple[float, float]] = {}
    more: list[tuple[float, float, int]] = []  # where a layer's nodes that are not drawn are counted
    for i, layer in enumerate(layers):
        x = width - 70 - i * dx
        top = 30 + (tallest - len(layer)) * ROW_DY / 2
        for k, n in enumerate(layer):
            at[n] = (x, top + ROW_DY / 2 + k * ROW_DY)
        if i in hidden:
            more.append((x, top + ROW_DY / 2 + len(layer) * ROW_DY, hidden[i]))
    kinds = list(topology.get("nodes", {}).values())
    title = (f"Declared topology: {kinds.count('host')} hosts, {kinds.count('switch')} switches, "
             f"{kinds.count('router')} routers, {len(topology.get('links') or [])} links")
    parts = [f'<svg class="topology" viewBox="0 0 {width:.0f} {height}" width="{width:.0f}" height="{height}" '
             'style="max-width:100%;height:auto" role="img" aria-labelledby="topo-title" '
             'xmlns="http://www.w3.org/2000/svg">', f'<title id="topo-title">{e(title)}</title>']
    labels: list[str] = []
    for link in links:
        (x1, y1), (x2, y2) = at[link["a"]], at[link["b"]]
        conditions = _conditions(link)
        colour, stroke = ("#b42318", 3.5) if conditions else ("#57606a", 1.5)
        who = crossing.get(link["name"])
        tip = f"link {link['name']}: {link['a']} -> {link['b']}" + (f"; {' | '.join(conditions)}" if conditions else "")
        tip += f"; crossed by {', '.join(who)}" if who else "; on no workload's path"
        parts.append(f'<g><title>{e(tip)}</title><line x1="{x1:.0f}" y1="{y1:.0f}" x2="{x2:.0f}" y2="{y2:.0f}" '
                     f'stroke="{colour}" stroke-width="{stroke}"/></g>')
        if conditions:
            mx, my = (x1 + x2) / 2, (y1 + y2) / 2
            text = _label(link)
            # drawn over the nodes, on a white halo, so that a node never hides what its link carries
            labels.append(f'<text x="{mx:.0f}" y="{my - 8:.0f}" text-anchor="middle" font-size="10" fill="#b42318" '
                          f'stroke="#ffffff" stroke-width="3" paint-order="stroke">{e(text)}</text>')
    for n, (x, y) in at.items():
        kind = nodes[n]
        fill, edge = (("#eef6ee", "#59a14f") if n in servers else ("#eef2f7", "#4e79a7") if n in clients
                      else ("#f6f8fa", "#1f2328"))
        rx = 14 if kind == "router" else 2 if kind == "switch" else 6
        role = "server" if n in servers else "client" if n in clients else kind
        parts.append(f'<g><title>{e(f"{n}: {role}" + ("" if role == kind else f" ({kind})"))}</title>'
                     f'<rect x="{x - NODE_W / 2:.0f}" y="{y - NODE_H / 2:.0f}" width="{NODE_W}" height="{NODE_H}" '
                     f'rx="{rx}" fill="{fill}" stroke="{edge}"/>'
                     f'<text x="{x:.0f}" y="{y + 4:.0f}" text-anchor="middle" font-size="12">{e(n[:10])}</text></g>')
    for x, y, n in more:
        parts.append(f'<g><title>{n:,} more nodes at this distance, not drawn</title>'
                     f'<rect x="{x - NODE_W / 2:.0f}" y="{y - NODE_H / 2:.0f}" width="{NODE_W}" height="{NODE_H}" '
                     f'rx="6" fill="#ffffff" stroke="#8c959f" stroke-dasharray="4 3"/>'
                     f'<text x="{x:.0f}" y="{y + 4:.0f}" text-anchor="middle" font-size="11">+{n:,} more</text></g>')
    parts += labels
    caption = "clients blue, servers green, routers round; red links carry conditions (hover a link: its workloads)"
    if total > len(at):
        caption = f"{len(at)} of {total:,} nodes drawn; " + caption
    parts.append(f'<text x="{width / 2:.0f}" y="{height - 8}" text-anchor="middle" font-size="11" fill="#57606a">'
                 f'{e(caption)}</text>')
    parts.append("</svg>")
    rows = [f"<li><code>{e(', '.join(p.get('workloads') or []))}</code>: "
            + "; ".join(f"{e(c)} → {e(p['server'])} via {e(' → '.join(path))}" for c, path in
                        list(p.get("paths", {}).items())[:8]) + "</li>" for p in endpoints[:20]]
    return "".join(parts) + (f'<ul class="paths">{"".join(rows)}</ul>' if rows else "")
