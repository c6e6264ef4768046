"""The lab of a run drawn as inline SVG (no script, every text escaped).

Only the dumbbell exists today::

    s1 ──┐
    s2 ──┤ switch ══[bottleneck: rate, qdisc, buffer]══▶ r
    sN ──┘

Other topologies fall back to a plain description until they get a drawing.
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
