"""The comparison table of the HTML report: medians, relative change with its CI,
p-value and verdict per configuration and metric, regressions first.

Three sources, in this order:

1. a comparison computed elsewhere (``vnetbench compare``), passed in as
   JSON-ready data (see :func:`from_given`);
2. several runs: the first is the reference, each other run is compared with
   it configuration by configuration (matched by key, never by position);
3. one run whose labels have a reference value (``env=bare``, or any label
   with the value ``baseline``/``reference``): every other value of that label
   is compared with the reference, the other labels held equal.

Sources 2 and 3 are computed by :mod:`vnetbench.analysis`, the code behind
``vnetbench compare`` (with ``--all-metrics``), so a verdict on the page is the
verdict the command line and a CI gate give; nothing is computed here beyond
bookkeeping.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Any, Iterable

from vnetbench.metrics import METRICS
from vnetbench.report.html_model import ReportModel, fmt_num, fmt_value

VERDICT_RANK = {"regressed": 0, "improved": 1, "inconclusive": 2, "unchanged": 3}
VERDICT_ICON = {"regressed": "▼", "improved": "▲", "inconclusive": "?", "unchanged": "="}
#: Label values that mark a reference configuration within one run, per label ("*" = any label).
REFERENCE_VALUES = {"env": ("bare",), "environment": ("bare",), "*": ("baseline", "reference")}


@dataclass
class Row:
    pair: str  # what is compared with what, e.g. "run a1b2c3d4 → run e5f6a7b8"
    config: str  # labels of the configuration
    metric: str
    unit: str
    direction: str
    median_a: float | None
    median_b: float | None
    rel_change: float | None
    ci: tuple[float, float] | None
    p_value: float | None
    p_adjusted: float | None
    cliffs_delta: float | None
    n_a: int | None
    n_b: int | None
    verdict: str
    reason: str


@dataclass
class ComparisonData:
    title: str
    source: str  # one sentence: where the comparison comes from
    rows: list[Row]
    pairs: list[str]
    notes: list[str] = field(default_factory=list)  # caveats (too few trials, runs not completed, ...)
    differences: list[dict[str, Any]] = field(default_factory=list)  # {what, name, a, b}: what differs A vs B
    one_sided: list[str] = field(default_factory=list)  # configurations present on one side only


def _label_text(labels: dict[str, Any], skip: Iterable[str] = ()) -> str:
    skip = set(skip)
    parts = [f"{k}={fmt_value(v)}" for k, v in labels.items() if k not in skip]
    return ", ".join(parts) or "(single configuration)"


def _meta(model: ReportModel, metric: str) -> tuple[str, str]:
    if metric in model.meta:
        return model.meta[metric]
    info = METRICS.get(metric)
    return (info.unit, info.direction) if info else ("", "higher")


def reference_axis(model: ReportModel) -> tuple[str, str] | None:
    """(label, reference value) for a within-run comparison, if the labels have one."""
    for axis in model.varying_axes:
        if axis.numeric or axis.name == "run":
            continue
        for ref in REFERENCE_VALUES.get(axis.name.lower(), ()) + REFERENCE_VALUES["*"]:
            if ref in axis.values:
                return axis.name, ref
    return None


def automatic(model: ReportModel, store) -> dict | None:
    """The comparison a report shows unless it is given one, computed by :mod:`vnetbench.analysis` exactly as
    ``vnetbench compare REF RUN --all-metrics`` (each further run against the first) or ``vnetbench compare RUN
    --by LABEL --ref VALUE --all-metrics`` (a label with a reference value), so the page and the command line
    never disagree on a verdict."""
    from vnetbench import analysis

    if len(model.runs) >= 2:
        ref = model.runs[0]
        reports = [analysis.compare_runs(store, ref.id, other.id, all_metrics=True) for other in model.runs[1:]]
        return {"title": "Comparison with the reference run", "pairs": [r.to_dict() for r in reports],
                "source": (f"Reference (A) is run {ref.short}; each other run (B) is compared with it, configuration "
                           f"by configuration (matched by configuration key), as `vnetbench compare {ref.short} "
                           f"RUN --all-metrics` does. Mann-Whitney U, Holm-adjusted across the metrics of a "
                           f"configuration; relative change of the medians with a bootstrap 95% CI.")}
    found = reference_axis(model)
    if found is None:
        return None
    name, ref = found
    run = model.runs[0]
    data = analysis.compare_within(store, run.id, name, ref, all_metrics=True).to_dict()
    data["title"] = f"Within the run: each {name} against {name}={ref}"
    data["source"] = (f"A is the configuration with {name}={ref}, B the same configuration (all other labels equal) "
                      f"with another {name}, as `vnetbench compare {run.short} --by {name} --ref {ref} "
                      f"--all-metrics` does. Mann-Whitney U, Holm-adjusted across the metrics of a configuration; "
                      f"relative change of the medians with a bootstrap 95% CI.")
    return data


def _num(d: dict, *keys: str) -> float | None:
    for k in keys:
        v = d.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            return float(v)
    return None


def _row_from_dict(d: dict, pair: str, config: str, model: ReportModel | None) -> Row:
    metric = str(d.get("metric", ""))
    unit = d.get("unit")
    direction = d.get("direction")
    if (unit is None or direction is None) and model is not None:
        mu, md = _meta(model, metric)
        unit = unit if unit is not None else mu
        direction = direction if direction is not None else md
    ci = d.get("rel_change_ci", d.get("ci"))
    ci_t = (float(ci[0]), float(ci[1])) if isinstance(ci, (list, tuple)) and len(ci) == 2 and all(
        isinstance(x, (int, float)) for x in ci) else None
    n_a, n_b = d.get("n_a"), d.get("n_b")
    return Row(
        pair=str(d.get("pair", pair)), config=str(d.get("config", config)), metric=metric, unit=str(unit or ""),
        direction=str(direction or ""), median_a=_num(d, "median_a"), median_b=_num(d, "median_b"),
        rel_change=_num(d, "rel_change", "change"), ci=ci_t, p_value=_num(d, "p_value", "p"),
        p_adjusted=_num(d, "p_adjusted", "p_holm"), cliffs_delta=_num(d, "cliffs_delta", "delta"),
        n_a=int(n_a) if isinstance(n_a, int) else None, n_b=int(n_b) if isinstance(n_b, int) else None,
        verdict=str(d.get("verdict", "inconclusive")).lower(), reason=str(d.get("reason", "")))


def from_given(data: dict | list, model: ReportModel | None = None) -> ComparisonData:
    """Normalise a comparison computed elsewhere.

    Accepted shapes (other keys are ignored):

    * ``ComparisonReport.to_dict()`` of :mod:`vnetbench.analysis`:
      ``{"title"?, "a"?, "b"?, "notes"?, "differences"?, "only_a"?, "only_b"?,
      "configurations": [{"pair"?, "config" | "labels", "results":
      [Comparison.to_dict() + {"unit"}, ...]}, ...]}``;
    * ``{"pairs": [<the above>, ...]}`` for several comparisons at once;
    * ``{"rows": [{"config" | "labels", "metric", "median_a", "median_b",
      "rel_change", "rel_change_ci", "p_value", "p_adjusted", "verdict",
      "reason", ...}, ...]}`` (flat rows), or such a list by itself.
    """
    blocks = data.get("pairs") if isinstance(data, dict) and isinstance(data.get("pairs"), list) else [data]
    rows: list[Row] = []
    order: list[str] = []
    notes: list[str] = []
    differences: list[dict[str, Any]] = []
    one_sided: list[str] = []
    title = data.get("title") if isinstance(data, dict) else None
    for block in blocks:
        if isinstance(block, list):
            block = {"rows": block}
        a, b = block.get("a"), block.get("b")
        pair = str(block.get("pair") or (f"{a} → {b}" if a is not None and b is not None else "A → B"))
        for cfg in block.get("configurations", []) or []:
            config = str(cfg.get("config") or _label_text(cfg.get("labels") or {}))
            cfg_pair = str(cfg.get("pair") or pair)
            for r in cfg.get("results", cfg.get("metrics", [])) or []:
                rows.append(_row_from_dict(r, cfg_pair, config, model))
            if cfg.get("note"):
                notes.append(f"{config}: {cfg['note']}")
        for r in block.get("rows", []) or []:
            config = r.get("config") or _label_text(r.get("labels") or {})
            rows.append(_row_from_dict(r, pair, str(config), model))
        notes.extend(str(n) for n in block.get("notes") or [])
        differences.extend(d for d in block.get("differences") or [] if isinstance(d, dict))
        for side, key in (("A", "only_a"), ("B", "only_b")):
            for c in block.get(key) or []:
                if isinstance(c, dict):
                    one_sided.append(f"only in {side}: {c.get('config') or _label_text(c.get('labels') or {})}")
    for r in rows:
        if r.pair not in order:
            order.append(r.pair)
    source = data.get("source") if isinstance(data, dict) else None
    return ComparisonData(title=str(title or "Comparison"),
                          source=str(source or "Computed by `vnetbench compare` and passed to the report."), rows=rows,
                          pairs=order, notes=notes, differences=differences, one_sided=one_sided)


def build(model: ReportModel, given: dict | list | None, store=None) -> ComparisonData | None:
    if given is None and store is not None:
        given = automatic(model, store)
    return None if given is None else from_given(given, model)


# ------------------------------------------------------------------ HTML


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:+.1f}%"


def _p(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x:.2g}" if x >= 0.001 else f"{x:.1e}"


def _sort_num(x: float | None) -> str:
    return "" if x is None else f"{float(x):.6g}"


def sorted_rows(rows: list[Row]) -> list[Row]:
    """Regressions first, then improvements, inconclusive, unchanged; larger changes first."""
    return sorted(rows, key=lambda r: (VERDICT_RANK.get(r.verdict, 9),
                                       -abs(r.rel_change) if r.rel_change is not None else 0.0))


def counts(rows: list[Row]) -> dict[str, int]:
    out = {v: 0 for v in VERDICT_RANK}
    for r in rows:
        out[r.verdict] = out.get(r.verdict, 0) + 1
    return out


def verdict_badge(verdict: str, count: int | None = None) -> str:
    v = verdict if verdict in VERDICT_RANK else "inconclusive"
    text = html.escape(verdict)
    if count is not None:
        text = f"{count} {text}"
    return f'<span class="verdict v-{v}"><span aria-hidden="true">{VERDICT_ICON[v]}</span> {text}</span>'


COLUMNS = [
    # (header, sort type, title)
    ("Verdict", "num", "regressed, improved, inconclusive, unchanged"),
    ("Compared", "text", "A → B"),
    ("Configuration", "text", "labels of the configuration"),
    ("Metric", "text", "metric (unit); which way is better"),
    ("Median A", "num", "median of the reference (A)"),
    ("Median B", "num", "median of B"),
    ("Change", "num", "relative change of the medians, (B − A) / |A|, with its bootstrap 95% CI"),
    ("p (Holm)", "num", "two-sided Mann-Whitney U p-value, Holm-adjusted across the metrics of a configuration"),
    ("Cliff's δ", "num", "P(B > A) − P(B < A)"),
    ("n A / B", "num", "trials on each side"),
    ("Reason", "text", "why this verdict"),
]


def table_html(data: ComparisonData, max_rows: int = 5000) -> str:
    rows = sorted_rows(data.rows)
    shown = rows[:max_rows]
    c = counts(rows)
    e = html.escape
    out = [f'<p class="note">{e(data.source)}</p>',
           '<p class="verdict-counts">' + " ".join(verdict_badge(v, c[v]) for v in VERDICT_RANK) + "</p>"]
    if data.notes:
        out.append('<ul class="note warn">' + "".join(f"<li>{e(n)}</li>" for n in data.notes) + "</ul>")
    if data.one_sided:
        items = "".join(f"<li>{e(x)}</li>" for x in data.one_sided[:50])
        more = f"<li>… and {len(data.one_sided) - 50} more</li>" if len(data.one_sided) > 50 else ""
        out.append(f'<details><summary>{len(data.one_sided)} configuration(s) could not be matched</summary>'
                   f'<ul class="note">{items}{more}</ul></details>')
    if data.differences:
        drows = "".join(f"<tr><td>{e(str(d.get('what', '')))}</td><td><code>{e(str(d.get('name', '')))}</code></td>"
                        f"<td>{e(str(d.get('a', '')))}</td><td>{e(str(d.get('b', '')))}</td></tr>"
                        for d in data.differences)
        out.append(f"<details><summary>What differs between A and B ({len(data.differences)})</summary>"
                   '<div class="table-wrap"><table class="data"><thead><tr><th scope="col">What</th>'
                   '<th scope="col">Setting</th><th scope="col">A</th><th scope="col">B</th></tr></thead>'
                   f"<tbody>{drows}</tbody></table></div></details>")
    if len(rows) > max_rows:
        out.append(f'<p class="note warn">Showing the first {max_rows} of {len(rows)} rows (regressions first).</p>')
    # Controls: filter text, verdict toggles, pair selector.
    controls = ['<div class="cmp-controls no-print" role="group" aria-label="Filter the comparison table">',
                '<label>Filter <input type="search" id="cmp-filter" '
                'placeholder="metric or label, e.g. rtt or proto=udp" '
                'autocomplete="off"></label>']
    for v in VERDICT_RANK:
        controls.append(f'<label class="chk"><input type="checkbox" class="cmp-verdict" value="{v}" checked> '
                        f'{verdict_badge(v)}</label>')
    if len(data.pairs) > 1:
        opts = "".join(f'<option value="{e(p)}">{e(p)}</option>' for p in data.pairs)
        controls.append(f'<label>Compared <select id="cmp-pair"><option value="">all</option>{opts}</select></label>')
    controls.append('<span id="cmp-count" class="note" aria-live="polite"></span></div>')
    out.append("".join(controls))
    many = len(data.pairs) > 1
    if not many and data.pairs:
        out.insert(1, f'<p>Compared: <b>{e(data.pairs[0])}</b> (A → B).</p>')
    head = "".join(
        f'<th scope="col" data-type="{t}" title="{e(tip)}"><button type="button" class="sort">{e(h)}'
        f'<span class="arrow" aria-hidden="true"></span></button></th>'
        for h, t, tip in COLUMNS if many or h != "Compared")
    body = []
    for r in shown:
        better = {"higher": "↑ better", "lower": "↓ better"}.get(r.direction, "")
        ci = f'<br><span class="ci">{_pct(r.ci[0])} … {_pct(r.ci[1])}</span>' if r.ci else ""
        n = f"{r.n_a if r.n_a is not None else '—'} / {r.n_b if r.n_b is not None else '—'}"
        p_sort = _sort_num(r.p_adjusted if r.p_adjusted is not None else r.p_value)
        delta = "—" if r.cliffs_delta is None else f"{r.cliffs_delta:+.2f}"
        cells = [
            f'<td data-v="{VERDICT_RANK.get(r.verdict, 9)}">{verdict_badge(r.verdict)}</td>',
            f"<td>{e(r.pair)}</td>" if many else "",
            f'<td class="cfg">{e(r.config)}</td>',
            f'<td data-v="{e(r.metric)}"><code>{e(r.metric)}</code><br>'
            f'<span class="ci">{e(r.unit)} {better}</span></td>',
            f'<td class="num" data-v="{_sort_num(r.median_a)}">{fmt_num(r.median_a)}</td>',
            f'<td class="num" data-v="{_sort_num(r.median_b)}">{fmt_num(r.median_b)}</td>',
            f'<td class="num" data-v="{_sort_num(r.rel_change)}">{_pct(r.rel_change)}{ci}</td>',
            f'<td class="num" data-v="{p_sort}">{_p(r.p_adjusted)}<br><span class="ci">raw {_p(r.p_value)}</span></td>',
            f'<td class="num" data-v="{_sort_num(r.cliffs_delta)}">{delta}</td>',
            f'<td class="num" data-v="{(r.n_a or 0) + (r.n_b or 0)}">{n}</td>',
            f'<td class="reason">{e(r.reason)}</td>',
        ]
        body.append(f'<tr data-verdict="{e(r.verdict)}" data-pair="{e(r.pair)}">{"".join(cells)}</tr>')
    out.append('<div class="table-wrap tall"><table class="data cmp" id="cmp-table">'
               f'<caption class="sr-only">{e(data.title)}</caption>'
               f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>")
    if not rows:
        out.append('<p class="note">No metric was measured on both sides, so nothing could be compared.</p>')
    return "".join(out)
