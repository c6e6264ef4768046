"""Plotly figures (as plain dicts) for the HTML report.

Figures are built as JSON-ready dicts rather than ``plotly.graph_objects``:
the page's own plotly.js draws them, and skipping the Python-side validation
keeps a 200-configuration report within its time budget. Every figure has a
title and axis titles with units.

Text that comes from users (label values, scenario names) is HTML-escaped
before it goes into a figure: plotly.js renders a subset of HTML in trace
names, tick labels and hover text, and decodes entities, so an escaped label
reads exactly as typed and never becomes markup.
"""

from __future__ import annotations

import html
import math
from typing import Any

import numpy as np

from vnetbench.metrics import METRICS
from vnetbench.report.html_model import Entry, ReportModel, fmt_num, rgba, shade
from vnetbench.stats.summary import Summary, summarize_many

FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, sans-serif"
GRID = "#e6e8eb"
THEORY_COLOUR = "#222222"
REFERENCE_COLOUR = "#7a1f1f"

#: Metrics on which the full-buffer queueing delay (buffer / rate) is a reference line.
RTT_METRICS = {"rtt.avg_ms", "rtt.p50_ms", "rtt.p90_ms", "rtt.p99_ms", "rtt.p999_ms", "rtt.max_ms",
               "tcp.mean_srtt_ms"}


def esc(text: Any) -> str:
    """User text for a plotly string attribute: shown literally, never as markup."""
    return html.escape(str(text), quote=True)


def unit_label(unit: str) -> str:
    return {"ratio": "ratio, 0–1"}.get(unit, unit)


def metric_axis_title(metric: str, unit: str) -> str:
    return f"{metric} ({unit_label(unit)})" if unit else metric


def metric_title(metric: str) -> str:
    info = METRICS.get(metric)
    if info is None:
        return metric
    short = info.description.split(" (")[0].split(",")[0].split(":")[0].strip()
    return f"{short} — {metric}"


def _round(values: np.ndarray, digits: int = 5) -> list[float]:
    """Values rounded to `digits` significant digits: a third of the JSON text, no visible change."""
    a = np.asarray(values, dtype=float)
    finite = a[np.isfinite(a)]
    if finite.size == 0:
        return []
    scale = float(np.max(np.abs(finite)))
    decimals = digits - 1 - (int(math.floor(math.log10(scale))) if scale > 0 else 0)
    return np.round(a, max(0, min(decimals, 12))).tolist()


def base_layout(title: str, x_title: str, y_title: str, legend_title: str = "", height: int = 380) -> dict:
    return {
        "title": {"text": esc(title), "x": 0.01, "xanchor": "left", "font": {"size": 14},
                  "y": 1, "yref": "container", "yanchor": "top", "pad": {"t": 12}},
        "font": {"family": FONT, "size": 12, "color": "#1f2328"},
        "paper_bgcolor": "#ffffff",
        "plot_bgcolor": "#ffffff",
        "height": height,
        "margin": {"l": 64, "r": 16, "t": 76, "b": 56},
        "xaxis": {"title": {"text": esc(x_title)}, "automargin": True, "gridcolor": GRID, "zeroline": False,
                  "linecolor": "#9aa1a9", "ticks": "outside"},
        "yaxis": {"title": {"text": esc(y_title)}, "automargin": True, "gridcolor": GRID, "zeroline": False,
                  "linecolor": "#9aa1a9", "ticks": "outside"},
        # Legend between the title and the plot: never on top of the data or the axis title.
        "legend": {"title": {"text": esc(legend_title)}, "orientation": "h", "x": 0, "xanchor": "left",
                   "y": 1.01, "yanchor": "bottom", "font": {"size": 11}},
        "hovermode": "closest",
        "hoverlabel": {"font": {"family": FONT}},
    }


def fit_legend(fig: dict, width: int = 480) -> dict:
    """Make room above the plot for a horizontal legend: estimate how many rows
    its entries wrap into at a typical card width and size the top margin so the
    legend never covers the title."""
    lay = fig["layout"]
    if lay.get("showlegend") is False or lay["legend"].get("orientation") != "h":
        return fig
    names = [t.get("name", "") for t in fig["data"] if t.get("showlegend", True) is not False]
    if len(names) <= 1 and not lay["legend"]["title"]["text"]:
        return fig
    rows, x = 1, 8 + 6.5 * len(lay["legend"]["title"]["text"])
    for name in names:
        w = 46 + 6.3 * len(name)
        if x + w > width and x > 0:
            rows, x = rows + 1, 0
        x += w
    lay["margin"]["t"] = 44 + 21 * rows
    lay["height"] = lay["height"] + 21 * (rows - 1)
    return fig


def _order_key(model: ReportModel, e: Entry) -> tuple:
    return tuple(a.values.index(e.axis[a.name]) if e.axis.get(a.name) in a.values else -1
                 for a in model.axes.values())


def _finite(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a, dtype=float)
    return a[np.isfinite(a)]


# ------------------------------------------------------------- summaries


def summaries(model: ReportModel) -> dict[str, dict[int, Summary]]:
    """{metric: {entry index: Summary}}, computed in one vectorised pass per metric."""
    out: dict[str, dict[int, Summary]] = {}
    for m in model.metrics:
        idx, groups = [], []
        for e in model.entries:
            v = _finite(e.values.get(m, np.empty(0)))
            if v.size:
                idx.append(e.index)
                groups.append(v)
        if groups:
            out[m] = dict(zip(idx, summarize_many(groups)))
    return out


# ------------------------------------------------------------- box plots


def _full_buffer_delays(entries: list[Entry]) -> list[float]:
    vals = sorted({round(float(e.expected["queue.full_delay_ms"]), 6) for e in entries
                   if isinstance(e.expected.get("queue.full_delay_ms"), (int, float))})
    return vals[:3]


def box_figure(model: ReportModel, metric: str, facet: str) -> dict | None:
    """Box plot per configuration: median, quartiles, 1.5 IQR whiskers, every trial a point."""
    entries = [e for e in model.entries_in(facet) if _finite(e.values.get(metric, np.empty(0))).size]
    if not entries:
        return None
    entries.sort(key=lambda e: _order_key(model, e))
    unit, direction = model.meta.get(metric, ("", ""))
    lay = model.layout
    categories = list(dict.fromkeys(e.category for e in entries))
    by_colour: dict[str, list[Entry]] = {}
    for e in entries:
        by_colour.setdefault(e.colour_value, []).append(e)
    colour_order = lay.colour.values if lay.colour else [""]
    traces = []
    for cv in colour_order:
        group = by_colour.get(cv)
        if not group:
            continue
        xs: list[str] = []
        ys: list[float] = []
        for e in group:
            v = _finite(e.values[metric])
            xs.extend([esc(e.category)] * v.size)
            ys.extend(_round(v))
        colour = group[0].colour
        name = cv if lay.colour else "all trials"
        traces.append({
            "type": "box", "name": esc(name), "x": xs, "y": ys,
            "boxpoints": "all", "jitter": 0.35, "pointpos": 0, "whiskerwidth": 0.6,
            "marker": {"color": colour, "size": 4, "opacity": 0.75, "line": {"width": 0}},
            "line": {"color": colour, "width": 1.5}, "fillcolor": rgba(colour, 0.18),
            "offsetgroup": esc(cv), "legendgroup": esc(cv),
            "hovertemplate": f"%{{x}}<br>%{{y:.4g}} {esc(unit)}<extra>{esc(name)}</extra>",
        })
    x_title = " / ".join(a.title for a in lay.box_axes) if lay.box_axes else "configuration"
    layout = base_layout(metric_title(metric), x_title, metric_axis_title(metric, unit),
                         lay.colour.title if lay.colour else "")
    layout["boxmode"] = "group"
    layout["boxgap"] = 0.25
    layout["xaxis"].update({"type": "category", "categoryorder": "array",
                            "categoryarray": [esc(c) for c in categories]})
    if len(categories) > 8:
        layout["xaxis"]["tickangle"] = -40
    if len(traces) <= 1 and not lay.colour:
        layout["showlegend"] = False
        layout["margin"]["t"] = 48
    if metric in RTT_METRICS:
        for d in _full_buffer_delays(entries):
            layout.setdefault("shapes", []).append({
                "type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y", "y0": d, "y1": d,
                "line": {"color": REFERENCE_COLOUR, "width": 1, "dash": "dot"}})
            layout.setdefault("annotations", []).append({
                "text": f"full buffer {d:.3g} ms", "xref": "paper", "x": 0, "xanchor": "left", "y": d, "yref": "y",
                "yanchor": "bottom", "showarrow": False, "font": {"size": 10, "color": REFERENCE_COLOUR}})
    return fit_legend({"data": traces, "layout": layout})


# ------------------------------------------------------------- efficiency

#: What a configuration delivered, per kind of workload, for the efficiency chart (the first one measured).
EFFICIENCY_OUTPUT = ("throughput.rx_mbps", "rr.transactions_per_s", "http.requests_per_s", "ab.requests_per_s")
CPU = "cpu.util_pct"


def efficiency_output(model: ReportModel) -> str | None:
    """The delivered-work metric the efficiency chart plots against CPU, when the run measured CPU."""
    if CPU not in model.metrics:
        return None
    return next((m for m in EFFICIENCY_OUTPUT if m in model.metrics), None)


def efficiency_figure(model: ReportModel, output: str, facet: str, summ: dict[str, dict[int, Summary]]
                      ) -> dict | None:
    """What each configuration delivered against the CPU it cost (netperf's question, as a picture): one point
    per configuration at the medians, bars from the first to the third quartile both ways. Up and to the left
    is cheaper; the dotted lines through the origin are constant cost per unit delivered (service demand)."""
    x_s, y_s = summ.get(CPU, {}), summ.get(output, {})
    entries = [e for e in model.entries_in(facet) if e.index in x_s and e.index in y_s]
    if not entries:
        return None
    entries.sort(key=lambda e: _order_key(model, e))
    lay = model.layout
    y_unit = model.meta.get(output, ("", ""))[0]
    x_unit = model.meta.get(CPU, ("%", ""))[0]
    by_colour: dict[str, list[Entry]] = {}
    for e in entries:
        by_colour.setdefault(e.colour_value, []).append(e)
    traces = []
    for cv in (lay.colour.values if lay.colour else [""]):
        group = by_colour.get(cv)
        if not group:
            continue
        xs = [x_s[e.index] for e in group]
        ys = [y_s[e.index] for e in group]
        name = cv if lay.colour else "configurations"
        traces.append({
            "type": "scatter", "mode": "markers", "name": esc(name), "legendgroup": esc(cv),
            "x": [round(x.median, 4) for x in xs], "y": [round(y.median, 6) for y in ys],
            "error_x": {"type": "data", "symmetric": False, "array": [round(x.q3 - x.median, 4) for x in xs],
                        "arrayminus": [round(x.median - x.q1, 4) for x in xs], "thickness": 1, "width": 0},
            "error_y": {"type": "data", "symmetric": False, "array": [round(y.q3 - y.median, 6) for y in ys],
                        "arrayminus": [round(y.median - y.q1, 6) for y in ys], "thickness": 1, "width": 0},
            "marker": {"color": group[0].colour, "size": 9, "opacity": 0.85},
            "text": [esc(e.label_text) for e in group],
            "hovertemplate": (f"%{{text}}<br>%{{y:.4g}} {esc(y_unit)} for %{{x:.3g}} {esc(x_unit)} CPU"
                              f"<extra>{esc(name)}</extra>"),
        })
    layout = base_layout(f"{metric_title(output)} against CPU", metric_axis_title(CPU, x_unit),
                         metric_axis_title(output, y_unit), lay.colour.title if lay.colour else "")
    x_max = max(x_s[e.index].q3 for e in entries) * 1.1 or 1.0
    y_max = max(y_s[e.index].q3 for e in entries) * 1.1 or 1.0
    layout["xaxis"].update({"range": [0, x_max], "rangemode": "tozero"})
    layout["yaxis"].update({"range": [0, y_max], "rangemode": "tozero"})
    # Iso-cost lines: the configurations' own cheapest, middle and dearest output per CPU, through the origin.
    ratios = sorted(y_s[e.index].median / x_s[e.index].median for e in entries if x_s[e.index].median > 0)
    for r in sorted({ratios[0], ratios[len(ratios) // 2], ratios[-1]}) if ratios else []:
        x_end = min(x_max, y_max / r) if r > 0 else x_max
        layout.setdefault("shapes", []).append({
            "type": "line", "xref": "x", "yref": "y", "x0": 0, "y0": 0, "x1": x_end, "y1": r * x_end,
            "line": {"color": REFERENCE_COLOUR, "width": 1, "dash": "dot"}, "layer": "below"})
    if len(traces) <= 1 and not lay.colour:
        layout["showlegend"] = False
    return fit_legend({"data": traces, "layout": layout})


# ------------------------------------------------------------- sweep


def _theory_lines(model: ReportModel, metric: str, lines: dict[str, list[Entry]]) -> list[dict]:
    """The theoretical curve where one is known: dense where the closed form is
    recognised (UDP loss 1 - 1/ratio, goodput min(ratio, 1) x bottleneck), else
    the expected value of each configuration joined by a line."""
    sweep = model.layout.sweep
    curves: dict[tuple, tuple[list[float], list[float], str]] = {}
    for entries in lines.values():
        pts = [(sweep.numbers[e.axis[sweep.name]], float(e.expected[metric])) for e in entries
               if isinstance(e.expected.get(metric), (int, float))]
        if not pts:
            continue
        pts.sort()
        xs = [p[0] for p in pts]
        ys = [p[1] for p in pts]
        name = "theory"
        if sweep.name == "ratio" and len(xs) >= 1:
            kink = {1.0} if min(xs) < 1 < max(xs) else set()  # where saturation starts
            grid = sorted(set(np.linspace(min(xs), max(xs), 120).tolist()) | kink)
            if metric == "udp.loss_ratio" and all(abs(y - max(0.0, 1 - 1 / x)) < 1e-6 for x, y in pts):
                xs, ys = grid, [max(0.0, 1 - 1 / x) for x in grid]
                name = "theory: 1 − 1/ratio"
            elif metric == "rtt.p50_ms" and 1.0 in kink:
                # base below saturation, base + buffer/rate above: drawn as the step it is
                base, full = min(ys), max(ys) - min(ys)
                if all(abs(y - (base + (full if x > 1 else 0.0))) < 1e-6 for x, y in pts):
                    xs = [x for x in grid if x <= 1] + [x for x in grid if x >= 1]
                    ys = [base] * sum(x <= 1 for x in grid) + [base + full] * sum(x >= 1 for x in grid)
                    queue = f"buffer / rate = {full:.3g} ms above ratio 1"
                    name = f"theory: {base:.3g} ms + {queue}" if base else f"theory: {queue}"
            elif metric == "throughput.rx_mbps":
                bps = {e.params.get("bottleneck_bps") for e in entries}
                if len(bps) == 1 and isinstance(next(iter(bps)), (int, float)):
                    b = float(next(iter(bps))) / 1e6
                    if all(abs(y - min(x, 1.0) * b) < 1e-6 * max(b, 1) for x, y in pts):
                        xs, ys = grid, [min(x, 1.0) * b for x in grid]
                        name = f"theory: min(ratio, 1) × {b:g} Mbit/s"
        key = tuple(round(v, 9) for v in xs + ys)
        curves.setdefault(key, (xs, ys, name))
    traces = []
    named: set[str] = set()
    for xs, ys, name in curves.values():
        traces.append({
            "type": "scatter", "mode": "lines", "x": _round(np.array(xs), 6), "y": _round(np.array(ys), 6),
            "name": esc(name), "legendgroup": "theory", "showlegend": name not in named,
            "line": {"color": THEORY_COLOUR, "width": 1.5, "dash": "dash"},
            "hovertemplate": f"%{{x:.3g}}: %{{y:.4g}}<extra>{esc(name)}</extra>",
        })
        named.add(name)
    return traces


def sweep_figure(model: ReportModel, metric: str, facet: str, summ: dict[int, Summary]) -> dict | None:
    """Metric against the swept parameter: trials as points, the median per
    configuration as a line, its 95% CI as a band, the theory dashed."""
    sweep = model.layout.sweep
    if sweep is None:
        return None
    entries = [e for e in model.entries_in(facet) if e.index in summ]
    if len({e.axis[sweep.name] for e in entries}) < 2:
        return None
    unit, direction = model.meta.get(metric, ("", ""))
    lines: dict[str, list[Entry]] = {}
    for e in sorted(entries, key=lambda e: _order_key(model, e)):
        lines.setdefault(e.line, []).append(e)
    traces: list[dict] = []
    for line_name, group in lines.items():
        group.sort(key=lambda e: sweep.numbers[e.axis[sweep.name]])
        colour = group[0].colour
        dash = group[0].dash
        xs = [sweep.numbers[e.axis[sweep.name]] for e in group]
        ss = [summ[e.index] for e in group]
        legend = esc(line_name if line_name != "all" else "median")
        # The band joins neighbouring configurations that both have an interval; a
        # configuration without one (too few trials) breaks it rather than being bridged.
        segments: list[list[tuple[float, tuple[float, float]]]] = [[]]
        for x, s in zip(xs, ss):
            if s.ci is None:
                segments.append([])
            else:
                segments[-1].append((x, s.ci))
        lone_x, lone_lo, lone_hi = [], [], []
        for seg in segments:
            if len(seg) == 1:
                lone_x.append(seg[0][0])
                lone_lo.append(seg[0][1][0])
                lone_hi.append(seg[0][1][1])
            if len(seg) < 2:
                continue
            bx = [x for x, _ in seg]
            traces.append({
                "type": "scatter", "mode": "lines", "x": bx + bx[::-1],
                "y": _round(np.array([ci[1] for _, ci in seg] + [ci[0] for _, ci in seg][::-1])),
                "fill": "toself", "fillcolor": rgba(colour, 0.16), "line": {"width": 0, "color": rgba(colour, 0)},
                "hoverinfo": "skip", "showlegend": False, "legendgroup": legend, "name": legend,
            })
        if lone_x:  # an interval with no neighbour to make a band with: an error bar
            traces.append({
                "type": "scatter", "mode": "markers", "x": lone_x, "y": _round(np.array(lone_lo)),
                "marker": {"size": 0.1, "color": rgba(colour, 0)}, "showlegend": False, "legendgroup": legend,
                "name": legend, "hoverinfo": "skip",
                "error_y": {"type": "data", "symmetric": False, "array": _round(np.array(lone_hi) - np.array(lone_lo)),
                            "arrayminus": [0] * len(lone_x), "color": rgba(colour, 0.6), "thickness": 6, "width": 0},
            })
        # Trials as dots only where there is no interval to show the spread (the box
        # plots above show every trial anyway); keeps a 200-configuration page small.
        px, py = [], []
        for x, e, s in zip(xs, group, ss):
            if s.ci is None:
                v = _finite(e.values[metric])
                px.extend([x] * v.size)
                py.extend(_round(v))
        if px:
            traces.append({
                "type": "scatter", "mode": "markers", "x": px, "y": py, "name": legend, "legendgroup": legend,
                "showlegend": False, "marker": {"color": colour, "size": 4, "opacity": 0.45},
                "hovertemplate": f"%{{x:.3g}}: %{{y:.4g}} {esc(unit)}<extra>trial, {legend}</extra>",
            })
        text = []
        for s in ss:
            ci = (f"95% CI {fmt_num(s.ci[0])} – {fmt_num(s.ci[1])}" if s.ci is not None
                  else "no 95% CI (fewer than 6 trials)")
            text.append(f"median {fmt_num(s.median)} {esc(unit)}<br>{ci}<br>n = {s.n}")
        traces.append({
            "type": "scatter", "mode": "lines+markers", "x": xs, "y": _round(np.array([s.median for s in ss])),
            "name": legend, "legendgroup": legend, "text": text,
            "line": {"color": colour, "width": 2, "dash": dash}, "marker": {"color": colour, "size": 7},
            "hovertemplate": f"{esc(sweep.name)} = %{{x:.3g}}<br>%{{text}}<extra>{legend}</extra>",
        })
    traces.extend(_theory_lines(model, metric, lines))
    layout = base_layout(metric_title(metric), sweep.title, metric_axis_title(metric, unit),
                         ", ".join(a.name for a in model.layout.line_axes))
    has_theory = any(isinstance(e.expected.get(metric), (int, float)) for e in entries)
    if metric in RTT_METRICS and not has_theory:  # where the metric has its own theory, that is drawn instead
        xmin, xmax = min(sweep.numbers.values()), max(sweep.numbers.values())
        for i, d in enumerate(_full_buffer_delays(entries)):
            traces.append({
                "type": "scatter", "mode": "lines", "x": [xmin, xmax], "y": [d, d],
                "name": f"full buffer: {d:.3g} ms (buffer / rate)", "legendgroup": "fullbuffer",
                "showlegend": i == 0, "line": {"color": REFERENCE_COLOUR, "width": 1, "dash": "dot"},
                "hovertemplate": f"full buffer: {d:.3g} ms<extra></extra>",
            })
    return fit_legend({"data": traces, "layout": layout})


# ------------------------------------------------------------- CDF

_CDF_PROBS = np.unique(np.concatenate([np.linspace(0, 0.95, 96), np.linspace(0.95, 0.99, 9),
                                       [0.995, 0.998, 0.999, 0.9995, 0.9999, 1.0]]))


def cdf_figure(model: ReportModel, facet: str, pooled: dict[int, np.ndarray],
               what: str = "ping round-trip time") -> dict | None:
    """A latency distribution (ms) per configuration, pooled over the samples of its ok trials."""
    entries = [e for e in model.entries_in(facet) if e.index in pooled]
    if not entries:
        return None
    entries.sort(key=lambda e: _order_key(model, e))
    sweep = model.layout.sweep
    traces = []
    for e in entries:
        v = pooled[e.index]
        if v.size <= _CDF_PROBS.size:
            x = np.sort(v)
            y = np.arange(1, v.size + 1) / v.size
        else:
            x = np.quantile(v, _CDF_PROBS)
            y = _CDF_PROBS
        colour = e.colour
        if sweep is not None and sweep.name in e.axis and len(sweep.values) > 1:
            pos = sweep.values.index(e.axis[sweep.name]) / (len(sweep.values) - 1)
            colour = shade(e.colour, 0.5 * (1 - pos))  # light at the low end of the sweep, full at the top
        name = esc(e.short_label)
        traces.append({
            "type": "scatter", "mode": "lines", "x": _round(x), "y": np.round(y, 5).tolist(), "name": name,
            "line": {"color": colour, "width": 1.8, "dash": e.dash},
            "hovertemplate": f"%{{x:.3g}} ms: %{{y:.2%}} of samples<extra>{name} (n = {v.size})</extra>",
        })
    layout = base_layout(f"Distribution of the {what} per configuration (all samples of its ok trials)",
                         f"{what} (ms)", "fraction of samples ≤ x", "configuration", height=420)
    layout["yaxis"].update({"range": [0, 1.02], "tickformat": ".0%"})
    layout["legend"].update({"orientation": "v", "x": 1.02, "y": 1, "yanchor": "top"})
    layout["margin"].update({"r": 10, "t": 60})
    layout["updatemenus"] = [{
        "type": "buttons", "direction": "right", "x": 1, "xanchor": "right", "y": 1.12, "yanchor": "bottom",
        "showactive": True, "pad": {"r": 0, "t": 0}, "font": {"size": 11},
        "buttons": [{"label": "linear x", "method": "relayout", "args": [{"xaxis.type": "linear"}]},
                    {"label": "log x", "method": "relayout", "args": [{"xaxis.type": "log"}]}],
    }]
    return {"data": traces, "layout": layout}


# ------------------------------------------------------------- time series


def series_layout(rows: list[dict[str, Any]]) -> dict:
    """Layout skeleton for the per-trial time-series chart; the page fills the traces."""
    layout = base_layout("Time series of the selected trial", "time since trial start (s)", "", "series",
                         height=max(300, 230 * len(rows) + 80))
    layout["legend"].update({"orientation": "v", "x": 1.01, "y": 1, "yanchor": "top"})
    layout["margin"]["t"] = 48
    layout["hovermode"] = "x unified" if len(rows) <= 1 else "closest"
    return layout
