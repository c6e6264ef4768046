"""The HTML report: one self-contained file that opens offline and prints.

``write_report(store, run_ids, path)`` reads the runs from the store and writes
one page with:

* **Headline** (first, right under the title): the run's key metric against
  the swept numeric parameter with its theory line, or its box plots per
  configuration when nothing numeric is swept; the same chart as in the
  sections below, drawn from the same data;
* **What ran**: scenario (name, description, file text), the lab drawn as SVG,
  the run fingerprint (kernel, CPU, tools, sysctls), the qdiscs as the kernel
  reported them, trials ok / failed / timed out with their reasons;
* **At a glance**: headline metrics per configuration (median and 95% CI);
* **Comparison** (between runs, against a reference label value, or as given):
  a sortable, filterable table with regressions first;
* **Distributions**: per metric, box plots per configuration with every trial
  as a point, grouped by the scenario's labels;
* **Sweep**: per metric against the swept numeric parameter, median and CI
  band, with the theoretical curve where one is known;
* **Latency CDFs** per configuration, and **time series** per trial with a
  trial selector.

Everything the page needs is inlined: plotly.js (Plotly's cartesian bundle,
pinned and verified, see :mod:`.plotly_bundle`; else the plotly Python
package's full one), a small script and a style sheet from ``report/assets``.
plotly.js and the chart data travel gzipped and base64-encoded
(:mod:`.html_payload`); the page script unpacks them and runs plotly.js as an
inline script. A Content Security Policy forbids every network request and any
script other than those two (by the hash of their text), so an
escaped-but-missed label still could not run. User text is escaped with
:func:`html.escape`; data for the script is JSON inside
``<script type="application/json">`` with ``<``, ``>`` and ``&`` escaped.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import math
import time
import tomllib
from pathlib import Path
from typing import Any

import numpy as np

import vnetbench
from vnetbench import metrics as metrics_mod
from vnetbench.metrics import METRICS, NOISE_MARKS
from vnetbench.output import check_target, write_text
from vnetbench.report import html_charts as charts
from vnetbench.report import html_compare as compare
from vnetbench.report import html_model as model_mod
from vnetbench.report import html_payload as payload
from vnetbench.report import html_topology as topology
from vnetbench.report import plotly_bundle
from vnetbench.report import sender
from vnetbench.report.html_model import Entry, ReportModel, fmt_num, fmt_value
from vnetbench.report.relative import software_guest_note
from vnetbench.report.terminal import endpoint_places
from vnetbench.runner.machine_load import describe as describe_machine_load, machine_note
from vnetbench.runner.fingerprint import run_notes
from vnetbench.scenario.load import workload_order
from vnetbench.units import utc_text

__all__ = ["write_report", "render_report"]

#: Headline metrics for the "at a glance" table, in order of preference.
HEADLINE = metrics_mod.HEADLINE
MAX_GLANCE_METRICS = 5
#: Tables longer than this start collapsed.
COLLAPSE_ROWS = 24
MAX_FAILURE_ROWS = 500
#: Left out when grouping configurations with the same applied settings (counters, per-run names).
VOLATILE_STATE_KEYS = {"drops", "packets", "overlimits", "requeues", "backlog", "bytes", "netns"}

e = html.escape


ASSETS = Path(__file__).resolve().parent / "assets"


def _asset(name: str) -> str:
    return (ASSETS / name).read_text(encoding="utf-8")


def _plotly_js() -> tuple[plotly_bundle.Bundle, str]:
    """The bundle, and its packed block for the page. Packed, its text never meets the HTML parser, so
    nothing in it can end the element early; the page script runs exactly this text, whose hash the
    Content Security Policy carries."""
    bundle = plotly_bundle.load()
    return bundle, json_for_script(payload.pack(bundle.js))


def json_for_script(data: Any) -> str:
    """JSON that is safe inside <script type="application/json">: no '<', '>' or '&' at all."""
    try:
        text = json.dumps(data, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    except ValueError:
        text = json.dumps(_finite_only(data), separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def _finite_only(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite_only(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite_only(v) for v in obj]
    return obj


def _csp_hash(script: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii") + "'"


def _when(ts: float | None) -> str:
    return utc_text(ts, missing="—")


def _duration(a: float | None, b: float | None) -> str:
    if not a or not b:
        return "—"
    s = max(0.0, b - a)
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"


# ------------------------------------------------------------------ pieces


def _table(headers: list[str], rows: list[list[str]], cls: str = "data", raw: bool = False, caption: str = "") -> str:
    """A table; cells are escaped unless raw (then the caller escaped them)."""
    cell = (lambda x: x) if raw else (lambda x: e(str(x)))
    head = "".join(f'<th scope="col">{e(h)}</th>' for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell(c)}</td>" for c in r) + "</tr>" for r in rows)
    cap = f"<caption>{e(caption)}</caption>" if caption else ""
    return (f'<div class="table-wrap"><table class="{cls}">{cap}<thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>")


def _collapsible(summary: str, body: str, n_rows: int, open_: bool | None = None) -> str:
    is_open = (n_rows <= COLLAPSE_ROWS) if open_ is None else open_
    return f'<details{" open" if is_open else ""}><summary>{summary}</summary>{body}</details>'


def _flatten(d: Any, prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    if isinstance(d, dict) and d:
        for k, v in d.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, dict) and v:
                out.extend(_flatten(v, key))
            else:
                out.append((key, v))
    elif prefix:
        out.append((prefix, d))
    return out


def _size(n: float) -> str:
    for factor, name in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if n >= factor:
            return f"{n / factor:.3g} {name}"
    return f"{n:g} B"


def _fmt_setting(key: str, v: Any) -> str:
    """HTML (escaped) for one fingerprint or lab-state value."""
    if v is None:
        return '<span class="muted">—</span>'
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (int, float)):
        if key.endswith("_bps"):
            return e(f"{topology.fmt_rate(v)}")
        if key.endswith("bytes") and v >= 1000:
            return e(f"{v:,.0f} B ({_size(v)})")
        return e(fmt_value(v))
    if isinstance(v, list):
        if all(isinstance(x, (str, int, float)) for x in v):
            return e(", ".join(fmt_value(x) for x in v))
        return f"<pre>{e(json.dumps(v, indent=1, default=str))}</pre>"
    text = str(v)
    if "\n" in text or len(text) > 160:
        return f"<pre>{e(text)}</pre>"
    return e(text)


def _run_probe_text(record: dict[str, Any]) -> str | None:
    try:
        raw = tomllib.loads(record.get("scenario_text") or "")
    except tomllib.TOMLDecodeError:
        return None
    probes = []
    for name, w in (raw.get("workload") or {}).items():
        if isinstance(w, dict) and w.get("tool") == "ping":
            bits = [f"ping probe '{name}'"]
            if "interval" in w:
                bits.append(f"every {w['interval']}")
            if "size" in w:
                bits.append(f"{w['size']} B payload")
            probes.append(" ".join(bits))
    return "; ".join(probes) or None


# ------------------------------------------------------------------ sections


def _what_ran(m: ReportModel) -> str:
    out = ['<section id="what-ran"><h2>What ran</h2>']
    # Overview of the runs.
    rows = []
    for r in m.runs:
        rec = r.record
        statuses = [t["status"] for t in r.trials]
        status = e(rec["status"]) + (f' <span class="muted">({e(rec["status_reason"])})</span>'
                                     if rec.get("status_reason") else "")
        rows.append([f"<code>{e(r.id)}</code>", e(rec["scenario_name"]), e(rec.get("scenario_source") or ""),
                     e(_when(rec.get("started"))), e(_duration(rec.get("started"), rec.get("ended"))), status,
                     str(len(r.configurations)),
                     f'{statuses.count("ok")} / {statuses.count("failed")} / {statuses.count("timeout")}',
                     e(str(rec.get("seed", "—")))])
    out.append(_table(["Run", "Scenario", "Source", "Started", "Took", "Status", "Configurations",
                       "Trials ok / failed / timed out", "Seed"], rows, raw=True))
    if len(m.runs) > 1:
        out.append(f'<p class="note">Run <code>{e(m.runs[0].short)}</code> is the reference (A) of the '
                   "comparisons; configurations are matched across runs by their key.</p>")
    # Scenario of each distinct scenario text.
    seen: dict[str, list[str]] = {}
    for r in m.runs:
        seen.setdefault(r.record.get("scenario_hash") or r.id, []).append(r.id)
    for h, ids in seen.items():
        r = next(x for x in m.runs if x.id == ids[0])
        rec = r.record
        which = "" if len(m.runs) == 1 else f' <span class="muted">(run{"s" if len(ids) > 1 else ""} ' + \
            ", ".join(f"<code>{e(x.short)}</code>" for x in m.runs if x.id in ids) + ")</span>"
        out.append(f'<h3>Scenario <q>{e(rec["scenario_name"])}</q>{which}</h3>')
        desc = _scenario_description(rec)
        if desc:
            out.append(f'<p class="lead">{e(desc)}</p>')
        if rec.get("overrides"):
            out.append("<p>Overrides: " + " ".join(f"<code>--set {e(str(o))}</code>" for o in rec["overrides"])
                       + "</p>")
        params = [c["params"] for c in r.configurations]
        declared = (rec.get("fingerprint") or {}).get("topology")
        if isinstance(declared, dict) and declared.get("graphs"):  # a matrix over the topology: each graph
            drawing = "".join(f'<figure class="graph"><figcaption>Graph {k}: '
                              + e("; ".join(", ".join(f"{a}={b}" for a, b in labels.items())
                                            for labels in graph.get("configurations", [])[:6]))
                              + "</figcaption>" + topology.graph_svg(graph) + "</figure>"
                              for k, graph in enumerate(declared["graphs"], start=1))
        elif isinstance(declared, dict):
            drawing = topology.graph_svg(declared)
        else:
            drawing = topology.svg(params, _run_probe_text(rec))
        out.append('<div class="topo">' + drawing + "</div>")
        out.append(_collapsible(f"Scenario file <code>{e(rec.get('scenario_source') or '')}</code>",
                                f'<pre class="code">{e(rec.get("scenario_text") or "")}</pre>', 0,
                                open_=len(m.runs) == 1 and (rec.get("scenario_text") or "").count("\n") < 60))
    # Matrix.
    axes = [a for a in m.axes.values() if a.name != model_mod.RUN_AXIS]
    if axes:
        out.append("<h3>Matrix</h3>")
        out.append(_table(["Label", "Values"], [[a.name + (f" ({a.unit})" if a.unit else ""), ", ".join(a.values)]
                                                 for a in axes]))
    for r in m.runs:
        fp = r.record.get("fingerprint") or {}
        for note in (software_guest_note(r.configurations), machine_note(fp), *run_notes(fp)):
            if note:
                out.append(f'<p class="note warn">{e(note)}</p>')
        out.append(_sender_shortfalls(m, r))
    out.append(_fingerprint(m))
    out.append(_hosts(m))
    out.append(_endpoints(m))
    out.append(_lab_state(m))
    out.append(_trials(m))
    out.append("</section>")
    return "".join(out)


def _sender_shortfalls(m: ReportModel, run: Any) -> str:
    """The UDP configurations whose sender sent less than offered (report/sender.py), as a note and a table."""
    entries = [x for x in m.entries if x.run_id == run.id]
    found = sender.shortfalls((x.labels, x.expected, x.values) for x in entries)
    text = sender.note(found, sender.udp_count(x.expected for x in entries))
    if not text:
        return ""
    keys = list(dict.fromkeys(k for s in found for k in s.labels))
    rows = [[str(s.labels.get(k, "")) for k in keys] + sender.row(s) for s in found]
    which = f" of run {run.short}" if len(m.runs) > 1 else ""
    return (f'<p class="note warn" id="sender-short-{e(run.short)}">{e(text)}</p>'
            + _collapsible(f"UDP sender short of the offered rate{e(which)} ({len(found)} configurations, "
                           "medians over trials)", _table(keys + sender.HEADERS, rows), len(rows)))


def _scenario_description(rec: dict[str, Any]) -> str:
    try:
        raw = tomllib.loads(rec.get("scenario_text") or "")
    except tomllib.TOMLDecodeError:
        return ""
    desc = raw.get("description")
    for o in rec.get("overrides") or []:
        if str(o).startswith("description="):
            desc = str(o).split("=", 1)[1]
    return str(desc) if desc else ""


def _fingerprint(m: ReportModel) -> str:
    def readable(fp: dict[str, Any]) -> dict[str, Any]:
        if "machine_load" in fp:  # what the machine did meanwhile, one line per session rather than raw numbers
            fp = {**fp, "machine_load": describe_machine_load(fp)}
        return fp

    # the endpoint -> node mapping has a table of its own (_endpoints): its node names are the run's own
    fps = [{k: v for k, v in readable(r.record.get("fingerprint") or {}).items() if k != "endpoints"} for r in m.runs]
    if len(m.runs) == 1:  # one run's hosts have a table of their own, a column per host (_hosts)
        fps = [{k: v for k, v in fp.items() if k != "hosts"} for fp in fps]
    flat = [dict(_flatten(fp)) for fp in fps]
    keys: list[str] = []
    for f in flat:
        for k in f:
            if k not in keys:
                keys.append(k)
    if not keys:
        return '<h3>Fingerprint</h3><p class="note">No fingerprint was recorded for this run.</p>'
    out = ["<h3>Fingerprint</h3>"]
    if len(m.runs) == 1:
        rows = [[f"<code>{e(k)}</code>", _fmt_setting(k, flat[0].get(k))] for k in keys]
        out.append(_collapsible("Machine, kernel, tools and settings of the run", _table(["Setting", "Value"], rows,
                                raw=True, cls="data kv"), len(rows), open_=True))
        return "".join(out)
    # the machine's load differs from run to run by nature: shown side by side, not counted as a difference
    differ = [k for k in keys if not k.startswith("machine_load")
              and len({json.dumps(f.get(k), sort_keys=True, default=str) for f in flat}) > 1]
    if differ:
        out.append(f'<p class="note warn">{len(differ)} setting{"s" if len(differ) > 1 else ""} differ between the '
                   "runs (marked ≠): " + ", ".join(f"<code>{e(k)}</code>" for k in differ[:12])
                   + (" …" if len(differ) > 12 else "") + "</p>")
    else:
        out.append('<p class="note">The runs have identical fingerprints.</p>')
    rows = []
    for k in differ + [k for k in keys if k not in differ]:
        mark = '<span class="diff-mark" title="differs between runs">≠</span> ' if k in differ else ""
        rows.append([f"{mark}<code>{e(k)}</code>"] + [_fmt_setting(k, f.get(k)) for f in flat])
    out.append(_collapsible("Machine, kernel, tools and settings, side by side",
                            _table(["Setting"] + [f"run {r.short}" for r in m.runs], rows, raw=True, cls="data kv"),
                            len(rows), open_=True))
    return "".join(out)


def _hosts(m: ReportModel) -> str:
    """Each `run --hosts` run's hosts as the run found them: a row per fact, a column per host, differences
    between the hosts marked (a host unlike the others is what explains a number unlike theirs)."""
    out = []
    for r in m.runs:
        hosts = (r.record.get("fingerprint") or {}).get("hosts") or {}
        if not hosts:
            continue
        names = list(hosts)
        facts = {n: {k: _host_fact(k, v) for k, v in hosts[n].items()} for n in names}
        keys: list[str] = []
        for n in names:
            keys.extend(k for k in facts[n] if k not in keys)
        rows = []
        for k in keys:
            values = [facts[n].get(k, "") for n in names]
            mark = ('<span class="diff-mark" title="differs between the hosts">≠</span> '
                    if len(set(values)) > 1 and k != "clock" else "")
            rows.append([f"{mark}{e(k)}"] + [e(v) for v in values])
        title = "Hosts" if len(m.runs) == 1 else f"Hosts of run {r.short}"
        out.append(f"<h3>{e(title)}</h3>")
        inventory = (r.record.get("fingerprint") or {}).get("inventory")
        if inventory:
            out.append(f'<p class="note">From the inventory <code>{e(str(inventory))}</code>; every host was '
                       "checked over SSH before anything started.</p>")
        out.append(_collapsible("Kernel, CPU, interface, offloads, tools and settings of each host",
                                _table(["Fact"] + names, rows, raw=True, cls="data kv"), len(rows), open_=True))
    return "".join(out)


def _endpoints(m: ReportModel) -> str:
    """Where each endpoint of each run ran: the endpoint -> node mapping, a row per environment and endpoint."""
    out = []
    for r in m.runs:
        rows = [list(row) for row in endpoint_places(r.record.get("fingerprint") or {})]
        if not rows:
            continue
        title = "Endpoints" if len(m.runs) == 1 else f"Endpoints of run {r.short}"
        out.append(f"<h3>{e(title)}</h3>")
        out.append(_collapsible("Where each endpoint ran: its node, addresses, interface and CPU",
                                _table(["Environment", "Endpoint", "Node", "Addresses", "Interface", "CPU"], rows),
                                len(rows)))
    return "".join(out)


def _host_fact(key: str, value: Any) -> str:
    if key == "clock" and isinstance(value, dict):
        if value.get("offset_ms") is None:
            return str(value.get("note") or "unknown")
        return f"{value['offset_ms']:+.1f} ms ± {value.get('uncertainty_ms', 0):.1f} to the controller"
    return str(value)


def _strip_volatile(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _strip_volatile(v) for k, v in obj.items() if k not in VOLATILE_STATE_KEYS}
    if isinstance(obj, list):
        return [_strip_volatile(v) for v in obj]
    return obj


def _state_html(state: Any) -> str:
    qdiscs = state.get("qdiscs") if isinstance(state, dict) else None
    if isinstance(qdiscs, list) and all(isinstance(q, dict) for q in qdiscs) and qdiscs:
        cols: list[str] = []
        for q in qdiscs:
            for k in q:
                if k not in cols:
                    cols.append(k)
        rows = [[_fmt_setting(c, q.get(c)) for c in cols] for q in qdiscs]
        rest = {k: v for k, v in state.items() if k != "qdiscs"}
        extra = _table(["Setting", "Value"], [[f"<code>{e(k)}</code>", _fmt_setting(k, v)]
                                              for k, v in _flatten(rest)], raw=True) if rest else ""
        return _table(cols, rows, raw=True) + extra
    flat = _flatten(state) if isinstance(state, dict) else [("state", state)]
    return _table(["Setting", "Value"], [[f"<code>{e(k)}</code>", _fmt_setting(k, v)] for k, v in flat], raw=True)


def _lab_state(m: ReportModel) -> str:
    out = ["<h3>Link conditions as applied</h3>"]
    groups: dict[str, tuple[Any, list[Entry]]] = {}
    missing = []
    for ent in m.entries:
        if ent.lab_state is None:
            missing.append(ent)
            continue
        key = json.dumps(_strip_volatile(ent.lab_state), sort_keys=True, default=str)
        groups.setdefault(key, (ent.lab_state, []))[1].append(ent)
    if not groups:
        out.append('<p class="note">The kernel\'s view of the qdiscs was not recorded for these configurations.</p>')
        return "".join(out)
    out.append('<p class="note">Read back from the kernel after configuring each configuration (counters such as '
               "drops are left out when grouping identical settings).</p>")
    for state, ents in groups.values():
        names = [x.label_text for x in ents]
        who = ", ".join(e(n) for n in names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
        if len(groups) == 1 and not missing:
            who = "every configuration"
        out.append(f'<div class="state"><p class="muted">{who}</p>{_state_html(state)}</div>')
    if missing:
        out.append(f'<p class="note">Not recorded for {len(missing)} configuration(s).</p>')
    return "".join(out)


def _trials(m: ReportModel) -> str:
    out = ["<h3>Trials</h3>"]
    rows = []
    failures = []
    for ent in m.entries:
        st = [t.status for t in ent.trials]
        ok, failed, timeout = st.count("ok"), st.count("failed"), st.count("timeout")
        bad = lambda k: f'<span class="bad">{k}</span>' if k else "0"  # noqa: E731
        rows.append([e(ent.label_text), str(ok), bad(failed), bad(timeout)]
                    + ([e(ent.stop_reason or "")] if any(x.stop_reason for x in m.entries) else []))
        for t in ent.trials:
            if t.status != "ok":
                failures.append((ent, t))
    total = sum(len(x.trials) for x in m.entries)
    n_bad = len(failures)
    summary = (f"{total} trials in {len(m.entries)} configurations: {total - n_bad} ok, "
               f"{sum(1 for _, t in failures if t.status == 'failed')} failed, "
               f"{sum(1 for _, t in failures if t.status == 'timeout')} timed out")
    out.append(f'<p>{e(summary)}.</p>')
    out.append(_collapsible("Trials per configuration",
                            _table(["Configuration", "ok", "failed", "timed out"]
                                   + (["Stopped because"] if any(x.stop_reason for x in m.entries) else []),
                                   rows, raw=True),
                            len(rows)))
    if failures:
        frows = [[e(ent.label_text), str(t.repetition), f'<span class="bad">{e(t.status)}</span>',
                  f'<span class="reason">{e(t.reason or "(no reason recorded)")}</span>']
                 for ent, t in failures[:MAX_FAILURE_ROWS]]
        more = (f'<p class="note">… and {len(failures) - MAX_FAILURE_ROWS} more.</p>'
                if len(failures) > MAX_FAILURE_ROWS else "")
        out.append(_collapsible(f'<span class="bad">Failed and timed-out trials ({len(failures)}), with reasons</span>',
                                _table(["Configuration", "Repetition", "Status", "Reason"], frows, raw=True) + more,
                                len(frows), open_=len(frows) <= COLLAPSE_ROWS))
    marked = [(ent, t) for ent in m.entries for t in ent.trials if t.marked]
    if marked:
        limits = ", ".join(f"{what} above {limit:g} % of a core" for _, limit, what in NOISE_MARKS)
        mrows = [[e(ent.label_text), str(t.repetition), e("; ".join(t.marked))] for ent, t in marked[:MAX_FAILURE_ROWS]]
        more = (f'<p class="note">… and {len(marked) - MAX_FAILURE_ROWS} more.</p>'
                if len(marked) > MAX_FAILURE_ROWS else "")
        out.append(f'<p class="note warn">{len(marked)} ok trial(s) ran while the machine was busy with other work '
                   f'({e(limits)}). They stay in the statistics; a difference that rests on them may be the '
                   'machine\'s, not the configurations\'.</p>')
        out.append(_collapsible(f"Marked trials ({len(marked)})", _table(["Configuration", "Repetition", "Why"],
                                                                        mrows, raw=True) + more,
                                len(mrows), open_=len(mrows) <= COLLAPSE_ROWS))
    return "".join(out)


def _glance(m: ReportModel, summ: dict[str, dict[int, Any]], cmp: compare.ComparisonData | None) -> str:
    out = ['<section id="glance"><h2>At a glance</h2>']
    ok = sum(1 for x in m.entries for t in x.trials if t.status == "ok")
    total = sum(len(x.trials) for x in m.entries)
    facts = [f"{len(m.entries)} configuration{'s' if len(m.entries) != 1 else ''}"
             + (f" over {len(m.runs)} runs" if len(m.runs) > 1 else ""),
             f"{ok} of {total} trials ok", f"{len(m.metrics)} metrics"]
    out.append(f'<p class="lead">{e(", ".join(facts))}.</p>')
    if cmp is not None:
        c = compare.counts(cmp.rows)
        out.append('<p><a href="#comparison">Comparison</a>: '
                   + " ".join(compare.verdict_badge(v, c[v]) for v in compare.VERDICT_RANK) + "</p>")
    metrics = (metrics_mod.in_order(HEADLINE, summ, _workload_order(m))[:MAX_GLANCE_METRICS]
               or m.metrics[:MAX_GLANCE_METRICS])
    if not metrics:
        out.append('<p class="note warn">No trial produced a metric: see the failed trials under '
                   '<a href="#what-ran">What ran</a>.</p></section>')
        return "".join(out)
    axes = m.varying_axes
    headers = [a.name for a in axes] + ["trials ok"] + [
        f"{x} ({charts.unit_label(m.meta.get(x, ('', ''))[0])})" for x in metrics]
    rows = []
    ents = sorted(m.entries, key=lambda x: charts._order_key(m, x))
    for ent in ents:
        ok_n = sum(1 for t in ent.trials if t.status == "ok")
        bad = len(ent.trials) - ok_n
        cells = [f'<span class="swatch" style="background:{ent.colour}" aria-hidden="true"></span>'
                 f"{e(ent.axis.get(a.name, '—'))}" if a is m.layout.colour else e(ent.axis.get(a.name, "—"))
                 for a in axes]
        cells.append(f"{ok_n}" + (f' <span class="bad">({bad} not ok)</span>' if bad else ""))
        for x in metrics:
            s = summ.get(x, {}).get(ent.index)
            if s is None:
                cells.append('<span class="muted">—</span>')
                continue
            ci = (f'<br><span class="ci">{fmt_num(s.ci[0])} … {fmt_num(s.ci[1])}</span>' if s.ci is not None
                  else "")
            flag = (f' <span class="unstable" title="coefficient of variation {100 * s.cv:.0f}% (≥ 10%)">'
                    f"unstable</span>" if s.unstable and s.cv is not None else "")
            cells.append(f'<span class="num">{fmt_num(s.median)}</span>{flag}{ci}')
        rows.append(cells)
    table = _table(headers or ["configuration"], rows, raw=True, cls="data glance")
    out.append(_collapsible("Median per configuration (95% CI of the median below it, where there are at least 6 "
                            "trials)", table, len(rows)))
    out.append("</section>")
    return "".join(out)


def _chart(chart_id: str, label: str, caption: str = "", element_id: str = "") -> str:
    """A chart container; the page script draws ``data.charts[chart_id]`` into it. Two containers may
    show the same chart (``element_id`` tells them apart) without its data being on the page twice."""
    cap = f"<figcaption>{caption}</figcaption>" if caption else ""
    return (f'<figure class="card"><div class="chart" id="chart-{e(element_id or chart_id)}" '
            f'data-chart="{e(chart_id)}" role="img" aria-label="{e(label)}"><p class="loading">Drawing chart…</p>'
            f"</div>{cap}</figure>")


def _metric_caption(m: ReportModel, metric: str) -> str:
    info = METRICS.get(metric)
    unit, direction = m.meta.get(metric, ("", ""))
    better = {"higher": "higher is better", "lower": "lower is better"}.get(direction, "")
    text = info.description if info else metric
    return f"<code>{e(metric)}</code> — {e(text)}" + (f"; {e(better)}." if better else ".")


def _facet_specs(m: ReportModel, build) -> dict[str, Any] | None:
    specs = {}
    for f in m.layout.facets:
        spec = build(f.id)
        if spec is not None:
            specs[f.id] = spec
    return {"facets": specs} if specs else None


def _distributions(m: ReportModel, data: dict[str, Any]) -> str:
    out = ['<section id="distributions"><h2>Distributions per configuration</h2>',
           '<p class="note">Box: median and quartiles; whiskers reach the furthest trial within 1.5 × IQR; every '
           "trial is a dot. Colour: "
           + (f"<b>{e(m.layout.colour.name)}</b>" if m.layout.colour else "one colour for all")
           + ", the same in every chart. Click a legend entry to hide it, double-click to show it alone.</p>",
           '<div class="grid">']
    n = 0
    for i, metric in enumerate(m.metrics):
        spec = _facet_specs(m, lambda f, metric=metric: charts.box_figure(m, metric, f))
        if spec is None:
            continue
        cid = f"box-{i}"
        data["charts"][cid] = spec
        out.append(_chart(cid, f"Box plot of {metric} per configuration", _metric_caption(m, metric)))
        n += 1
    out.append("</div></section>")
    return "".join(out) if n else ""


def _sweep(m: ReportModel, data: dict[str, Any], summ: dict[str, dict[int, Any]]) -> str:
    sweep = m.layout.sweep
    if sweep is None:
        return ""
    out = [f'<section id="sweep"><h2>Against {e(sweep.name)}</h2>',
           f'<p class="note">Each metric against <b>{e(sweep.title)}</b>: the line joins the medians of the '
           "configurations, the band is the 95% confidence interval of each median (exact, from order statistics), "
           "dots are the trials of configurations with fewer than 6 trials, where no interval exists (every trial "
           "is in the box plots above). Dashed black: the theoretical value where one is known (UDP loss 1 − 1/ratio above "
           "saturation, goodput capped by the bottleneck); dotted red: the delay of a full buffer (buffer / rate), "
           "which the RTT approaches when the queue is saturated.</p>", '<div class="grid">']
    n = 0
    for i, metric in enumerate(m.metrics):
        spec = _facet_specs(m, lambda f, metric=metric: charts.sweep_figure(m, metric, f, summ.get(metric, {})))
        if spec is None:
            continue
        cid = f"sweep-{i}"
        data["charts"][cid] = spec
        out.append(_chart(cid, f"{metric} against {sweep.name}", _metric_caption(m, metric)))
        n += 1
    out.append("</div></section>")
    return "".join(out) if n else ""


def _efficiency(m: ReportModel, data: dict[str, Any], summ: dict[str, dict[int, Any]]) -> str:
    output = charts.efficiency_output(m)
    if output is None:
        return ""
    spec = _facet_specs(m, lambda f: charts.efficiency_figure(m, output, f, summ))
    if spec is None:
        return ""
    data["charts"]["efficiency"] = spec
    return "".join([
        '<section id="efficiency"><h2>What it cost</h2>',
        f'<p class="note">Each configuration\'s <b>{e(output)}</b> against the CPU the lab\'s machine was busy with '
        "meanwhile (<b>cpu.util_pct</b>: cores × 100, the whole machine, as netperf measures it): the point is at "
        "the medians, the bars reach the quartiles. Up and to the left costs less CPU for what it delivers. The "
        "dotted lines through the origin are constant cost (netperf's service demand): the cheapest, the middle "
        "and the dearest configuration's. <code>cpu.us_per_kb</code> and <code>cpu.us_per_transaction</code> give "
        "the same as numbers.</p>",
        '<div class="grid">', _chart("efficiency", f"{output} against cpu.util_pct", ""), "</div></section>"])


def key_metric(m: ReportModel) -> str | None:
    """The metric the page leads with: the scenario's first ``repeat.key_metrics`` entry (with the run's
    overrides applied; of the first run that measured it), else the first of HEADLINE that was measured,
    else the first metric measured at all."""
    for r in m.runs:
        first = _declared_key_metric(r.record)
        if first in m.metrics:
            return first
    return next(iter(metrics_mod.in_order(HEADLINE, m.metrics, _workload_order(m))),
                m.metrics[0] if m.metrics else None)


def _workload_order(m: Any) -> list[str]:
    """The workloads in the order the report's first run declares them."""
    return workload_order(m.runs[0].record.get("scenario_text") or "") if m.runs else []


def _declared_key_metric(rec: dict[str, Any]) -> str | None:
    from vnetbench.scenario.load import ScenarioError, apply_override

    try:
        raw = tomllib.loads(rec.get("scenario_text") or "")
    except tomllib.TOMLDecodeError:
        return None
    for o in rec.get("overrides") or []:
        try:
            apply_override(raw, str(o), rec.get("scenario_source") or "scenario")
        except (ScenarioError, ValueError, TypeError):  # an override that no longer applies
            pass
    keys = (raw.get("repeat") or {}).get("key_metrics") if isinstance(raw.get("repeat"), dict) else None
    if isinstance(keys, list) and keys and isinstance(keys[0], str):
        return keys[0]
    return None


def _headline(m: ReportModel, data: dict[str, Any]) -> tuple[str, str]:
    """The first picture of the page: (table-of-contents label, section HTML), or ("", "").

    It reuses a chart the sections below already carry (same data key, so its
    data is not on the page twice): the key metric against the swept parameter
    when that chart exists, else the key metric's box plots per configuration.
    Call it after those sections were built."""
    metric = key_metric(m)
    if metric is None:
        return "", ""
    i = m.metrics.index(metric)
    sweep = m.layout.sweep
    if sweep is not None and f"sweep-{i}" in data["charts"]:
        cid = f"sweep-{i}"
        heading = f"{metric} against {sweep.name}"
        has_theory = any(isinstance(x.expected.get(metric), (int, float)) for x in m.entries)
        how = ("The line joins the medians per configuration, the band is their 95% confidence interval"
               + ("; dashed black is the theoretical value." if has_theory else
                  "; no theoretical value is known for this metric."))
        more = f'Every metric against {e(sweep.name)}: <a href="#sweep">Against {e(sweep.name)}</a>.'
    elif f"box-{i}" in data["charts"]:
        cid = f"box-{i}"
        heading = f"{metric} per configuration"
        how = "Box: median and quartiles; every trial is a dot."
        more = 'Every metric: <a href="#distributions">Distributions</a>.'
    else:
        return "", ""
    caption = f"{_metric_caption(m, metric)} {e(how)} {more}"
    html_ = (f'<section id="headline"><h2>Key metric: {e(heading)}</h2>'
             + _chart(cid, f"Headline chart: {heading}", caption, element_id="headline")
             + "</section>")
    return "Key metric", html_


def _cdfs(m: ReportModel, data: dict[str, Any], pooled: dict[str, dict[int, np.ndarray]]) -> str:
    """One CDF chart per latency instrument (ping's RTT, sockperf's request/response round trips)."""
    figures = []
    for kind, per_entry in pooled.items():
        what = model_mod.LATENCY_KINDS[kind][0]
        spec = _facet_specs(m, lambda f, per_entry=per_entry, what=what: charts.cdf_figure(m, f, per_entry, what))
        if spec is None:
            continue
        cid = "cdf" if kind == "rtt_ms" else f"cdf-{kind}"
        data["charts"][cid] = spec
        figures.append(_chart(cid, f"Cumulative distribution of the {what} per configuration"))
    if not figures:
        return ""
    return ('<section id="cdf"><h2>Latency distributions</h2>'
            '<p class="note">Cumulative distribution of each latency instrument per configuration, pooled over '
            "every sample of its successful trials (ping: every packet; sockperf: every message, or an evenly "
            "spaced 20,000 of them per trial). Darker lines are higher values of the swept parameter. The "
            "per-trial metrics and every comparison use one number per trial instead, since packets of one trial "
            "are not independent.</p>" + "".join(figures) + "</section>")


def _timeseries(m: ReportModel, data: dict[str, Any], sd: model_mod.SeriesData) -> str:
    if not any(t["series"] for t in sd.trials):
        return ""
    data["series"] = {
        "rows": sd.rows,
        "kinds": sd.kinds,
        "layout": charts.series_layout(sd.rows),
        "trials": sd.trials,
        "entries": [{"label": x.label_text, "facet": x.facet} for x in m.entries],
        "palette": model_mod.PALETTE,
    }
    note = (f"Series longer than {sd.cap} points were downsampled to {sd.cap} points per trial for this page "
            f"({sd.downsampled} series; the longest stored one has {sd.longest} points), keeping the minimum and "
            "maximum of each time bucket so spikes stay visible. Metrics and CDFs use every stored point."
            if sd.downsampled else "Every stored point is shown.")
    return ('<section id="timeseries"><h2>Time series per trial</h2>'
            '<p class="note">Per-second received throughput of each flow, RTT of every ping (and the TCP sender\'s '
            "smoothed RTT), congestion window where the sender reported it. Pick a trial:</p>"
            '<div class="ts-controls no-print">'
            '<label>Configuration <select id="ts-config"></select></label> '
            '<label>Trial <select id="ts-trial"></select></label> '
            '<button type="button" id="ts-prev" aria-label="previous trial">◀</button>'
            '<button type="button" id="ts-next" aria-label="next trial">▶</button></div>'
            '<p id="ts-status" class="note" aria-live="polite"></p>'
            + _chart("timeseries", "Time series of the selected trial")
            + f'<p class="note" id="downsample-note">{e(note)}</p></section>')


def _comparison(cmp: compare.ComparisonData | None) -> str:
    if cmp is None:
        return ""
    return (f'<section id="comparison"><h2>{e(cmp.title)}</h2>' + compare.table_html(cmp) + "</section>")


# ------------------------------------------------------------------ page


def render_report(store, run_ids: list[str], *, comparison: dict | list | None = None) -> str:
    """The report as one HTML string (see :func:`write_report`)."""
    run_ids = [store.resolve_run(r) for r in run_ids]
    m = model_mod.load(store, run_ids)
    summ = charts.summaries(m)
    sd = model_mod.collect_series(store, m)
    cmp = compare.build(m, comparison, store)
    data: dict[str, Any] = {
        "charts": {},
        "facets": [{"id": f.id, "title": f.title} for f in m.layout.facets],
    }
    sections = [
        ("glance", "At a glance", _glance(m, summ, cmp)),
        ("what-ran", "What ran", _what_ran(m)),
        ("comparison", "Comparison", _comparison(cmp)),
        ("distributions", "Distributions", _distributions(m, data)),
        ("sweep", f"Against {m.layout.sweep.name}" if m.layout.sweep else "", _sweep(m, data, summ)),
        ("efficiency", "What it cost", _efficiency(m, data, summ)),
        ("cdf", "Latency CDFs", _cdfs(m, data, sd.latency_pooled)),
        ("timeseries", "Time series", _timeseries(m, data, sd)),
    ]
    # The page opens with a picture: the headline chart (built from the charts above), then the tables.
    sections.insert(0, ("headline", *_headline(m, data)))
    sections = [s for s in sections if s[2]]
    names = list(dict.fromkeys(r.record["scenario_name"] for r in m.runs))
    title = f"vnetbench report: {', '.join(names)}"
    toc = "".join(f'<li><a href="#{sid}">{e(label)}</a></li>' for sid, label, _ in sections)
    facet_bar = ""
    if len(m.layout.facets) > 1:
        opts = "".join(f'<option value="{e(f.id)}">{e(f.title)}</option>' for f in m.layout.facets)
        facet_bar = (f'<div class="facet-bar" role="group" aria-label="View">'
                     f'<label>Showing <select id="facet">{opts}</select></label>'
                     f'<span class="note">{len(m.entries)} configurations are too many for one chart: the charts '
                     f"show one slice by {e(', '.join(a.name for a in m.layout.facet_axes))} at a time.</span>"
                     f'<span class="print-only" id="facet-print"></span></div>')
    bundle, plotly_block = _plotly_js()
    app_js = _asset("report.js")
    css = _asset("report.css")
    csp = ("default-src 'none'; "
           f"script-src {_csp_hash(bundle.js)} {_csp_hash(app_js)}; "
           "style-src 'unsafe-inline'; img-src data: blob:; font-src data:; connect-src 'none'; "
           "media-src 'none'; object-src 'none'; frame-src 'none'; worker-src 'none'; base-uri 'none'; "
           "form-action 'none'")
    runs_text = ", ".join(f"{r.short}" for r in m.runs)
    generated = utc_text(time.time(), seconds=False)
    return "".join([
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
        f'<meta http-equiv="Content-Security-Policy" content="{e(csp)}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<meta name="generator" content="vnetbench">',
        f"<title>{e(title)}</title><style>{css}</style></head><body>",
        '<header class="page"><h1>', e(title), "</h1>",
        f'<p class="meta">Run{"s" if len(m.runs) > 1 else ""} <code>{e(runs_text)}</code> · generated {e(generated)}'
        f" by vnetbench {e(vnetbench.__version__)} · charts: plotly.js {e(bundle.version)} ({e(bundle.kind)} bundle),"
        " embedded (works offline)</p>",
        f'<nav class="toc" aria-label="Contents"><ol>{toc}</ol></nav></header>',
        facet_bar,
        '<main>', "".join(s[2] for s in sections), "</main>",
        '<footer class="page"><p>Every script and style of this page is inside this file; it makes no network '
        "request. Values are per trial (one number per trial and metric); medians with exact 95% confidence "
        "intervals; comparisons by Mann-Whitney U with Holm adjustment and bootstrap intervals of the relative "
        f'change.</p><p class="{"note" if bundle.kind == "cartesian" else "note warn"}">Charts: {e(bundle.note)}.'
        "</p></footer>",
        # Packed: the chart data is most of a large report and compresses to about half (see html_payload).
        f'<script type="application/json" id="vnb-data">{json_for_script(payload.pack(json_for_script(data)))}'
        "</script>",
        f'<script type="application/json" id="vnb-plotly">{plotly_block}</script>',
        f"<script>{app_js}</script>",
        "</body></html>\n",
    ])


def write_report(store, run_ids: list[str], path: str | Path, *, comparison: dict | None = None) -> Path:
    """Write the HTML report of ``run_ids`` to ``path`` and return the path.

    ``store`` is a :class:`vnetbench.store.db.Store`; run ids may be prefixes or
    ``last``. With several runs the first is the reference of the comparison.
    ``comparison`` is a comparison computed elsewhere, as JSON-ready data (see
    :func:`vnetbench.report.html_compare.from_given` for the accepted shapes);
    when it is None and several runs are given, run_ids[0] is compared with
    each other run configuration by configuration; for one run whose labels
    carry a reference value (``env=bare``), the other values are compared with it.
    The store's own database is never overwritten (:mod:`vnetbench.output`).
    """
    check_target(path, store.path, what="report")
    text = render_report(store, list(run_ids), comparison=comparison)
    return write_text(path, text, store.path, what="report")
